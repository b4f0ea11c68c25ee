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

/* The E8M0 code of a block with absolute maximum amax (RCEIL: the smallest 2^e with
 * amax / 2^e <= 448, read off the bits of amax / 448.0f), clamped to [-127, 127]; 0xFF for NaN/Inf. */
__device__ __forceinline__ uint8_t mok_dev_e8m0_rceil(float amax) {
    if (isnan(amax) || isinf(amax)) return 0xFF;
    const uint32_t b = __float_as_uint(__fdiv_rn(fabsf(amax), 448.0f));
    if (b == 0) return 0;
    const uint32_t f = b >> 23, m = b & 0x7FFFFFu;
    int e = f != 0 ? (int)f - 127 + (m != 0) : (31 - __clz((int)m)) - 149 + ((m & (m - 1u)) != 0);
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    return (uint8_t)(e + 127);
}

__device__ __forceinline__ float mok_dev_e8m0_to_f32(uint8_t v) {
    return v == 0xFF ? __int_as_float(0x7FC00000) : ldexpf(1.0f, (int)v - 127);
}

#endif /* MOK_CUDA_COMMON_FP8_CUH */
