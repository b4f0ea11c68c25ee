/*
 * Thread-block cluster primitives (sm_90): rank in the cluster, the cluster-wide barrier, arrivals
 * on a peer CTA's mbarrier, and TMA loads multicast into every CTA of a mask.
 */
#ifndef MOK_CUDA_PTX_CLUSTER_CUH
#define MOK_CUDA_PTX_CLUSTER_CUH

#include <cuda.h>
#include <stdint.h>

#include "mbarrier.cuh"

__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

/* Every thread of every CTA of the cluster; orders shared-memory writes (barrier init) before the
 * peers' accesses, and keeps a CTA's shared memory alive until its peers are done with it. */
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* One arrival on the mbarrier at the same shared-memory offset as `bar` in CTA `cta` of the cluster.
 * NOTE: default semantics (release at CTA scope), as for a local arrival: the consumers only
 * announce that they are done reading the stage. `.release.cluster` here made every K-block of
 * the 2-CTA GEMM twice as long, measured (the cluster-scope release waits for the warp's wgmma
 * still in flight). */
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
    asm volatile(
        "{\n\t.reg .b32 remote;\n\t"
        "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t}" ::"r"(mok_smem_u32(bar)),
        "r"(cta)
        : "memory");
}

/* TMA loads whose box lands at the same shared-memory offset in every CTA of cta_mask, each CTA's
 * mbarrier at bar's offset receiving the complete_tx of its copy. */
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                      uint16_t cta_mask, int32_t c0, int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%3, %4, %5}], [%2], %6;" ::"r"(mok_smem_u32(dst)),
        "l"((uint64_t)map), "r"(mok_smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
        : "memory");
}

__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                      uint16_t cta_mask, int32_t c0, int32_t c1, int32_t c2,
                                                      int32_t c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%3, %4, %5, %6}], [%2], %7;" ::"r"(mok_smem_u32(dst)),
        "l"((uint64_t)map), "r"(mok_smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask)
        : "memory");
}

#endif /* MOK_CUDA_PTX_CLUSTER_CUH */
