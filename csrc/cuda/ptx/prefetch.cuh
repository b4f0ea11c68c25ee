/*
 * L2 prefetches (sm_90): bring global memory into L2 without a destination register, a scoreboard
 * or a completion to wait for. The quantisers use them to start a later CTA's loads early.
 */
#ifndef MOK_CUDA_PTX_PREFETCH_CUH
#define MOK_CUDA_PTX_PREFETCH_CUH

#include <stdint.h>

/* The cache line holding p, into L2. */
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* bytes (a multiple of 16) from p (16-byte aligned) into L2, as one bulk request. */
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

#endif /* MOK_CUDA_PTX_PREFETCH_CUH */
