/*
 * mbarrier wrappers (sm_90): one PTX instruction each. A barrier lives in shared memory as a
 * uint64_t; phases alternate 0, 1, 0, ... and waits are on the parity of the phase.
 */
#ifndef MOK_CUDA_PTX_MBARRIER_CUH
#define MOK_CUDA_PTX_MBARRIER_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t mok_smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mok_smem_u32(bar)), "r"(arrivals) : "memory");
}

/* Makes barrier initialisation visible to the async proxy (TMA complete_tx) before first use. */
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mok_smem_u32(bar)) : "memory");
}

/* One arrival that also announces `bytes` of TMA traffic the phase must wait for. */
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mok_smem_u32(bar)), "r"(bytes)
                 : "memory");
}

/* The arrival of this thread happens when all its prior cp.async copies have landed.
 * NOTE: .noinc: the barrier's arrival count must include these arrivals. */
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(mok_smem_u32(bar)) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(mok_smem_u32(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

#endif /* MOK_CUDA_PTX_MBARRIER_CUH */
