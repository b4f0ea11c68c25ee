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

/* Gradient of act = silu(g) * u for an incoming da, in the C core's order:
 *   d_gate = ((da * u) * sig) * (1 + g * (1 - sig)),   d_up = da * silu(g),   sig = 1 / (1 + exp(-g)). */
template <typename Acc>
__device__ __forceinline__ void mok_swiglu_grad(Acc g, Acc u, Acc da, Acc& d_gate, Acc& d_up) {
    const Acc sig = mok_div((Acc)1, mok_add((Acc)1, mok_exp(-g)));
    const Acc dsig = mok_add((Acc)1, mok_mul(g, mok_sub((Acc)1, sig)));
    d_gate = mok_mul(mok_mul(mok_mul(da, u), sig), dsig);
    d_up = mok_mul(da, mok_silu(g));
}

#endif /* MOK_CUDA_COMMON_SWIGLU_CUH */
