/*
 * Shared-memory loads and stores by 32-bit shared address (sm_90). A struct reached through a pointer cast
 * from the dynamic shared-memory base loses its address space, and the compiler then emits generic
 * loads (LD.E); these wrappers emit LDS.
 */
#ifndef MOK_CUDA_PTX_SMEM_CUH
#define MOK_CUDA_PTX_SMEM_CUH

#include <stdint.h>

#include "mbarrier.cuh" /* mok_smem_u32 */

/* NOTE: volatile + memory clobber keep the load after the mbarrier wait that makes the value valid */
__device__ __forceinline__ float ld_shared_f32(const float* p) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(mok_smem_u32(p)) : "memory");
    return v;
}

/* two consecutive floats, 8-byte aligned */
__device__ __forceinline__ float2 ld_shared_f32x2(const float* p) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(mok_smem_u32(p)) : "memory");
    return v;
}

/* 16 bytes at a 32-bit shared address (16-byte aligned) */
__device__ __forceinline__ uint4 ld_shared_u32x4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
                 : "memory");
    return v;
}

/* 16 bytes to a 32-bit shared address (16-byte aligned) */
__device__ __forceinline__ void st_shared_u32x4(uint32_t addr, const uint4& v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

/* The two above as an accessor object, for code that also runs on the CPU emulation (which passes
 * its own, over an array). */
struct shared_u32x4 {
    __device__ __forceinline__ uint4 load(uint32_t addr) const { return ld_shared_u32x4(addr); }
    __device__ __forceinline__ void store(uint32_t addr, const uint4& v) const { st_shared_u32x4(addr, v); }
};

#endif /* MOK_CUDA_PTX_SMEM_CUH */
