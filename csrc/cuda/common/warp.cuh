/*
 * Warp-level pieces of the row kernels that give one warp a row (or a pair): a grid-stride loop
 * over warps and the fixed-shape sum of 32 lane partials.
 */
#ifndef MOK_CUDA_COMMON_WARP_CUH
#define MOK_CUDA_COMMON_WARP_CUH

#include <stdint.h>

#include "dtype.cuh"

/* A grid-stride loop over warps (blocks of whole warps): this thread's lane, its warp's index and
 * the grid's warp count. */
struct WarpStride {
    int lane;
    int64_t warp, count;
};
__device__ __forceinline__ WarpStride warp_stride() {
    return {(int)(threadIdx.x % 32), ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32,
            (int64_t)gridDim.x * blockDim.x / 32};
}

/* Sum of the 32 lanes' partials by a fixed shuffle tree (offsets 16, 8, 4, 2, 1), each step rounded
 * on its own: bitwise reproducible. The sum is in lane 0. */
template <typename Acc>
__device__ __forceinline__ Acc warp_sum_to_lane0(Acc v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        v = mok_add(v, __shfl_down_sync(0xffffffffu, v, off));
    }
    return v;
}

#endif /* MOK_CUDA_COMMON_WARP_CUH */
