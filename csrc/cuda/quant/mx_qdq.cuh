/*
 * The MXFP8 quantise-dequantise of bf16 values in registers, shared by the qdq kernel
 * (qdq_mxfp8.cuh, whose header derives the arithmetic) and the BF16 GEMM's on-load qdq of its A
 * operand (qdq_mxfp8_smem.cuh): the E8M0 codes of a block's bf16 amax, the block's two power-of-two
 * multipliers, and e4m3(x * 2^-e) * 2^e for a packed pair, all bit-exact with the C core's
 * mok_qdq_mxfp8_rows / _cols.
 */
#ifndef MOK_CUDA_QUANT_MX_QDQ_CUH
#define MOK_CUDA_QUANT_MX_QDQ_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "../common/fp8.cuh"

namespace mok_qdq {

/* ---- scales ---- */

/* The E8M0 codes of two bf16 magnitudes (one per 16-bit half; finite or not): RCEIL of a / 448 is
 * exponent - 127 - 8 + (mantissa > 1.75), i.e. code = max(0, exponent field - 8 + (mantissa bits
 * > 0x60)): 448 = 1.75 * 2^8 and a bf16 mantissa has 7 bits, so a / 448 is a power of two only when
 * the mantissa is 1.75 exactly. Subnormal and small amaxes clamp to code 0 (2^-127). The codes of
 * NaN/Inf patterns are finite garbage, masked by the caller. */
__device__ __forceinline__ uint32_t mx_codes2(uint32_t a2) {
    const uint32_t ex = (a2 >> 7) & 0x00FF00FFu;
    const uint32_t up = (((a2 & 0x007F007Fu) + 0x001F001Fu) >> 7) & 0x00010001u;
    return __vsubus2(ex + up, 0x00080008u);
}

/* 2^e for an E8M0 code 0 .. 253 as a float (2^-127 is subnormal). */
__device__ __forceinline__ float mx_pow2(uint32_t code) { return __uint_as_float(max(code << 23, 0x00400000u)); }

/* A block's scale as the multipliers of the encoding and the decoding, and its NaN mask. */
struct mx_scale {
    float inv, up; /* 2^-e, 2^e */
    uint32_t bad;  /* 0xFFFFFFFF for a NaN/Inf block, else 0 */
};

__device__ __forceinline__ mx_scale mx_scale_of(uint32_t amax_bits, uint32_t code) {
    mx_scale s;
    s.inv = mok_dev_e8m0_inverse(code);
    s.up = mx_pow2(code);
    s.bad = amax_bits >= 0x7F80u ? 0xFFFFFFFFu : 0u;
    return s;
}

/* Half h (0: low, 1: high) of a packed word. */
__device__ __forceinline__ uint32_t half_of(uint32_t w, int h) { return (w >> (16 * h)) & 0xFFFFu; }

/* ---- the quantise-dequantise of two packed bf16 values, each with its block's scale ---- */

__device__ __forceinline__ uint32_t qdq2(uint32_t w, const mx_scale& a, const mx_scale& b) {
    const float lo = __uint_as_float(w << 16), hi = __uint_as_float(w & 0xFFFF0000u);
    const __nv_fp8x2_storage_t q =
        __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(lo, a.inv), __fmul_rn(hi, b.inv)), __NV_SATFINITE, __NV_E4M3);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(q, __NV_E4M3)));
    /* NOTE: the products are bf16 values (see the header): their high halves are the rounding. */
    const float lo_d = __fmul_rn(f.x, a.up), hi_d = __fmul_rn(f.y, b.up);
    const uint32_t v = __byte_perm(__float_as_uint(lo_d), __float_as_uint(hi_d), 0x7632);
    const uint32_t bad = (a.bad & 0x0000FFFFu) | (b.bad & 0xFFFF0000u);
    return (v & ~bad) | (0x7FC07FC0u & bad);
}

}  // namespace mok_qdq

#endif /* MOK_CUDA_QUANT_MX_QDQ_CUH */
