/*
 * cp.async (sm_80+) wrappers: per-thread asynchronous copies global -> shared that bypass the
 * registers (the FP8 GEMM's scales, the BF16 kernel's gathered rows; both complete on an mbarrier).
 */
#ifndef MOK_CUDA_PTX_CP_ASYNC_CUH
#define MOK_CUDA_PTX_CP_ASYNC_CUH

#include <stdint.h>

#include "mbarrier.cuh" /* mok_smem_u32 */

/* 4-byte cp.async global -> shared (a scale); src_bytes 0 writes zeros and leaves src unread. */
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(mok_smem_u32(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}

/* 16-byte cp.async global -> shared; src_bytes < 16 zero-fills the rest (0: all zeros, src unread). */
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(mok_smem_u32(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}

/* Closes the thread's cp.async copies issued since the last commit into one group (possibly empty). */
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Waits until at most kPending of the thread's committed groups are still in flight; the copies of the
 * older groups are then complete and visible to this thread (to other threads only after a barrier). */
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

#endif /* MOK_CUDA_PTX_CP_ASYNC_CUH */
