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
};

/* Two floats rounded to bf16 (mok_from_acc: RNE, NaN kept quiet), low and high half of a word. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(lo)) |
           ((uint32_t)__bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(hi)) << 16);
}

enum swiglu_part { kAct, kGate, kUp }; /* act (forward); d_gate, d_up (the two halves of d_h) */

/* The thread's 8 x 8 block of act, d_gate or d_up as packed bf16 words (load_block's layout). */
template <swiglu_part kPart>
__device__ __forceinline__ void swiglu_block(const swiglu_tile_args& s, const tile_thread& t, uint32_t (&w)[8][4]) {
    const int64_t I = s.I;
    uint4 g[8], u[8], da[8];
    /* NOTE: every load is issued before any value is used (16 or 24 x 16 bytes in flight per thread);
     * d_up needs no u, act no d_act. */
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        g[i] = u[i] = da[i] = make_uint4(0u, 0u, 0u, 0u);
        if (i < t.rows) {
            const __nv_bfloat16* row = s.h + (t.r0 + i) * 2 * I + t.c;
            g[i] = __ldg(reinterpret_cast<const uint4*>(row));
            if (kPart != kUp) u[i] = __ldg(reinterpret_cast<const uint4*>(row + I));
            if (kPart != kAct) da[i] = __ldg(reinterpret_cast<const uint4*>(s.d_act + (t.r0 + i) * I + t.c));
        }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const uint32_t gw[4] = {g[i].x, g[i].y, g[i].z, g[i].w}, uw[4] = {u[i].x, u[i].y, u[i].z, u[i].w};
        const uint32_t dw[4] = {da[i].x, da[i].y, da[i].z, da[i].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float v[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float gv = h ? hi_f(gw[k]) : lo_f(gw[k]), uv = h ? hi_f(uw[k]) : lo_f(uw[k]);
                const float dv = h ? hi_f(dw[k]) : lo_f(dw[k]);
                if (kPart == kAct) {
                    v[h] = mok_swiglu(gv, uv);
                } else {
                    /* NOTE: the stand-alone kernel's mok_swiglu_grad computes both halves; each is
                     * its own expression, so computing one of them gives the same bits. */
                    float d_gate, d_up;
                    mok_swiglu_grad(gv, uv, dv, d_gate, d_up);
                    v[h] = kPart == kGate ? d_gate : d_up;
                }
            }
            w[i][k] = pack_bf16x2(v[0], v[1]);
        }
    }
}

/* The block's 8 rows of bf16 words to dst (row stride ld elements), 16-byte stores. */
__device__ __forceinline__ void store_block(__nv_bfloat16* dst, int64_t ld, int rows, const uint32_t (&w)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (i < rows) *reinterpret_cast<uint4*>(dst + i * ld) = make_uint4(w[i][0], w[i][1], w[i][2], w[i][3]);
}

/* One output tile: its block computed, stored as bf16 (when asked for) and quantised. */
template <swiglu_part kPart, bool kRows, bool kCols>
__device__ __forceinline__ void swiglu_quantize_tile(const tile_args& a, const swiglu_tile_args& sw, int tm, int tn,
                                                     rowcol_smem<128>& s) {
    const tile_thread t = tile_thread_at(a, tm, tn); /* t.c: the column in [0, I) */
    uint32_t w[8][4];
    swiglu_block<kPart>(sw, t, w);
    const tile_thread to = kPart == kUp ? tile_thread_at(a, tm, tn + (int)(sw.I / kTile)) : t; /* in the output */
    if (sw.out != 0) store_block(sw.out + to.r0 * a.N + to.c, a.N, to.rows, w);
    quantize_tile_block<128, false, kRows, kCols>(a, to, w, s);
}

/* a: the output's tile_args (M = R; N = I forward, 2I backward; x unused). kRows / kCols: which
 * copies (blockwise 1 x 128, fp32 scales). Grid: one CTA per 128 x 128 tile of the output: act's
 * (forward) or d_h's (backward: d_gate's tiles read g, u and d_act, d_up's g and d_act).
 * kMinBlocks: CTAs per SM the registers must allow. Measured on an H200 (v39,
 * benchmarks/swiglu_quant_timing.cu): 2 (128 registers) is the fastest; 3 and 4 spill, 1 leaves too
 * few warps to cover the loads. A backward CTA that made both halves (reading g and d_act once) was
 * 2x slower: it held twice the state or read the second half's inputs after the first's barriers. */
template <bool kBackward, bool kRows, bool kCols, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) swiglu_quantize_bf16_kernel(const tile_args a,
                                                                                    const swiglu_tile_args sw) {
    __shared__ rowcol_smem<128> s;
    const int nbn = (int)(sw.I / kTile);               /* tiles along I */
    const int nbg = kBackward ? 2 * nbn : nbn;         /* the grid's tiles along the output's columns */
    const int tm = (int)blockIdx.x / nbg, tg = (int)blockIdx.x - tm * nbg;
    if (!kBackward) swiglu_quantize_tile<kAct, kRows, kCols>(a, sw, tm, tg, s);
    else if (tg < nbn) swiglu_quantize_tile<kGate, kRows, kCols>(a, sw, tm, tg, s);
    else swiglu_quantize_tile<kUp, kRows, kCols>(a, sw, tm, tg - nbn, s);
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_SWIGLU_QUANTIZE_TILE_CUH */
