/*
 * Host helpers of the sm_90a GEMM launchers: TMA tensor maps through the runtime's driver entry
 * point (no link against libcuda) and the Hopper check. Header-only; each launcher keeps its own
 * cached entry point.
 */
#ifndef MOK_CUDA_GEMM_TENSOR_MAP_H
#define MOK_CUDA_GEMM_TENSOR_MAP_H

#include <cuda.h>
#include <cuda_runtime.h>

namespace mok_tma {

typedef CUresult (*encode_tiled_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                    const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled, or NULL where the driver does not have it. */
static inline encode_tiled_fn encode_fn() {
    static encode_tiled_fn fn = NULL;
    static bool tried = false;
    if (!tried) {
        tried = true;
        cudaDriverEntryPointQueryResult q;
        void* p = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            fn = (encode_tiled_fn)p;
        }
        (void)cudaGetLastError();
    }
    return fn;
}

/* A tensor of `rank` dims (dims[0] contiguous) read or written in boxes of `box`, 128B swizzle. */
static inline bool encode(CUtensorMap* map, CUtensorMapDataType type, const void* base, int rank,
                          const cuuint64_t* dims, const cuuint64_t* strides_bytes, const cuuint32_t* box) {
    encode_tiled_fn fn = encode_fn();
    if (!fn) return false;
    const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    return fn(map, type, (cuuint32_t)rank, const_cast<void*>(base), dims, strides_bytes, box, elem_strides,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static inline bool is_hopper() {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major == 9;
}

}  // namespace mok_tma

#endif /* MOK_CUDA_GEMM_TENSOR_MAP_H */
