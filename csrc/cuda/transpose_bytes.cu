/*
 * mok_transpose_bytes_cuda: the launcher of quant/transpose_bytes.cuh (batched [B, R, C] -> [B, C, R]
 * transpose of 1-byte codes; see there).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "quant/transpose_bytes.cuh"

extern "C" int mok_transpose_bytes_cuda(const void* in, void* out, int64_t B, int64_t R, int64_t C,
                                        cudaStream_t stream) {
    using namespace mok_tbytes;
    if (B < 0 || R < 0 || C < 0 || R % 16 || C % 16) return MOK_ERR_ARG;
    if (B == 0 || R == 0 || C == 0) return MOK_OK;
    if (in == NULL || out == NULL || ((uintptr_t)in | (uintptr_t)out) % 16) return MOK_ERR_ARG;
    const int64_t tiles_r = mok_ceil_div(R, kTile), tiles_c = mok_ceil_div(C, kTile), tiles = B * tiles_r * tiles_c;
    /* 16 KiB of shared memory and 256 threads per CTA: 8 CTAs per SM */
    const int64_t cap = (int64_t)mok_num_sms() * 8;
    const unsigned grid = (unsigned)(tiles < cap ? tiles : cap);
    transpose_bytes_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(in),
                                                          static_cast<uint8_t*>(out), R, C, tiles_r, tiles_c, tiles);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? MOK_OK : (int)err;
}
