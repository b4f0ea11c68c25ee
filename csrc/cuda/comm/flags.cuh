/*
 * PTX wrappers for cross-rank signalling over peer (or same-GPU) global memory: system-scope
 * release/acquire on 64-bit counters, and the global nanosecond timer that bounds every wait.
 * One instruction per function, named after it.
 */
#ifndef MOK_CUDA_COMM_FLAGS_CUH
#define MOK_CUDA_COMM_FLAGS_CUH

#include <stdint.h>

/* ld.acquire.sys: later loads and stores of this thread (and, after a barrier, of its CTA) see
 * everything the releasing writer did before its release. */
__device__ __forceinline__ uint64_t mok_ld_acquire_sys_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* red.release.sys.add: publishes every earlier write of this thread (and, after a barrier, of
 * its CTA: release is cumulative) before the counter moves. */
__device__ __forceinline__ void mok_red_release_sys_add_u64(uint64_t* p, uint64_t v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* st.relaxed.sys: a plain store to a location other ranks read (ordered by a later release). */
__device__ __forceinline__ void mok_st_relaxed_sys_u64(uint64_t* p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t mok_ld_relaxed_sys_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* %globaltimer: nanoseconds, the same clock on every SM. */
__device__ __forceinline__ uint64_t mok_globaltimer_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Spins until *p >= target (acquire) or the deadline passes; true when reached. */
__device__ __forceinline__ bool mok_wait_geq_u64(const uint64_t* p, uint64_t target, uint64_t deadline_ns) {
    unsigned int backoff = 32;
    while (mok_ld_acquire_sys_u64(p) < target) {
        if (mok_globaltimer_ns() > deadline_ns) {
            return false;
        }
        __nanosleep(backoff);
        if (backoff < 1024) {
            backoff *= 2;
        }
    }
    return true;
}

#endif /* MOK_CUDA_COMM_FLAGS_CUH */
