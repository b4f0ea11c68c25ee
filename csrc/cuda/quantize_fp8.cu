/*
 * FP8 E4M3 block quantisation and dequantisation of [M, N] tensors (mok_quantize_* /
 * mok_dequantize_* in mok_core.h), bit-exact with the C core:
 *   1xB, fp32 scales (blockwise_1x128)  one scale per row and B columns, amax / 448 (0 -> 1)
 *   BxB, fp32 scales (blockwise_128x128) one scale per B x B tile
 *   1xB, E8M0 scales (mxfp8, B = 32)     RCEIL power of two; codes e4m3(x * 2^-e)
 * A block holding NaN or Inf gets the NaN scale and every code 0x7F. Partial blocks cover the
 * elements that exist.
 *
 * bf16 (the data path's dtype) runs the tile kernels of quant/quantize_bf16_tile.cuh, written to
 * reach the memory's speed; they also make the row-wise and column-wise copies in one pass
 * (mok_quantize_fp8_rowcol_cuda). The other dtypes keep the simple kernels below:
 * 1xB: B / 8 threads per block, 8 consecutive columns each, amax by shuffles inside the group (max
 * is exact in any order). BxB: one CTA per tile, 64 values per thread held in registers between
 * the amax and the encoding.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mok_cuda.h"
#include "common/dtype.cuh"
#include "common/fp8.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "quant/quantize_bf16_tile.cuh"
#include "quant/rowcol_stream.cuh"

namespace {

enum { Q_THREADS = 256, Q_BLOCKS_PER_SM = 8, Q_TILE = 128 };

/* Values [c, c + 8) of a row as floats (the C core's mok_load_f: doubles round to float);
 * columns at or past n_valid read as 0, which leaves an amax unchanged. */
template <typename T>
__device__ __forceinline__ void load8(const T* row, int64_t c, int64_t n_valid, bool vec_ok, float (&v)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = c + i < n_valid ? (float)mok_to_acc(row[c + i]) : 0.f;
    (void)vec_ok;
}
/* Codes [c, c + 8) of a row: one 8-byte store when aligned and in range. */
__device__ __forceinline__ void store8(uint8_t* row, int64_t c, int64_t n_valid, bool vec_ok, const uint8_t (&b)[8]) {
    if (vec_ok && c + 8 <= n_valid) {
        uint2 w;
        w.x = b[0] | (b[1] << 8) | (b[2] << 16) | ((uint32_t)b[3] << 24);
        w.y = b[4] | (b[5] << 8) | (b[6] << 16) | ((uint32_t)b[7] << 24);
        *reinterpret_cast<uint2*>(row + c) = w;
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (c + i < n_valid) row[c + i] = b[i];
}

__device__ __forceinline__ void amax8(const float (&v)[8], float& amax, bool& bad) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = fabsf(v[i]);
        if (!isfinite(a)) bad = true;
        else amax = fmaxf(amax, a);
    }
}

/* Encoding of a block's values with a float scale (blockwise) or an E8M0 code (mx). */
template <bool kMx>
__device__ __forceinline__ void encode8(const float (&v)[8], bool bad, float scale, int e, uint8_t (&b)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
        b[i] = bad ? (uint8_t)0x7F : mok_dev_e4m3_from_f32(kMx ? ldexpf(v[i], -e) : __fdiv_rn(v[i], scale));
}

/* ---- 1xB: groups of B / 8 lanes, a warp-uniform loop so that every shuffle has all 32 lanes ---- */
template <typename T, int B, bool kMx>
__global__ void __launch_bounds__(Q_THREADS) quantize_1xb_kernel(const T* __restrict__ x, int64_t M, int64_t N,
                                                                 uint8_t* __restrict__ q, void* __restrict__ scales) {
    enum { TPU = B / 8, UPW = 32 / TPU };
    static_assert(B % 8 == 0 && 32 % TPU == 0, "a block is whole 8-column pieces of one warp");
    const int lane = threadIdx.x & 31, sub = lane % TPU;
    const int64_t nb = (N + B - 1) / B, units = M * nb;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t num_warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const bool vec_ok = N % 8 == 0 && mok_aligned16(x) && ((uintptr_t)q & 7) == 0;
    for (int64_t base = warp * UPW; base < units; base += num_warps * UPW) {
        const int64_t u = base + lane / TPU;
        const bool active = u < units;
        const int64_t m = active ? u / nb : 0, j = active ? u % nb : 0;
        const int64_t c = j * B + sub * 8;
        float v[8];
        load8<T>(x + m * N, c, active ? N : 0, vec_ok, v);
        float amax = 0.f;
        bool bad = false;
        amax8(v, amax, bad);
#pragma unroll
        for (int off = TPU / 2; off > 0; off /= 2) {
            amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
            bad = __shfl_xor_sync(0xFFFFFFFFu, (int)bad, off) != 0 || bad;
        }
        if (!active) continue;
        uint8_t b[8];
        if (kMx) {
            const uint8_t code = bad ? (uint8_t)0xFF : mok_dev_e8m0_rceil(amax);
            encode8<true>(v, code == 0xFF, 0.f, (int)code - 127, b);
            if (sub == 0) static_cast<uint8_t*>(scales)[u] = code;
        } else {
            const float scale = amax == 0.f ? 1.f : __fdiv_rn(amax, 448.f);
            encode8<false>(v, bad, scale, 0, b);
            if (sub == 0) static_cast<float*>(scales)[u] = bad ? __int_as_float(0x7FC00000) : scale;
        }
        store8(q + m * N, c, N, vec_ok, b);
    }
}

/* ---- BxB (B = 128): one CTA per tile; thread t holds rows t / 16 + 16 i, columns 8 (t % 16) + [0, 8) ---- */
template <typename T>
__global__ void __launch_bounds__(Q_THREADS) quantize_tile_kernel(const T* __restrict__ x, int64_t M, int64_t N,
                                                                  uint8_t* __restrict__ q, float* __restrict__ scales) {
    enum { ROWS = Q_TILE / (Q_THREADS / 16) };
    static_assert(Q_THREADS == 256 && ROWS == 8, "256 threads cover a 128 x 128 tile as 16 x 16 pieces of 8 x 8");
    __shared__ float s_amax[Q_THREADS / 32];
    __shared__ int s_bad[Q_THREADS / 32];
    const int t = threadIdx.x, lane = t & 31, wid = t >> 5;
    const int64_t mb = (M + Q_TILE - 1) / Q_TILE, nb = (N + Q_TILE - 1) / Q_TILE;
    const bool vec_ok = N % 8 == 0 && mok_aligned16(x) && ((uintptr_t)q & 7) == 0;
    for (int64_t tile = blockIdx.x; tile < mb * nb; tile += gridDim.x) {
        const int64_t r0 = (tile / nb) * Q_TILE, c = (tile % nb) * Q_TILE + (t % 16) * 8;
        const int64_t c_end = (tile % nb) * Q_TILE + Q_TILE < N ? (tile % nb) * Q_TILE + Q_TILE : N;
        float v[ROWS][8];
        float amax = 0.f;
        bool bad = false;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int64_t r = r0 + t / 16 + 16 * i;
            load8<T>(x + (r < M ? r : 0) * N, c, r < M ? c_end : 0, vec_ok, v[i]);
            amax8(v[i], amax, bad);
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
            bad = __shfl_xor_sync(0xFFFFFFFFu, (int)bad, off) != 0 || bad;
        }
        if (lane == 0) {
            s_amax[wid] = amax;
            s_bad[wid] = bad;
        }
        __syncthreads();
        amax = 0.f;
        bad = false;
#pragma unroll
        for (int w = 0; w < Q_THREADS / 32; ++w) {
            amax = fmaxf(amax, s_amax[w]);
            bad = bad || s_bad[w] != 0;
        }
        __syncthreads(); /* s_amax is rewritten by the next tile */
        const float scale = amax == 0.f ? 1.f : __fdiv_rn(amax, 448.f);
        if (t == 0) scales[tile] = bad ? __int_as_float(0x7FC00000) : scale;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int64_t r = r0 + t / 16 + 16 * i;
            if (r >= M) continue;
            uint8_t b[8];
            encode8<false>(v[i], bad, scale, 0, b);
            store8(q + r * N, c, c_end, vec_ok, b);
        }
    }
}

/* ---- dequantisation: one element per thread, grid-stride ---- */
template <bool kMx>
__global__ void __launch_bounds__(Q_THREADS) dequantize_kernel(const uint8_t* __restrict__ q,
                                                               const void* __restrict__ scales, int64_t M, int64_t N,
                                                               int64_t brow, int64_t bcol, float* __restrict__ y) {
    const int64_t nb = (N + bcol - 1) / bcol, n = M * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, c = i % N, s = (m / brow) * nb + c / bcol;
        const float scale = kMx ? mok_dev_e8m0_to_f32(static_cast<const uint8_t*>(scales)[s])
                                : static_cast<const float*>(scales)[s];
        y[i] = mok_dev_e4m3_to_f32(q[i]) * scale;
    }
}

/* bf16: one CTA per 128 x 128 tile (quant/quantize_bf16_tile.cuh). */
int quantize_bf16_launch(const struct mok_quantize_fp8_args* a, cudaStream_t stream) {
    using namespace mok_qtile;
    const int64_t tiles = tile_count(a->M, a->N);
    MOK_CHECK_ARG(tiles <= MOK_INT32_LIMIT);
    const tile_args t = tile_args_of(static_cast<const __nv_bfloat16*>(a->x), a->M, a->N, a->q, a->scales, 0, 0);
    const unsigned grid = (unsigned)tiles;
    switch (a->recipe) {
        case MOK_FP8_BLOCKWISE_128X128: quantize_tile128_bf16_kernel<<<grid, kThreads, 0, stream>>>(t); break;
        case MOK_FP8_MXFP8: quantize_rows_bf16_kernel<32, true><<<grid, kThreads, 0, stream>>>(t); break;
        default: quantize_rows_bf16_kernel<128, false><<<grid, kThreads, 0, stream>>>(t); break;
    }
    return mok_launch_status();
}

template <typename T>
int quantize_launch(const struct mok_quantize_fp8_args* a, cudaStream_t stream) {
    const T* x = static_cast<const T*>(a->x);
    if (a->recipe == MOK_FP8_BLOCKWISE_128X128) {
        const int64_t tiles = mok_ceil_div(a->M, Q_TILE) * mok_ceil_div(a->N, Q_TILE);
        const unsigned grid = mok_grid_stride_blocks(tiles, 1, Q_BLOCKS_PER_SM);
        quantize_tile_kernel<T><<<grid, Q_THREADS, 0, stream>>>(x, a->M, a->N, a->q, static_cast<float*>(a->scales));
        return mok_launch_status();
    }
    const int64_t B = a->recipe == MOK_FP8_MXFP8 ? 32 : 128;
    const int64_t threads = a->M * mok_ceil_div(a->N, B) * (B / 8);
    const unsigned grid = mok_grid_stride_blocks(threads, Q_THREADS, Q_BLOCKS_PER_SM);
    if (a->recipe == MOK_FP8_MXFP8) {
        quantize_1xb_kernel<T, 32, true><<<grid, Q_THREADS, 0, stream>>>(x, a->M, a->N, a->q, a->scales);
    } else {
        quantize_1xb_kernel<T, 128, false><<<grid, Q_THREADS, 0, stream>>>(x, a->M, a->N, a->q, a->scales);
    }
    return mok_launch_status();
}

/* Tiles per CTA of the rowcol launch: 0 for the one-CTA-per-tile kernel, else the strip kernel's
 * strip (4 or 8 tiles down M, column scales written as whole sectors). MXFP8 takes strips of 4 once
 * they fill at least 4 waves of 3 CTAs per SM: its column scales are single bytes, 512 stores per tile
 * in the per-tile kernel, and the strip ran 3-6% faster on all three tensors of bench_quant.py
 * (performance log v43, v44); with fewer strips its serial walk down M costs more than it saves.
 * 1x128 stays per tile (its strips measured 5-16% slower). MOK_QUANT_ROWCOL_STRIP=0, 4 or 8 forces a
 * choice (read on every call, so that one process can compare). */
int rowcol_strip_of(int64_t M, int64_t N, bool mx) {
    if (env_equals("MOK_QUANT_ROWCOL_STRIP", "0")) return 0;
    if (env_equals("MOK_QUANT_ROWCOL_STRIP", "4")) return 4;
    if (env_equals("MOK_QUANT_ROWCOL_STRIP", "8")) return 8;
    return mx && mok_qtile::strip_count(M, N, 4) >= 4 * 3 * (int64_t)mok_num_sms() ? 4 : 0;
}

/* Shape and recipe checks shared by both entry points. */
bool shape_and_recipe_ok(int64_t M, int64_t N, int recipe) {
    return M >= 0 && N >= 0 &&
           (recipe == MOK_FP8_BLOCKWISE_1X128 || recipe == MOK_FP8_BLOCKWISE_128X128 || recipe == MOK_FP8_MXFP8);
}

}  // namespace

extern "C" int mok_quantize_fp8_cuda(const struct mok_quantize_fp8_args* a, cudaStream_t stream) {
    MOK_CHECK_ARG(a != NULL && shape_and_recipe_ok(a->M, a->N, a->recipe));
    if (a->M == 0 || a->N == 0) return 0;
    MOK_CHECK_ARG(a->x != NULL && a->q != NULL && a->scales != NULL);
    switch (a->dtype) {
        case MOK_BF16: return quantize_bf16_launch(a, stream);
        case MOK_F16: return quantize_launch<__half>(a, stream);
        case MOK_F32: return quantize_launch<float>(a, stream);
        case MOK_F64: return quantize_launch<double>(a, stream);
        default: return MOK_ERR_DTYPE;
    }
}

/* EXPERIMENTAL (quant/rowcol_stream.cuh; v55: slower in the layer): MOK_QUANT_ROWCOL_STREAM=1 takes
 * the streamed 1 x 128 rowcol kernel where its rows load as 16 bytes (same outputs). */
static bool use_rowcol_stream(const mok_qtile::tile_args& t) {
    return t.vec && env_equals("MOK_QUANT_ROWCOL_STREAM", "1");
}

template <bool kGather>
static int launch_rowcol_stream(const mok_qtile::tile_args& t, cudaStream_t stream) {
    using namespace mok_qtile;
    enum { kCtas = 2 }; /* 128 registers, no spills (ptxas) */
    constexpr auto kernel = quantize_rowcol_stream_kernel<kGather, kCtas>;
    /* its 32 KiB of slots and 22.5 KiB of static scratch pass the 48 KiB a kernel gets without asking */
    const int err = mok_opt_in_dynamic_smem<kernel>(rowcol_stream_smem_bytes());
    if (err != 0) return err;
    const unsigned grid = (unsigned)rowcol_stream_grid(t.M, t.N, kCtas, mok_num_sms());
    kernel<<<grid, kThreads, rowcol_stream_smem_bytes(), stream>>>(t);
    return mok_launch_status();
}

extern "C" int mok_quantize_fp8_rowcol_cuda(const struct mok_quantize_fp8_rowcol_args* a, cudaStream_t stream) {
    using namespace mok_qtile;
    MOK_CHECK_ARG(a != NULL && a->M >= 0 && a->N >= 0 &&
                  (a->recipe == MOK_FP8_BLOCKWISE_1X128 || a->recipe == MOK_FP8_MXFP8 ||
                   a->recipe == MOK_FP8_BLOCKWISE_128X128));
    const bool weight = a->recipe == MOK_FP8_BLOCKWISE_128X128;
    MOK_CHECK_ARG(!weight || (a->col_tile && !a->scales_t_mn_major && a->src_of_row == NULL && a->batch_rows > 0 &&
                              a->batch_rows % 128 == 0 && a->M % a->batch_rows == 0));
    MOK_CHECK_ARG(a->x_up == NULL || (weight && a->batch_rows % 256 == 0));
    if (a->dtype != MOK_BF16) return MOK_ERR_DTYPE;
    if (a->M == 0 || a->N == 0) return 0;
    /* (the weight kernel may leave out the transposed copy) */
    MOK_CHECK_ARG(a->x != NULL && a->q != NULL && a->scales != NULL &&
                  ((a->qt != NULL && a->scales_t != NULL) || (weight && a->qt == NULL && a->scales_t == NULL)));
    const int64_t tiles = tile_count(a->M, a->N);
    MOK_CHECK_ARG(tiles <= MOK_INT32_LIMIT);
    tile_args t = tile_args_of(static_cast<const __nv_bfloat16*>(a->x), a->M, a->N, a->q, a->scales, a->qt,
                               a->scales_t);
    if (weight) {
        /* the transposed copy's 16-byte stores need each expert's rows (not all of M) in whole pieces */
        t.batch_rows = a->batch_rows;
        t.x_up = static_cast<const __nv_bfloat16*>(a->x_up);
        t.vec = t.vec && ((uintptr_t)a->x_up & 15u) == 0; /* (NULL passes) */
        t.vec_t = ((uintptr_t)a->qt & 15u) == 0;
        t.col_tile = 1;
        quantize_tile128_rowcol_bf16_kernel<<<(unsigned)tiles, kThreads, 0, stream>>>(t);
        return mok_launch_status();
    }
    const bool mx = a->recipe == MOK_FP8_MXFP8;
    MOK_CHECK_ARG(!a->col_tile || !mx); /* 128 x 128 column blocks: the blockwise recipe's */
    t.scales_t_mn = a->scales_t_mn_major != 0;
    t.col_tile = a->col_tile != 0;
    if (a->src_of_row) {
        /* gathered rows: the per-tile kernel (the strips' serial walk would serialise the index loads too) */
        MOK_CHECK_ARG(a->T >= 0 && a->K >= 1 && a->K <= MOK_INT32_LIMIT && a->T * a->K <= MOK_INT32_LIMIT);
        t.gather.src = a->src_of_row;
        t.gather.w = a->w;
        t.gather.src_limit = a->T * a->K;
        t.gather.top_k = (int)a->K;
        const int band = mok_gather_band(); /* in 128-column tile columns */
        t.col_band = band > 0 && band < t.nbn ? band : t.nbn; /* 0 or wider than the grid: row-major */
        if (!mx && use_rowcol_stream(t)) return launch_rowcol_stream<true>(t, stream);
        if (mx) quantize_rowcol_bf16_kernel<32, true, true><<<(unsigned)tiles, kThreads, 0, stream>>>(t);
        else quantize_rowcol_bf16_kernel<128, false, true><<<(unsigned)tiles, kThreads, 0, stream>>>(t);
        return mok_launch_status();
    }
    /* NOTE: the strip kernels stage their column scales as rows of [N, ceil(M / B)]: MN-major scales and
     * 128 x 128 column blocks take the per-tile kernel */
    const int strip = t.scales_t_mn || t.col_tile ? 0 : rowcol_strip_of(a->M, a->N, mx);
    if (strip) {
        const unsigned grid = (unsigned)strip_count(a->M, a->N, strip);
        if (strip == 4 && mx) quantize_rowcol_strip_bf16_kernel<32, true, 4><<<grid, kThreads, 0, stream>>>(t);
        else if (strip == 4) quantize_rowcol_strip_bf16_kernel<128, false, 4><<<grid, kThreads, 0, stream>>>(t);
        else if (mx) quantize_rowcol_strip_bf16_kernel<32, true, 8><<<grid, kThreads, 0, stream>>>(t);
        else quantize_rowcol_strip_bf16_kernel<128, false, 8><<<grid, kThreads, 0, stream>>>(t);
        return mok_launch_status();
    }
    if (!mx && use_rowcol_stream(t)) return launch_rowcol_stream<false>(t, stream);
    if (mx) {
        quantize_rowcol_bf16_kernel<32, true><<<(unsigned)tiles, kThreads, 0, stream>>>(t);
    } else {
        quantize_rowcol_bf16_kernel<128, false><<<(unsigned)tiles, kThreads, 0, stream>>>(t);
    }
    return mok_launch_status();
}

extern "C" int mok_dequantize_fp8_cuda(const struct mok_dequantize_fp8_args* a, cudaStream_t stream) {
    MOK_CHECK_ARG(a != NULL && shape_and_recipe_ok(a->M, a->N, a->recipe));
    if (a->M == 0 || a->N == 0) return 0;
    MOK_CHECK_ARG(a->q != NULL && a->scales != NULL && a->y != NULL);
    const unsigned grid = mok_grid_stride_blocks(a->M * a->N, Q_THREADS, Q_BLOCKS_PER_SM);
    if (a->recipe == MOK_FP8_MXFP8) {
        dequantize_kernel<true><<<grid, Q_THREADS, 0, stream>>>(a->q, a->scales, a->M, a->N, 1, 32, a->y);
    } else {
        const int64_t brow = a->recipe == MOK_FP8_BLOCKWISE_128X128 ? Q_TILE : 1;
        dequantize_kernel<false><<<grid, Q_THREADS, 0, stream>>>(a->q, a->scales, a->M, a->N, brow, Q_TILE, a->y);
    }
    return mok_launch_status();
}
