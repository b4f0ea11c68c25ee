/*
 * FP8 conversions of mok's recipes on the device, bit-exact with the C core (csrc/core/convert.c):
 * E4M3 encoding (RNE, saturating to +-448; NaN -> 0x7F with the sign), E4M3 decoding, the E8M0
 * RCEIL scale of a block's amax, and E8M0 decoding.
 */
#ifndef MOK_CUDA_COMMON_FP8_CUH
#define MOK_CUDA_COMMON_FP8_CUH

#include <stdint.h>
#include <cuda_fp8.h>

/* x -> E4M3 code; the conversion instruction (cvt.rn.satfinite) is the C core's rule for every
 * non-NaN float, Inf included; NaN keeps its sign as in the core. */
__device__ __forceinline__ uint8_t mok_dev_e4m3_from_f32(float x) {
    if (isnan(x)) return (uint8_t)(0x7Fu | ((__float_as_uint(x) >> 24) & 0x80u));
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float mok_dev_e4m3_to_f32(uint8_t v) {
    const int mag = v & 0x7F, ex = mag >> 3, man = mag & 7;
    float f;
    if (mag == 0x7F) f = __int_as_float(0x7FC00000);
    else if (ex == 0) f = ldexpf((float)man, -9);
    else f = ldexpf((float)(8 + man), ex - 10);
    return (v & 0x80) ? -f : f;
}

/* The E8M0 code of the quotient q = amax / 448.0f of a finite block (RCEIL: the smallest 2^e with
 * amax / 2^e <= 448: floor(log2 q) from the bits, plus one unless q is a power of two), clamped
 * to [-127, 127]. */
__device__ __forceinline__ uint8_t mok_dev_e8m0_rceil_of_q(float q) {
    const uint32_t b = __float_as_uint(q);
    if (b == 0) return 0;
    const uint32_t f = b >> 23, m = b & 0x7FFFFFu;
    int e = f != 0 ? (int)f - 127 + (m != 0) : (31 - __clz((int)m)) - 149 + ((m & (m - 1u)) != 0);
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    return (uint8_t)(e + 127);
}

/* The E8M0 code of a block with absolute maximum amax; 0xFF for NaN/Inf. */
__device__ __forceinline__ uint8_t mok_dev_e8m0_rceil(float amax) {
    if (isnan(amax) || isinf(amax)) return 0xFF;
    return mok_dev_e8m0_rceil_of_q(__fdiv_rn(fabsf(amax), 448.0f));
}

__device__ __forceinline__ float mok_dev_e8m0_to_f32(uint8_t v) {
    return v == 0xFF ? __int_as_float(0x7FC00000) : ldexpf(1.0f, (int)v - 127);
}

/* ---- division-free forms for bf16 blocks ----
 * The quantisers' hot loops divide every value by the block's scale (x / s, as the C core does),
 * and an IEEE division costs about ten instructions and a slow-path check. For bf16 data the
 * forms below give the core's bits with three to four FP operations. Each is proved by
 * exhaustion over every bf16 input it can meet (csrc/core/tests/fp8_fast_forms.c, run by
 * `make -C csrc/core test`); they rely on IEEE single rounding of __fmul_rn / __fmaf_rn with
 * denormals kept (nvcc's default -ftz=false; --use_fast_math would break them). */

/* RN(1 / 448). */
#define MOK_RCP_448 0x1.24924ap-9f

/* Smallest nonzero bf16 block amax (as bf16 bits: 2^-100) from which mok_dev_quot_by_scale
 * reproduces the core's codes; below it (and above 0) the blocks take __fdiv_rn. */
#define MOK_QUOT_FAST_MIN_BF16 0x0D80u

/* amax / 448.0f correctly rounded, for every bf16 amax (zero and subnormals included): the
 * product with RN(1/448) is corrected once by its exact FMA remainder. */
__device__ __forceinline__ float mok_dev_div448(float amax) {
    const float q0 = __fmul_rn(amax, MOK_RCP_448);
    return __fmaf_rn(__fmaf_rn(-q0, 448.0f, amax), MOK_RCP_448, q0);
}

/* The E4M3 input x / s of a bf16 value x in a block whose scale s = amax / 448 (1 when amax = 0),
 * given r = RN(1 / s): a quotient with one remainder correction (Markstein). Its E4M3 code equals
 * e4m3(x / s) for every bf16 |x| <= amax when amax = 0 or amax >= 2^-100 (MOK_QUOT_FAST_MIN_BF16).
 * NOTE: the remainder is taken as q0 * s - x and subtracted (fma(-e, r, q0)), not as x - q0 * s
 * added: the same value wherever it is nonzero, but for x = -0 the last sum is -0 + -0 = -0, where the
 * added form gives +0 and needed the sign of x put back (one more instruction per value; v41).
 * Same bits as that form wherever this one is used (amax = 0 or >= 2^-100; fp8_fast_forms.c, by
 * exhaustion). */
__device__ __forceinline__ float mok_dev_quot_by_scale(float x, float s, float r) {
    const float q0 = __fmul_rn(x, r);
    return __fmaf_rn(-__fmaf_rn(q0, s, -x), r, q0);
}

/* 2^-e for an E8M0 code 0..254 (e = code - 127), exact as a float (2^-127 is subnormal): x times it
 * is ldexpf(x, -e), the core's MX scaling, rounded once. */
__device__ __forceinline__ float mok_dev_e8m0_inverse(uint32_t code) {
    return __uint_as_float(code == 254u ? 0x00400000u : (254u - code) << 23);
}

/* Two values -> two E4M3 codes in one 16-bit word (lo in the low byte), RNE with saturation: the
 * core's rule for every non-NaN value (the bf16 paths never convert a NaN). */
__device__ __forceinline__ uint32_t mok_dev_e4m3x2(float lo, float hi) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

#endif /* MOK_CUDA_COMMON_FP8_CUH */
