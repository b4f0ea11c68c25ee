/*
 * Stand-alone timing of the SwiGLU + quantisation kernels (csrc/cuda/quant/swiglu_quantize_tile.cuh)
 * in their compile-time variants, against the plain rowcol quantiser of the same output and a copy,
 * on the layer shapes' h [R, 2I] and d_act [R, I] (random bf16). Every variant's codes and scales are
 * compared byte for byte with the first variant's (they must agree: the same arithmetic). The streamed
 * forward (swiglu_quantize_stream.cuh, v54) runs with its loads 1 or 2 items ahead, at 1 or 2 CTAs per SM,
 * and in its row-scaled form (v53) against the per-tile one; "bwd split" is the backward streamed per output
 * tile, its loads 4-8 rows ahead (v55; the library's at 4 rows), and its row-scaled form (v56, with the
 * router-weight partial sums) against the per-tile one.
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o /tmp/sqt benchmarks/swiglu_quant_timing.cu
 *   /tmp/sqt [R I]...          # default: Qwen3 (131072 768), Mixtral (16384 14336), DeepSeek-V3 (65536 2048)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include "timing_util.cuh"
#include "quant/swiglu_quantize_stream.cuh"

using namespace mok_qtile;

struct Out {
    uint8_t *q, *qt;
    float *s, *st;
};

int main(int argc, char** argv) {
    const std::vector<int64_t> probs = problems_from_args(argc, argv, {131072, 768, 16384, 14336, 65536, 2048});
    for (size_t pi = 0; pi < probs.size(); pi += 2) {
        const int64_t R = probs[pi], I = probs[pi + 1];
        __nv_bfloat16 *h, *da, *y;
        CHECK(cudaMalloc(&h, R * 2 * I * 2));
        CHECK(cudaMalloc(&da, R * I * 2));
        CHECK(cudaMalloc(&y, R * 2 * I * 2));
        fill_kernel<<<1024, 256>>>((uint16_t*)h, R * 2 * I, 1234u);
        fill_kernel<<<1024, 256>>>((uint16_t*)da, R * I, 777u);
        fill_kernel<<<1024, 256>>>((uint16_t*)y, R * 2 * I, 99u);
        Out o;
        CHECK(cudaMalloc(&o.q, R * 2 * I));
        CHECK(cudaMalloc(&o.qt, R * 2 * I));
        CHECK(cudaMalloc(&o.s, R * 2 * I / 128 * 4));
        CHECK(cudaMalloc(&o.st, 2 * I * ((R + 127) / 128) * 4));
        float *row_scale, *d_s_part;
        CHECK(cudaMalloc(&row_scale, R * 4));
        CHECK(cudaMalloc(&d_s_part, I / 128 * R * 4));
        {
            std::vector<float> rs(R);
            for (int64_t r = 0; r < R; ++r) rs[r] = 0.05f + (float)((r * 2654435761u) % 1000u) / 1000.f;
            CHECK(cudaMemcpy(row_scale, rs.data(), R * 4, cudaMemcpyHostToDevice));
        }
        int sms = 0;
        CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        const double copy_ms = getenv("MOK_SQT_ONCE") ? 1.0 : time_ms([&] { copy_kernel<<<132 * 8, 256>>>((const uint4*)h, (uint4*)y, R * 2 * I * 2 / 16); });
        const double copy_tbps = 2.0 * R * 2 * I * 2 / copy_ms / 1e9;
        printf("R=%lld I=%lld: copy of h %.3f ms (%.2f TB/s)\n", (long long)R, (long long)I, copy_ms, copy_tbps);
        for (int backward = 0; backward < 2; ++backward) {
            const int64_t N = backward ? 2 * I : I;
            const tile_args t = tile_args_of(NULL, R, N, o.q, o.s, o.qt, o.st);
            swiglu_tile_args sw;
            sw.h = h;
            sw.d_act = backward ? da : NULL;
            sw.out = NULL;
            sw.I = I;
            const unsigned tiles = (unsigned)tile_count(R, N); /* of the output */
            /* the plain rowcol of a bf16 tensor of the output's shape: the second of the two ops */
            const tile_args tp = tile_args_of(y, R, N, o.q, o.s, o.qt, o.st);
            const double rowcol_ms = getenv("MOK_SQT_ONCE") ? 0.0 : time_ms([&] {
                quantize_rowcol_bf16_kernel<128, false><<<(unsigned)tile_count(R, N), kThreads>>>(tp);
            });
            const double bytes = (backward ? 6.0 : 4.0) * R * I + 2.0 * R * N + 8.0 * R * N / 128;
            printf("  %s: rowcol of a bf16 [R, %lld] alone %.3f ms\n", backward ? "bwd" : "fwd", (long long)N, rowcol_ms);
            const unsigned items = (unsigned)tile_count(R, I); /* the streamed kernels' work items */
            struct V {
                const char* name;
                bool scaled;
                std::function<void(const swiglu_tile_args&)> run;
            };
            /* a persistent kernel over n items: dynamic shared memory set once, grid = resident CTAs (or fewer) */
            const auto persistent = [&](auto kernel, size_t smem, unsigned n) {
                CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                int per_sm = 0;
                CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
                const unsigned grid = std::min<unsigned>(n, (unsigned)(per_sm * sms));
                return [=](const swiglu_tile_args& a2) { kernel<<<grid, kThreads, smem>>>(t, a2); };
            };
            /* the streamed forward: items are act's tiles, loads `ahead` items ahead */
            const auto stream = [&](auto kernel, int ahead) { return persistent(kernel, stream_smem_bytes(ahead), items); };
            /* the backward streamed per output tile (v55): items are d_h's tiles, loads `depth` rows ahead */
            const auto split = [&](auto kernel, int depth, bool scaled) {
                return persistent(kernel, split_stream_smem_bytes(depth, scaled), tiles);
            };
            const auto tiled = [&](auto kernel) { return [=](const swiglu_tile_args& a2) { kernel<<<tiles, kThreads>>>(t, a2); }; };
            std::vector<V> vs;
            if (!backward) {
                vs = {{"fwd min2", false, tiled(swiglu_quantize_bf16_kernel<false, true, true, 2>)},
                      {"fwd ahead1 2cta", false, stream(swiglu_quantize_stream_kernel<true, true, false, 1, 2>, 1)},
                      {"fwd ahead1 1cta", false, stream(swiglu_quantize_stream_kernel<true, true, false, 1, 1>, 1)},
                      {"fwd ahead2 1cta", false, stream(swiglu_quantize_stream_kernel<true, true, false, 2, 1>, 2)},
                      {"fwd scaled min2", true, tiled(swiglu_quantize_bf16_kernel<false, true, true, 2, true>)},
                      {"fwd scaled a1 2c", true, stream(swiglu_quantize_stream_kernel<true, true, true, 1, 2>, 1)},
                      {"fwd scaled a1 1c", true, stream(swiglu_quantize_stream_kernel<true, true, true, 1, 1>, 1)}};
            } else {
                vs = {{"bwd min2", false, tiled(swiglu_quantize_bf16_kernel<true, true, true, 2>)},
                      {"bwd split d6 2cta", false, split(swiglu_backward_split_stream_kernel<true, true, 2, 6>, 6, false)},
                      {"bwd split d4 2cta", false, split(swiglu_backward_split_stream_kernel<true, true, 2, 4>, 4, false)},
                      {"bwd split d8 1cta", false, split(swiglu_backward_split_stream_kernel<true, true, 1, 8>, 8, false)},
                      {"bwd scaled min2", true, tiled(swiglu_quantize_bf16_kernel<true, true, true, 2, true>)},
                      {"bwd scaled split4", true,
                       split(swiglu_backward_split_stream_kernel<true, true, 2, 4, true>, 4, true)}};
            }
            std::vector<uint8_t> ref[2][5];
            for (const V& v : vs) {
                swiglu_tile_args a2 = sw;
                a2.row_scale = v.scaled ? row_scale : NULL;
                a2.d_s_part = v.scaled ? d_s_part : NULL;
                a2.R = R;
                CHECK(cudaMemset(o.q, 0, R * N));
                CHECK(cudaMemset(o.qt, 0, R * N));
                CHECK(cudaMemset(o.s, 0, R * N / 128 * 4));
                CHECK(cudaMemset(o.st, 0, N * ((R + 127) / 128) * 4));
                CHECK(cudaMemset(d_s_part, 0, I / 128 * R * 4));
                double ms = 0.0; /* MOK_SQT_ONCE: one launch each, for a profiler */
                if (getenv("MOK_SQT_ONCE")) {
                    v.run(a2);
                    CHECK(cudaDeviceSynchronize());
                } else {
                    ms = time_ms([&] { v.run(a2); });
                }
                std::vector<uint8_t> got[5] = {host_bytes(o.q, R * N), host_bytes(o.qt, R * N),
                                               host_bytes(o.s, R * N / 128 * 4),
                                               host_bytes(o.st, N * ((R + 127) / 128) * 4),
                                               host_bytes(d_s_part, I / 128 * R * 4)};
                const char* same = "ref";
                std::vector<uint8_t>(&r)[5] = ref[v.scaled];
                if (r[0].empty()) {
                    for (int i = 0; i < 5; ++i) r[i] = got[i];
                } else {
                    bool eq = true;
                    for (int i = 0; i < 5; ++i) eq = eq && got[i] == r[i];
                    same = eq ? "same" : "DIFFERENT";
                }
                printf("    %-16s %.3f ms  %.2f TB/s  %.2f of copy  outputs %s\n", v.name, ms, bytes / ms / 1e9,
                       bytes / ms / 1e9 / copy_tbps, same);
            }
        }
        cudaFree(h), cudaFree(da), cudaFree(y), cudaFree(o.q), cudaFree(o.qt), cudaFree(o.s), cudaFree(o.st), cudaFree(row_scale), cudaFree(d_s_part);
    }
    return 0;
}
