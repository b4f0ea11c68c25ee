/*
 * Register -> shared-memory stores of MMA accumulator fragments (sm_90): stmatrix writes four 8 x 8
 * b16 matrices per warp in one instruction, each thread giving one register per matrix (its row
 * lane / 4, columns 2 (lane % 4) + {0, 1}: the mma / wgmma accumulator layout) and one row address
 * (lanes 8 j .. 8 j + 7 address the rows of matrix j).
 */
#ifndef MOK_CUDA_PTX_STMATRIX_CUH
#define MOK_CUDA_PTX_STMATRIX_CUH

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr), "r"(m0),
                 "r"(m1), "r"(m2), "r"(m3)
                 : "memory");
}

/* Two floats rounded to bf16 (nearest even) in one register, lo in the low half (the lower
 * address): one cvt.rn.bf16x2.f32. A NaN becomes the canonical bf16 NaN, as in PyTorch's CUDA
 * conversion. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

/* The two bf16 halves of a packed register, back as floats (exact). */
__device__ __forceinline__ float bf16x2_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16x2_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

#endif /* MOK_CUDA_PTX_STMATRIX_CUH */
