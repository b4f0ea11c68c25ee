/*
 * Element types of mok's CUDA kernels: storage <-> accumulation type conversions and the scalar
 * arithmetic used by the element-wise ops.
 *
 * Storage types: __nv_bfloat16 (MOK_BF16), __half (MOK_F16), float (MOK_F32), double (MOK_F64).
 * Accumulation type (mok_acc<T>::type): double for double, float for everything else, exactly as in
 * csrc/core/mok_core.h.
 *
 * NOTE: rounding to bf16/f16 is round-to-nearest-even (__float2bfloat16_rn / __float2half_rn), the
 * rule of mok_f32_to_bf16 / mok_f32_to_f16. NaN is handled explicitly so that it stays a quiet NaN
 * with its sign (and the top payload bits) kept, instead of the hardware's canonical NaN.
 */
#ifndef MOK_CUDA_COMMON_DTYPE_CUH
#define MOK_CUDA_COMMON_DTYPE_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- accumulation type of a storage type ---- */
template <typename T>
struct mok_acc {
    typedef float type;
};
template <>
struct mok_acc<double> {
    typedef double type;
};

/* ---- storage -> accumulation type (exact widening) ---- */
__device__ __forceinline__ float mok_to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float mok_to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float mok_to_acc(float v) { return v; }
__device__ __forceinline__ double mok_to_acc(double v) { return v; }

/* ---- accumulation type -> storage (RNE, NaN kept quiet with its sign) ---- */
template <typename T>
__device__ __forceinline__ T mok_from_acc(typename mok_acc<T>::type x);

template <>
__device__ __forceinline__ __nv_bfloat16 mok_from_acc<__nv_bfloat16>(float x) {
    if (isnan(x)) {
        /* NOTE: truncate the payload and set the quiet bit (bit 6 of bf16), as mok_f32_to_bf16. */
        const unsigned int u = __float_as_uint(x);
        return __ushort_as_bfloat16((unsigned short)((u >> 16) | 0x0040u));
    }
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half mok_from_acc<__half>(float x) {
    if (isnan(x)) {
        /* NOTE: sign, all-ones exponent, quiet bit and the top 9 payload bits of the float. */
        const unsigned int u = __float_as_uint(x);
        const unsigned int h = ((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x01FFu);
        return __ushort_as_half((unsigned short)h);
    }
    return __float2half_rn(x);
}
template <>
__device__ __forceinline__ float mok_from_acc<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ double mok_from_acc<double>(double x) {
    return x;
}

/* ---- zero of a storage type ---- */
template <typename T>
__device__ __forceinline__ T mok_zero() {
    return mok_from_acc<T>((typename mok_acc<T>::type)0);
}

/* ---- scalar arithmetic in the accumulation type ----
 * NOTE: the element-wise ops (gather, combine, swiglu, routing) use these explicitly rounded forms
 * so that nvcc cannot contract a*b+c into an FMA: each operation rounds once, like the C core. The
 * GEMM mainloops use mok_fma on purpose (fixed order, deterministic, compared with a tolerance). */
__device__ __forceinline__ float mok_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double mok_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mok_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double mok_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mok_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mok_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float mok_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double mok_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float mok_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double mok_fma(double a, double b, double c) { return __fma_rn(a, b, c); }
/* NOTE: full-precision expf/exp (no --use_fast_math in mok's builds). */
__device__ __forceinline__ float mok_exp(float x) { return expf(x); }
__device__ __forceinline__ double mok_exp(double x) { return exp(x); }

#endif /* MOK_CUDA_COMMON_DTYPE_CUH */
