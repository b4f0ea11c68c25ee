/*
 * 16-byte vectors of 8 bf16 for the memory-bound row kernels (gather, combine, SwiGLU): one
 * 128-bit load or store per 8 elements, unpacked to the accumulation type (float). The arithmetic
 * on the unpacked values is the scalar kernels' own, so both paths give the same bits.
 */
#ifndef MOK_CUDA_COMMON_VEC_CUH
#define MOK_CUDA_COMMON_VEC_CUH

#include <stdint.h>
#include <cuda_bf16.h>

#include "dtype.cuh"

enum { MOK_VEC = 8 }; /* bf16 per 16-byte vector */

/* True when every pointer is 16-byte aligned (a row stride of H elements keeps that when H % 8 == 0). */
__host__ __device__ __forceinline__ bool mok_aligned16(const void* a, const void* b = 0, const void* c = 0) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15u) == 0;
}

__device__ __forceinline__ uint4 mok_ld8(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }

__device__ __forceinline__ void mok_unpack8(uint4 u, float (&f)[MOK_VEC]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

/* Rounds 8 floats to bf16 (mok_from_acc: RNE, NaN kept quiet) and stores them with one 16-byte store. */
__device__ __forceinline__ void mok_st8(__nv_bfloat16* p, const float (&f)[MOK_VEC]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t lo = __bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(f[2 * i]));
        const uint32_t hi = __bfloat16_as_ushort(mok_from_acc<__nv_bfloat16>(f[2 * i + 1]));
        w[i] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

#endif /* MOK_CUDA_COMMON_VEC_CUH */
