/* SwiGLU arithmetic shared by the SwiGLU kernels and the GEMM epilogues, so that a fused epilogue
 * rounds exactly like the stand-alone kernel (and the C core). */
#ifndef MOK_CUDA_COMMON_SWIGLU_CUH
#define MOK_CUDA_COMMON_SWIGLU_CUH

#include "dtype.cuh"

/* silu(g) = g / (1 + exp(-g)), each step rounded once. */
template <typename Acc>
__device__ __forceinline__ Acc mok_silu(Acc g) {
    return mok_div(g, mok_add((Acc)1, mok_exp(-g)));
}

/* act = silu(g) * u (before the final rounding to the storage type). */
template <typename Acc>
__device__ __forceinline__ Acc mok_swiglu(Acc g, Acc u) {
    return mok_mul(mok_silu(g), u);
}

#endif /* MOK_CUDA_COMMON_SWIGLU_CUH */
