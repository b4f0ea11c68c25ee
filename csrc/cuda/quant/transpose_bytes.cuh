/*
 * Batched transpose of 1-byte elements (FP8 codes), in [B, R, C] -> out [B, C, R], at the copy's
 * speed: the FP8 dgrad reads each expert's W^T codes K-major, made once per weight version
 * (mok/_fp8_experts.py). torch's strided copy moved these bytes at a fraction of the bandwidth (one
 * byte per thread, reads or writes uncoalesced).
 *
 * One CTA per 128 x 128 tile (grid-stride), 256 threads:
 * - load: each thread reads four 16-byte pieces; 8 lanes cover one 128-byte tile row, a warp 4 rows;
 * - shared memory: the tile as 128 rows of 32 words, word w of row r stored at w ^ ((r / 16) % 8), so
 *   that the reads below hit 8 different banks;
 * - store: each thread writes four 16-byte pieces of the transposed tile (16 input rows of one input
 *   column each), 8 lanes one 128-byte output row: coalesced both ways.
 * R and C multiples of 16 (whole pieces); rows and columns past R and C are neither read nor written.
 */
#ifndef MOK_CUDA_QUANT_TRANSPOSE_BYTES_CUH
#define MOK_CUDA_QUANT_TRANSPOSE_BYTES_CUH

#include <stdint.h>
#include <cuda_runtime.h>

namespace mok_tbytes {

enum { kTile = 128, kThreads = 256, kPieces = kTile / 16 /* 16-byte pieces per tile row */ };

/* word w of tile row r sits at this index of the row */
__device__ __forceinline__ int swizzled(int r, int w) { return w ^ ((r >> 4) & 7); }

/* v's words permuted so that word j lands at j ^ x (x in 0..3): the swizzle inside a 16-byte group */
__device__ __forceinline__ uint4 permute_words(uint4 v, int x) {
    if (x & 1) v = make_uint4(v.y, v.x, v.w, v.z);
    if (x & 2) v = make_uint4(v.z, v.w, v.x, v.y);
    return v;
}

__global__ void __launch_bounds__(kThreads) transpose_bytes_kernel(const uint8_t* __restrict__ in,
                                                                   uint8_t* __restrict__ out, int64_t R, int64_t C,
                                                                   int64_t tiles_r, int64_t tiles_c, int64_t tiles) {
    __shared__ __align__(16) uint32_t s[kTile][kTile / 4];
    const int tid = (int)threadIdx.x;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t per_batch = tiles_r * tiles_c;
        const int64_t b = tile / per_batch, rest = tile % per_batch;
        const int64_t r0 = (rest / tiles_c) * kTile, c0 = (rest % tiles_c) * kTile;
        const uint8_t* src = in + b * R * C;
        uint8_t* dst = out + b * R * C;
        /* ---- load: piece k of tile row r -> words 4k .. 4k + 3, swizzled as a group ---- */
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int p = tid + i * kThreads, r = p / kPieces, k = p % kPieces;
            v[i] = make_uint4(0u, 0u, 0u, 0u);
            if (r0 + r < R && c0 + 16 * k < C)
                v[i] = __ldg(reinterpret_cast<const uint4*>(src + (r0 + r) * C + c0 + 16 * k));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int p = tid + i * kThreads, r = p / kPieces, k = p % kPieces, sw = (r >> 4) & 7;
            *reinterpret_cast<uint4*>(&s[r][4 * (k ^ (sw >> 2))]) = permute_words(v[i], sw & 3);
        }
        __syncthreads();
        /* ---- store: piece j of output row c holds input rows 16j .. 16j + 15 of input column c ---- */
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int p = tid + i * kThreads, c = p / kPieces, j = p % kPieces;
            const int shift = 8 * (c % 4);
            uint32_t words[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                uint32_t word = 0;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = 16 * j + 4 * q + e;
                    word |= ((s[r][swizzled(r, c / 4)] >> shift) & 0xFFu) << (8 * e);
                }
                words[q] = word;
            }
            if (c0 + c < C && r0 + 16 * j < R)
                *reinterpret_cast<uint4*>(dst + (c0 + c) * R + r0 + 16 * j) =
                    make_uint4(words[0], words[1], words[2], words[3]);
        }
        __syncthreads(); /* s is rewritten by the next tile */
    }
}

}  // namespace mok_tbytes

#endif /* MOK_CUDA_QUANT_TRANSPOSE_BYTES_CUH */
