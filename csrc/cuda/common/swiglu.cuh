/* SwiGLU arithmetic shared by the SwiGLU kernels and the GEMM epilogues, so that a fused epilogue
 * rounds exactly like the stand-alone kernel (and the C core). */
#ifndef MOK_CUDA_COMMON_SWIGLU_CUH
#define MOK_CUDA_COMMON_SWIGLU_CUH

#include "dtype.cuh"

/* silu(g) = g / (1 + exp(-g)), each step rounded once (double). */
template <typename Acc>
__device__ __forceinline__ Acc mok_silu(Acc g) {
    return mok_div(g, mok_add((Acc)1, mok_exp(-g)));
}

/* 1 / (1 + exp(-g)) (double). */
template <typename Acc>
__device__ __forceinline__ Acc mok_sigmoid(Acc g) {
    return mok_div((Acc)1, mok_add((Acc)1, mok_exp(-g)));
}

/* exp(x) for 1 + exp(x) only: __expf's ex2.approx of x * log2(e) with results below 2^-126 flushed to zero
 * (.ftz). Why: __expf keeps those results subnormal at the cost of a compare and two predicated multiplies
 * around the MUFU.EX2, per value (cuobjdump); added to 1 they vanish either way (1 + e == 1 in fp32 for
 * e < 2^-24), so silu and sigmoid keep their bits (benchmarks/swiglu_exp_check.cu checks all 2^32 g;
 * performance log v57). The CPU emulation (tests/emu/cuda_emu.h) defines its own. */
#ifndef MOK_TESTS_CUDA_EMU_H
__device__ __forceinline__ float mok_exp_for_one_plus(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.44269504088896341f)));
    return y;
}
#endif

/* float: exp through ex2.approx and an approximate reciprocal (a few ulp of fp32, far below the
 * bf16/fp16 rounding that follows; fp32 data stays within the tests' fp32 tolerance).
 * NOTE: the full-precision expf and IEEE division made the GEMM1 epilogue issue-bound: about
 * 45 instructions per value, 6.5 us of a 25 us tile on Qwen3-30B-A3B (measured). Every CUDA
 * SwiGLU (the stand-alone kernels and the fused epilogue) uses these, so they agree bit for bit.
 * Large -g: exp gives inf and the quotient 0 (or -0), as the exact result rounds to. */
template <>
__device__ __forceinline__ float mok_silu<float>(float g) {
    return __fdividef(g, 1.0f + mok_exp_for_one_plus(-g));
}
template <>
__device__ __forceinline__ float mok_sigmoid<float>(float g) {
    return __fdividef(1.0f, 1.0f + mok_exp_for_one_plus(-g));
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
    const Acc sig = mok_sigmoid(g);
    const Acc dsig = mok_add((Acc)1, mok_mul(g, mok_sub((Acc)1, sig)));
    d_gate = mok_mul(mok_mul(mok_mul(da, u), sig), dsig);
    d_up = mok_mul(da, mok_silu(g));
}

#endif /* MOK_CUDA_COMMON_SWIGLU_CUH */
