/*
 * TMA (cp.async.bulk.tensor) and cp.async wrappers (sm_90). Tensor maps are built on the host
 * (mok_tma_encode in gemm/tma_host.h) and passed to kernels as __grid_constant__ parameters.
 */
#ifndef MOK_CUDA_PTX_TMA_CUH
#define MOK_CUDA_PTX_TMA_CUH

#include <cuda.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "mbarrier.cuh"

__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
}

/* Loads the box at coordinates (c0 fastest, ...) into shared memory; completes on bar. */
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                            int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            mok_smem_u32(dst)),
        "l"((uint64_t)map), "r"(mok_smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];" ::"r"(mok_smem_u32(dst)),
        "l"((uint64_t)map), "r"(mok_smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];" ::"r"(mok_smem_u32(dst)),
        "l"((uint64_t)map), "r"(mok_smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

/* ---- TMA stores (shared -> global), tracked in bulk groups of the issuing thread ---- */

/* src: a shared-memory address (mok_smem_u32). */
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int32_t c0, int32_t c1,
                                             int32_t c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int32_t c0, int32_t c1,
                                             int32_t c2, int32_t c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

/* Waits until at most kPending of this thread's bulk groups still read their shared memory. */
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

/* Waits until at most kPending of this thread's bulk groups are incomplete (writes done). */
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

/* Barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
 * __syncthreads). */
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/* Plain bulk copy global -> shared (no tensor map), completing on an mbarrier's tx count. bytes: a
 * multiple of 16; both addresses 16-byte aligned. */
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     mok_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(mok_smem_u32(bar))
                 : "memory");
}

/* Orders this thread's generic-proxy shared-memory accesses with its later async-proxy ones
 * (wgmma operand reads, TMA stores). */
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#endif /* MOK_CUDA_PTX_TMA_CUH */
