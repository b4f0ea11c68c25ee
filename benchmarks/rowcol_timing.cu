/*
 * Stand-alone timing of the rowcol FP8 quantiser (csrc/cuda/quant/quantize_bf16_tile.cuh) and of
 * variants that place its time: the tile's row half alone, its column half alone, the loads and
 * maxima alone (nothing stored), and the default work with the tiles walked in bands of 8 tile rows
 * (concurrent CTAs then write 1 KiB runs of each qt row instead of 128 bytes), and the experimental strip
 * kernel (one CTA per 4 or 8 tiles down M, column scales written as whole sectors; v43), and the kernel on
 * rows gathered by a plan of top_k 8, unweighted and weighted (the layer's x_rows and d_rows; v45, v46). Random bf16 x on issue
 * 5's quantiser shapes; each variant against a copy of x (same bytes read and written). The band and
 * strip variants' codes and scales are compared byte for byte with the default kernel's. (v42's L2-prefetch variants, dropped:
 * docs/experiments/v42_rowcol_l2_prefetch.patch.) The experimental streamed kernel (rowcol_stream.cuh, after
 * v54: persistent, loads one tile ahead by cp.async) at one and two CTAs an SM, plain and gathered, each
 * compared with its per-tile twin; the gathered rows walk in bands of one tile column (the library's, v51).
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -Ibenchmarks -o /tmp/rct benchmarks/rowcol_timing.cu
 *   /tmp/rct [M N]...        # default: DeepSeek-V3's activation, Qwen3's, the Mixtral weight
 */
#include <stdio.h>
#include <stdlib.h>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "timing_util.cuh"
#include "quant/quantize_bf16_tile.cuh"
#include "quant/rowcol_stream.cuh"

using namespace mok_qtile;

/* The tile of this CTA: row-major over the tiles (kBand 1, as the library's kernels), or in bands of
 * kBand tile rows walked column by column. */
template <int kBand>
__device__ __forceinline__ tile_thread banded_tile(const tile_args& a) {
    if (kBand == 1) return tile_thread_of(a);
    const int nbm = (int)((a.M + kTile - 1) / kTile), per_band = kBand * a.nbn, b = (int)blockIdx.x;
    const int band = b / per_band, in = b - band * per_band;
    const int rows = nbm - band * kBand < kBand ? nbm - band * kBand : kBand;
    return tile_thread_at(a, band * kBand + in % rows, in / rows);
}

template <int B, bool kMx, bool kRows, bool kCols, int kBand>
__global__ void __launch_bounds__(kThreads) rowcol_variant_kernel(const tile_args a) {
    __shared__ rowcol_smem<B> s;
    const tile_thread t = banded_tile<kBand>(a);
    uint32_t w[8][4];
    load_block(a, t, w);
    quantize_tile_block<B, kMx, kRows, kCols>(a, t, w, s);
}

/* The loads and the block maxima only; one word stored in the (never taken) case that a maximum
 * has every bit set, so that nothing is optimised away. */
__global__ void __launch_bounds__(kThreads) load_only_kernel(const tile_args a) {
    const tile_thread t = tile_thread_of(a);
    uint32_t w[8][4], rm[4], cm[4];
    load_block(a, t, w);
    block_maxima(w, rm, cm);
    if ((rm[0] & rm[1] & rm[2] & rm[3] & cm[0] & cm[1] & cm[2] & cm[3]) == 0xFFFFFFFFu) a.q[threadIdx.x] = 1;
}

int main(int argc, char** argv) {
    const std::vector<int64_t> probs = problems_from_args(argc, argv, {65536, 7168, 131072, 2048, 28672, 4096});
    for (size_t pi = 0; pi < probs.size(); pi += 2) {
        const int64_t M = probs[pi], N = probs[pi + 1];
        __nv_bfloat16 *x, *y;
        uint8_t *q, *qt;
        float *sc, *st;
        CHECK(cudaMalloc(&x, M * N * 2));
        CHECK(cudaMalloc(&y, M * N * 2));
        CHECK(cudaMalloc(&q, M * N));
        CHECK(cudaMalloc(&qt, M * N));
        CHECK(cudaMalloc(&sc, M * ((N + 31) / 32) * 4));
        CHECK(cudaMalloc(&st, N * ((M + 31) / 32) * 4));
        fill_kernel<<<1024, 256>>>((uint16_t*)x, M * N, 1234u);
        const tile_args t = tile_args_of(x, M, N, q, sc, qt, st);
        const unsigned tiles = (unsigned)tile_count(M, N);
        const double copy_ms = time_ms([&] { copy_kernel<<<132 * 8, 256>>>((const uint4*)x, (uint4*)y, M * N * 2 / 16); });
        const double copy_tbps = 4.0 * M * N / copy_ms / 1e9;
        printf("M=%lld N=%lld: copy %.3f ms (%.2f TB/s)\n", (long long)M, (long long)N, copy_ms, copy_tbps);
        struct V {
            const char* name;
            void (*k)(const tile_args);
            double bytes_per_elt; /* read + written, scales left out */
            int compare;          /* 1: codes and scales against the first 1x128 row; 2: against the first MXFP8 row;
                                   * 3, 4: against the first gathered / weighted gathered 1x128 row */
            int strip;            /* > 0: a quantize_rowcol_strip_bf16_kernel launch (v43) */
            int gather;           /* 1: rows gathered by a plan of top_k 8 (v45), 2: and weighted (v46) */
            int stream;           /* > 0: quantize_rowcol_stream_kernel (rowcol_stream.cuh) at this many CTAs an SM */
        };
        const std::vector<V> vs = {
            {"rowcol 1x128", rowcol_variant_kernel<128, false, true, true, 1>, 4.0, 1, 0},
            {"rowcol 1x128 strip4", quantize_rowcol_strip_bf16_kernel<128, false, 4>, 4.0, 1, 4},
            {"rowcol 1x128 strip8", quantize_rowcol_strip_bf16_kernel<128, false, 8>, 4.0, 1, 8},
            {"rowcol 1x128 strip8 2cta", quantize_rowcol_strip_bf16_kernel<128, false, 8, 2>, 4.0, 1, 8},
            {"rowcol 1x128 strip1", quantize_rowcol_strip_bf16_kernel<128, false, 1>, 4.0, 1, 1},
            {"rowcol 1x128 band8", rowcol_variant_kernel<128, false, true, true, 8>, 4.0, 1, 0},
            {"rows half 1x128", rowcol_variant_kernel<128, false, true, false, 1>, 3.0, 0, 0},
            {"cols half 1x128", rowcol_variant_kernel<128, false, false, true, 1>, 3.0, 0, 0},
            {"loads + maxima", load_only_kernel, 2.0, 0, 0},
            {"rowcol mxfp8", rowcol_variant_kernel<32, true, true, true, 1>, 4.0, 2, 0},
            {"rowcol mxfp8 strip4", quantize_rowcol_strip_bf16_kernel<32, true, 4>, 4.0, 2, 4},
            {"rowcol mxfp8 strip8", quantize_rowcol_strip_bf16_kernel<32, true, 8>, 4.0, 2, 8},
            {"rowcol 1x128 gathered", quantize_rowcol_bf16_kernel<128, false, true>, 4.0, 3, 0, 1},
            {"rowcol 1x128 gathered w", quantize_rowcol_bf16_kernel<128, false, true>, 4.0, 4, 0, 2},
            {"stream 1x128 2cta", quantize_rowcol_stream_kernel<false, 2>, 4.0, 1, 0, 0, 2},
            {"stream 1x128 1cta", quantize_rowcol_stream_kernel<false, 1>, 4.0, 1, 0, 0, 1},
            {"stream gathered 2cta", quantize_rowcol_stream_kernel<true, 2>, 4.0, 3, 0, 1, 2},
            {"stream gathered w 2cta", quantize_rowcol_stream_kernel<true, 2>, 4.0, 4, 0, 2, 2},
            {"stream gathered w 1cta", quantize_rowcol_stream_kernel<true, 1>, 4.0, 4, 0, 2, 1},
            {"rowcol 1x128 (again)", rowcol_variant_kernel<128, false, true, true, 1>, 4.0, 0, 0},
        };
        /* the layer's gathers (v45, v46): x_rows / d_rows [M, N] of a plan with top_k 8 over the first
         * M / 8 rows of x, each token's 8 rows at random places (a random permutation of t * 8 + k), and
         * routing weights in [0.25, 1) */
        const int kTopK = 8;
        std::vector<int32_t> h_src((size_t)M);
        std::vector<float> h_w((size_t)M);
        for (int64_t r = 0; r < M; ++r) h_src[(size_t)r] = (int32_t)r, h_w[(size_t)r] = 0.25f + 0.75f * (float)(r % 997) / 997.f;
        uint64_t rng = 88172645463325252ull;
        for (int64_t r = M - 1; r > 0; --r) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            std::swap(h_src[(size_t)r], h_src[(size_t)(rng % (uint64_t)(r + 1))]);
        }
        int32_t* src;
        float* wts;
        CHECK(cudaMalloc(&src, M * 4));
        CHECK(cudaMalloc(&wts, M * 4));
        CHECK(cudaMemcpy(src, h_src.data(), M * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(wts, h_w.data(), M * 4, cudaMemcpyHostToDevice));
        tile_args tg = t;
        tg.gather.src = src;
        tg.gather.src_limit = M;
        tg.gather.top_k = kTopK;
        tg.col_band = 1; /* the library's gathered walk (v51) */
        const int64_t sbytes = M * ((N + 31) / 32) * 4, stbytes = N * ((M + 31) / 32) * 4;
        std::vector<uint8_t> ref[5][4]; /* per compare group: q, qt, scales, scales_t */
        int sms = 0;
        CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        for (const V& v : vs) {
            const unsigned grid = v.stream ? (unsigned)rowcol_stream_grid(M, N, v.stream, sms)
                                  : v.strip ? (unsigned)strip_count(M, N, v.strip) : tiles;
            const size_t smem = v.stream ? rowcol_stream_smem_bytes() : 0;
            /* the streamed kernels' slots and static scratch pass 48 KiB: opted in */
            if (smem) CHECK(cudaFuncSetAttribute(v.k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            if (v.compare) {
                CHECK(cudaMemset(sc, 0xA5, sbytes));
                CHECK(cudaMemset(st, 0xA5, stbytes));
            }
            tile_args a = v.gather ? tg : t;
            a.gather.w = v.gather == 2 ? wts : nullptr;
            const double ms = time_ms([&] { v.k<<<grid, kThreads, smem>>>(a); });
            const char* same = "";
            if (v.compare) {
                std::vector<uint8_t> got[4] = {host_bytes(q, M * N), host_bytes(qt, M * N), host_bytes(sc, sbytes),
                                               host_bytes(st, stbytes)};
                std::vector<uint8_t>* want = ref[v.compare];
                if (want[0].empty()) {
                    for (int i = 0; i < 4; ++i) want[i] = got[i];
                    same = "  codes, scales: ref";
                } else {
                    bool eq = true;
                    for (int i = 0; i < 4; ++i) eq = eq && got[i] == want[i];
                    same = eq ? "  codes, scales: same" : "  codes, scales: DIFFERENT";
                }
            }
            const double tbps = v.bytes_per_elt * M * N / ms / 1e9;
            printf("  %-22s %.3f ms  %.2f TB/s  %.2f of copy%s\n", v.name, ms, tbps, tbps / copy_tbps, same);
        }
        cudaFree(x), cudaFree(y), cudaFree(q), cudaFree(qt), cudaFree(sc), cudaFree(st), cudaFree(src), cudaFree(wts);
    }
    return 0;
}
