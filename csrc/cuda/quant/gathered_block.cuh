/*
 * A thread's 8 x 8 block of a plan's gathered rows, for the quantisers that read them straight from x
 * (quantize_bf16_tile.cuh's rowcol kernel with kGather, qdq_mxfp8.cuh's with kGather): row i of the
 * block is row src[i] / top_k of x [T, N], times w[src[i]] when w is set (the combine's backward:
 * d_rows = gather_rows(dy, src_of_row, w, top_k)), a zero row where src[i] is outside
 * [0, src_limit) (the plan's padding, -1; and entries past T * top_k, which CUDA's gather_rows also
 * reads as zero rows).
 *
 * Order, which is what makes it fast: the 8 index loads, then the 8 weights, then the 8 row loads,
 * and only then the scaling. The first version scaled each row right after its load, which left one
 * 16-byte row load in flight per thread: the weighted rowcol pass ran at 0.66 of the copy against
 * 0.86-0.92 unweighted (performance log v47).
 */
#ifndef MOK_CUDA_QUANT_GATHERED_BLOCK_CUH
#define MOK_CUDA_QUANT_GATHERED_BLOCK_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "../common/dtype.cuh"

namespace mok_gathered {

/* The gathered rows of a quantiser launch. */
struct rows_of_plan {
    const int32_t* src; /* [M] source pair t * top_k + k of each row, -1 for padding */
    const float* w;     /* [src_limit] routing weights, or null */
    int64_t src_limit;  /* T * top_k */
    int top_k;
};

/* bf16(s * x) of both halves of a packed pair, as gather_rows's weighted rows round them (an fp32
 * product, then RNE to bf16), in one cvt for the pair. NOTE: a NaN product comes out as the
 * canonical NaN, where gather_rows keeps the payload (mok_from_acc): the quantisers only compare
 * magnitudes, and any NaN makes its blocks bad (NaN scale / NaN codes) whatever its bits, so their
 * outputs equal those of quantising gather_rows's result. Not for use where these bits are kept. */
__device__ __forceinline__ uint32_t scaled_pair(uint32_t word, float s) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(mok_mul(s, __uint_as_float(word << 16)),
                                                   mok_mul(s, __uint_as_float(word & 0xFFFF0000u)));
    return (uint32_t)__bfloat16_as_ushort(p.x) | ((uint32_t)__bfloat16_as_ushort(p.y) << 16);
}

/* Rows r0 .. r0 + 7 of the gathered tensor (only the first `rows` exist), columns c .. c + 7 of x (only
 * the first `cols` exist; the rest read as 0): v[i][k] = columns 2k (low half) and 2k + 1 of row i.
 * vec: 16-byte loads (N % 8 == 0, x 16-byte aligned). */
__device__ __forceinline__ void load_block(const rows_of_plan& g, const uint16_t* x, int64_t N, int64_t r0,
                                           int rows, int64_t c, int cols, bool vec, uint32_t (&v)[8][4]) {
    if (cols <= 0) rows = 0;
    int32_t src[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) src[i] = i < rows ? __ldg(g.src + r0 + i) : -1;
    bool real[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) real[i] = src[i] >= 0 && src[i] < g.src_limit;
    float scale[8];
    if (g.w != nullptr) {
#pragma unroll
        for (int i = 0; i < 8; ++i) scale[i] = real[i] ? __ldg(g.w + src[i]) : 1.f;
    }
    if (vec) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int64_t row = real[i] ? (int64_t)((uint32_t)src[i] / (uint32_t)g.top_k) : 0;
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (real[i]) u = __ldg(reinterpret_cast<const uint4*>(x + row * N + c));
            v[i][0] = u.x;
            v[i][1] = u.y;
            v[i][2] = u.z;
            v[i][3] = u.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int64_t row = real[i] ? (int64_t)((uint32_t)src[i] / (uint32_t)g.top_k) : 0;
            const uint16_t* p = x + row * N + c;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint32_t lo = real[i] && 2 * k < cols ? p[2 * k] : 0u;
                const uint32_t hi = real[i] && 2 * k + 1 < cols ? p[2 * k + 1] : 0u;
                v[i][k] = lo | (hi << 16);
            }
        }
    }
    /* a padding row is zeros times 1: still zeros */
    if (g.w != nullptr) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int k = 0; k < 4; ++k) v[i][k] = scaled_pair(v[i][k], scale[i]);
    }
}

}  // namespace mok_gathered

#endif /* MOK_CUDA_QUANT_GATHERED_BLOCK_CUH */
