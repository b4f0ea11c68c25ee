/*
 * Stand-alone timing of the SwiGLU + quantisation kernels (csrc/cuda/quant/swiglu_quantize_tile.cuh)
 * in their compile-time variants, against the plain rowcol quantiser of the same output and a copy,
 * on the layer shapes' h [R, 2I] and d_act [R, I] (random bf16). Every variant's codes and scales are
 * compared byte for byte with the first variant's (they must agree: the same arithmetic).
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o /tmp/sqt benchmarks/swiglu_quant_timing.cu
 *   /tmp/sqt [R I]...          # default: Qwen3 (131072 768), Mixtral (16384 14336), DeepSeek-V3 (65536 2048)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cuda_runtime.h>

#include "timing_util.cuh"
#include "quant/swiglu_quantize_tile.cuh"

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
        const double copy_ms = time_ms([&] { copy_kernel<<<132 * 8, 256>>>((const uint4*)h, (uint4*)y, R * 2 * I * 2 / 16); });
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
            const double rowcol_ms = time_ms([&] {
                quantize_rowcol_bf16_kernel<128, false><<<(unsigned)tile_count(R, N), kThreads>>>(tp);
            });
            const double bytes = (backward ? 6.0 : 4.0) * R * I + 2.0 * R * N + 8.0 * R * N / 128;
            printf("  %s: rowcol of a bf16 [R, %lld] alone %.3f ms\n", backward ? "bwd" : "fwd", (long long)N, rowcol_ms);
            std::vector<uint8_t> ref_q, ref_qt;
            struct V {
                const char* name;
                void (*k)(const tile_args, const swiglu_tile_args);
            };
            std::vector<V> vs;
            if (!backward) {
                vs = {{"fwd min2", swiglu_quantize_bf16_kernel<false, true, true, 2>},
                      {"fwd min3", swiglu_quantize_bf16_kernel<false, true, true, 3>},
                      {"fwd min1", swiglu_quantize_bf16_kernel<false, true, true, 1>}};
            } else {
                vs = {{"bwd min2", swiglu_quantize_bf16_kernel<true, true, true, 2>},
                      {"bwd min3", swiglu_quantize_bf16_kernel<true, true, true, 3>},
                      {"bwd min1", swiglu_quantize_bf16_kernel<true, true, true, 1>}};
            }
            for (const V& v : vs) {
                CHECK(cudaMemset(o.q, 0, R * N));
                CHECK(cudaMemset(o.qt, 0, R * N));
                const double ms = time_ms([&] { v.k<<<tiles, kThreads>>>(t, sw); });
                std::vector<uint8_t> q = host_bytes(o.q, R * N), qt = host_bytes(o.qt, R * N);
                const char* same = "ref";
                if (ref_q.empty()) {
                    ref_q = q;
                    ref_qt = qt;
                } else {
                    same = (q == ref_q && qt == ref_qt) ? "same" : "DIFFERENT";
                }
                printf("    %-16s %.3f ms  %.2f TB/s  %.2f of copy  codes %s\n", v.name, ms, bytes / ms / 1e9,
                       bytes / ms / 1e9 / copy_tbps, same);
            }
        }
        cudaFree(h), cudaFree(da), cudaFree(y), cudaFree(o.q), cudaFree(o.qt), cudaFree(o.s), cudaFree(o.st);
    }
    return 0;
}
