/*
 * SwiGLU with its result quantised in the same pass, for the FP8 layer (mok_swiglu_quantize_fp8_cuda):
 *   forward   act [R, I]  = SwiGLU(h)                 h [R, 2I] = [gate | up]
 *   backward  d_h [R, 2I] = SwiGLU'(h) * d_act        d_act [R, I]
 * each rounded to bf16 exactly as the stand-alone SwiGLU kernels round it (common/swiglu.cuh), then
 * quantised 1 x 128 row-wise (q, scales) and / or column-wise (qt, scales_t) exactly as
 * quantize_rowcol_bf16_kernel quantises that bf16 tensor; the bf16 result itself is stored only
 * when asked for. So the codes are those of quantize_rowcol(swiglu(h)) bit for bit, without the
 * bf16 result's round trip through memory: per (r, j) the forward moves 4 + 1 + 1 bytes instead of
 * 4 + 2 (SwiGLU) + 2 + 1 + 1 (rowcol), the backward 10 + 2 + 2 instead of 4 + 2 + 4 (SwiGLU) + 4 + 2 + 2.
 *
 * One CTA per 128 x 128 tile of [R, I] (I % 128 == 0, 16-byte aligned h and d_act), each thread its
 * 8 x 8 block as in quantize_bf16_tile.cuh; the backward's tiles are d_h's, a d_gate tile at
 * columns [n0, n0 + 128) reading g, u and d_act, a d_up tile at [I + n0, I + n0 + 128) reading g and
 * d_act (10 bytes read per (r, j) instead of 6, still less than the bf16 d_h's round trip). Rows
 * past R compute as zeros (SwiGLU and its gradient of zeros are zeros), which leave every amax
 * unchanged, and are never stored.
 *
 * Row-scaled (kScaled, swiglu_tile_args::row_scale set; v53): the all-FP8 layer's form of the router
 * weights, z = s * act with s[r] the row's router weight (mok/_down_combine.py explains it). Forward:
 * the row-wise copy is act's (GEMM2's operand), the column-wise copy z's, z = bf16(s[r] * act) (the
 * weight gradient's operand). Backward: the incoming d_act is d_z, the gradient is SwiGLU's for
 * d_act = s[r] * d_z (not rounded in between, as mok_swiglu_scaled_backward), and each d_gate tile
 * also writes d_s_part[tn * R + r] = sum over its 128 columns of d_z[r, j] * act[r, j] (act rounded
 * to bf16 as the forward stored it): the router-weight gradient's partial sums, which the caller adds
 * over tn in a fixed order. Within a tile the sum is fixed-shape (swiglu_block): bitwise reproducible.
 * The streamed backward (swiglu_quantize_stream.cuh) makes the same partial sums, bit for bit.
 */
#ifndef MOK_CUDA_QUANT_SWIGLU_QUANTIZE_TILE_CUH
#define MOK_CUDA_QUANT_SWIGLU_QUANTIZE_TILE_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "../common/dtype.cuh"
#include "../common/swiglu.cuh"
#include "quantize_bf16_tile.cuh"

namespace mok_qtile {

struct swiglu_tile_args {
    const __nv_bfloat16* h;     /* [R, 2I] */
    const __nv_bfloat16* d_act; /* [R, I], backward only */
    __nv_bfloat16* out;         /* the bf16 result (act [R, I] or d_h [R, 2I]), or null */
    int64_t I;
    const float* row_scale;     /* kScaled: s [R] */
    float* d_s_part;            /* kScaled backward: [I / 128, R] */
    int64_t R;                  /* rows (kScaled) */
};

/* Two floats rounded to bf16 (mok_from_acc: RNE, NaN kept quiet), low and high half of a word. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(lo)) |
           ((uint32_t)__bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(hi)) << 16);
}

enum swiglu_part { kAct, kGate, kUp }; /* act (forward); d_gate, d_up (the two halves of d_h) */

/* v rounded to bf16 (mok_from_acc) and back: act as the forward stores it. */
__device__ __forceinline__ float bf16_rounded(float v) {
    return __uint_as_float((uint32_t)__bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(v)) << 16);
}

/* One block row's 8 values as 4 packed bf16 words (load_block's layout), from its g, u and d_act words:
 * act (!kGrad; d_act unused) or, for the gradient, d_up (up) or d_gate (u unused for d_up): every SwiGLU
 * kernel's row (swiglu_block below, the streamed kernels).
 * kScaled (the gradient's row-scaled form): the incoming words are d_z and the gradient is SwiGLU's for
 * d_act = si * d_z; a d_gate row also returns its 8 columns' sum of d_z * bf16(act) in increasing j (0 else).
 * NOTE: each half of mok_swiglu_grad is its own expression, so computing one of them gives the same bits. */
template <bool kGrad, bool kScaled = false>
__device__ __forceinline__ float swiglu_row_words(const uint4& gq, const uint4& uq, const uint4& dq, bool up,
                                                  uint32_t (&out)[4], float si = 1.f) {
    const uint32_t gw[4] = {gq.x, gq.y, gq.z, gq.w}, uw[4] = {uq.x, uq.y, uq.z, uq.w};
    const uint32_t dw[4] = {dq.x, dq.y, dq.z, dq.w};
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float gv = h ? hi_f(gw[k]) : lo_f(gw[k]), uv = h ? hi_f(uw[k]) : lo_f(uw[k]);
            if (!kGrad) {
                v[h] = mok_swiglu(gv, uv);
            } else {
                const float dv = h ? hi_f(dw[k]) : lo_f(dw[k]);
                if (kScaled && !up) dot = mok_add(dot, mok_mul(dv, bf16_rounded(mok_swiglu(gv, uv))));
                float d_gate, d_up;
                mok_swiglu_grad(gv, uv, kScaled ? mok_mul(si, dv) : dv, d_gate, d_up);
                v[h] = up ? d_up : d_gate;
            }
        }
        out[k] = pack_bf16x2(v[0], v[1]);
    }
    return dot;
}

/* The tile's 128 row scales (0 past R) into shared memory, one per thread of the first 128, then a
 * barrier; the backward calls it after its first batch's loads are issued, so that their latency and
 * the scales' overlap. Why shared memory and not registers: the backward holds 24 x 16 bytes of loads per thread
 * at 128 registers, and eight more live scales spilled (44-88 bytes, ptxas); a row's scale is read
 * where the row is used, a broadcast within each half-warp. */
__device__ __forceinline__ void stage_row_scales(const swiglu_tile_args& sw, int64_t m0, float* s_scale) {
    const int64_t r = m0 + (int64_t)threadIdx.x;
    if (threadIdx.x < kTile) s_scale[threadIdx.x] = r < sw.R ? __ldg(sw.row_scale + r) : 0.f;
    __syncthreads();
}

/* The sum of v over the 16 threads of a row band (one half-warp), by a butterfly: the same fixed-shape sum in
 * every lane. NOTE: every lane runs the shuffles (rows past R hold zeros), so the full mask is right. */
__device__ __forceinline__ float row_band_sum(float v) {
#pragma unroll
    for (int off = 1; off < kPieces; off *= 2) v = mok_add(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    return v;
}

/* The thread's 8 x 8 block of act, d_gate or d_up as packed bf16 words (load_block's layout).
 * kScaled backward: sc[i] (shared memory) scales row i's d_act; d_gate blocks also return, in the
 * thread of piece p < 8, row r0 + p's sum of d_act * act over the tile's 128 columns (act rounded to
 * bf16 first): each thread sums its 8 columns in increasing j, then the 16 threads of the row band
 * (one half-warp, the same g) add by a butterfly, row by row as the rows are done. */
template <swiglu_part kPart, bool kScaled = false>
__device__ __forceinline__ float swiglu_block(const swiglu_tile_args& s, const tile_thread& t, uint32_t (&w)[8][4],
                                              float* s_scale) {
    const float* sc = s_scale + 8 * t.g; /* kScaled: the thread's 8 rows' scales, staged below */
    /* NOTE: every load of a batch is issued before any value is used (up to 24 x 16 bytes in flight per
     * thread; d_up needs no u, act no d_act). The scaled backward loads in two batches of 4 rows: with 8
     * rows in flight its extra state spilled (44-112 bytes, ptxas); 2 CTAs x 256 threads x 48 B x 4 rows
     * is still ~100 KB in flight per SM. */
    enum { kBatch = kScaled && kPart != kAct ? 4 : 8 };
    float mine = 0.f;
    const int64_t I = s.I;
#pragma unroll
    for (int b0 = 0; b0 < 8; b0 += kBatch) {
        /* the forward's scales before its loads, the backward's after its first batch's (measured, v53:
         * the forward 0.94x the plain kernel this way, 0.87-0.89x the other; the backward 0.80-0.84x
         * against 0.77-0.82x) */
        if (kScaled && kPart == kAct && b0 == 0) stage_row_scales(s, t.m0, s_scale);
        uint4 g[kBatch], u[kBatch], da[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int i = b0 + b;
            g[b] = u[b] = da[b] = make_uint4(0u, 0u, 0u, 0u);
            if (i < t.rows) {
                const __nv_bfloat16* row = s.h + (t.r0 + i) * 2 * I + t.c;
                g[b] = __ldg(reinterpret_cast<const uint4*>(row));
                if (kPart != kUp) u[b] = __ldg(reinterpret_cast<const uint4*>(row + I));
                if (kPart != kAct) da[b] = __ldg(reinterpret_cast<const uint4*>(s.d_act + (t.r0 + i) * I + t.c));
            }
        }
        if (kScaled && kPart != kAct && b0 == 0) stage_row_scales(s, t.m0, s_scale);
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int i = b0 + b;
            /* kScaled forward: the row's scale is applied to z after the row-wise copy (quantize_act_and_z) */
            enum { kGrad = kPart != kAct, kScaledGrad = kScaled && kPart != kAct };
            float dot = swiglu_row_words<kGrad, kScaledGrad>(g[b], u[b], da[b], kPart == kUp, w[i],
                                                             kScaledGrad ? sc[i] : 1.f);
            if (kScaled && kPart == kGate) {
                dot = row_band_sum(dot);
                if (t.p == i) mine = dot;
            }
        }
    }
    return mine;
}

/* The block's 8 rows of bf16 words to dst (row stride ld elements), 16-byte stores. */
__device__ __forceinline__ void store_block(__nv_bfloat16* dst, int64_t ld, int rows, const uint32_t (&w)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (i < rows) *reinterpret_cast<uint4*>(dst + i * ld) = make_uint4(w[i][0], w[i][1], w[i][2], w[i][3]);
}

/* The row-scaled forward's copies of act's tile (in w): act's row-wise codes (kRows), then z = bf16(sc[i] *
 * act) in place and z's column-wise codes; sc: the thread's 8 row scales. */
template <bool kRows>
__device__ __forceinline__ void quantize_act_and_z(const tile_args& a, const tile_thread& t, uint32_t (&w)[8][4],
                                                   rowcol_smem<128>& s, const float* sc) {
    quantize_tile_block<128, false, kRows, false>(a, t, w, s);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k) w[i][k] = pack_bf16x2(mok_mul(sc[i], lo_f(w[i][k])), mok_mul(sc[i], hi_f(w[i][k])));
    quantize_tile_block<128, false, false, true>(a, t, w, s);
}

/* One output tile: its block computed, stored as bf16 (when asked for) and quantised. */
template <swiglu_part kPart, bool kRows, bool kCols, bool kScaled>
__device__ __forceinline__ void swiglu_quantize_tile(const tile_args& a, const swiglu_tile_args& sw, int tm, int tn,
                                                     rowcol_smem<128>& s, float* s_scale) {
    const tile_thread t = tile_thread_at(a, tm, tn); /* t.c: the column in [0, I) */
    uint32_t w[8][4];
    const float dot = swiglu_block<kPart, kScaled>(sw, t, w, s_scale);
    /* the router-weight gradient's partial sum of row r0 + p over this tile's columns */
    if (kScaled && kPart == kGate && t.p < t.rows) sw.d_s_part[(int64_t)t.tn * sw.R + t.r0 + t.p] = dot;
    const tile_thread to = kPart == kUp ? tile_thread_at(a, tm, tn + (int)(sw.I / kTile)) : t; /* in the output */
    if (sw.out != 0) store_block(sw.out + to.r0 * a.N + to.c, a.N, to.rows, w);
    if (kScaled && kPart == kAct && kCols) quantize_act_and_z<kRows>(a, to, w, s, s_scale + 8 * t.g);
    else quantize_tile_block<128, false, kRows, kCols>(a, to, w, s);
}

/* a: the output's tile_args (M = R; N = I forward, 2I backward; x unused). kRows / kCols: which
 * copies (blockwise 1 x 128, fp32 scales). Grid: one CTA per 128 x 128 tile of the output: act's
 * (forward) or d_h's (backward: d_gate's tiles read g, u and d_act, d_up's g and d_act).
 * kMinBlocks: CTAs per SM the registers must allow. Measured on an H200 (v39,
 * benchmarks/swiglu_quant_timing.cu): 2 (128 registers) is the fastest; 3 and 4 spill, 1 leaves too
 * few warps to cover the loads. A backward CTA that made both halves (reading g and d_act once) was
 * 2x slower: it held twice the state or read the second half's inputs after the first's barriers. */
template <bool kBackward, bool kRows, bool kCols, int kMinBlocks, bool kScaled = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) swiglu_quantize_bf16_kernel(const tile_args a,
                                                                                    const swiglu_tile_args sw) {
    __shared__ rowcol_smem<128> s;
    __shared__ float s_scale[kScaled ? kTile : 1]; /* kScaled: the tile's row scales */
    const int nbn = (int)(sw.I / kTile);               /* tiles along I */
    const int nbg = kBackward ? 2 * nbn : nbn;         /* the grid's tiles along the output's columns */
    const int tm = (int)blockIdx.x / nbg, tg = (int)blockIdx.x - tm * nbg;
    if (!kBackward) swiglu_quantize_tile<kAct, kRows, kCols, kScaled>(a, sw, tm, tg, s, s_scale);
    else if (tg < nbn) swiglu_quantize_tile<kGate, kRows, kCols, kScaled>(a, sw, tm, tg, s, s_scale);
    else swiglu_quantize_tile<kUp, kRows, kCols, kScaled>(a, sw, tm, tg - nbn, s, s_scale);
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_SWIGLU_QUANTIZE_TILE_CUH */
