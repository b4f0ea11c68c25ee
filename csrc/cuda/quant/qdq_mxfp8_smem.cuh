/*
 * The MXFP8 row-wise quantise-dequantise of a GEMM's A operand in shared memory, in place: what the
 * BF16 grouped GEMM's consumer warpgroups run on their rows of each K-block when built with kQdqA
 * (mok.ops.grouped_mm_mxfp8_a and grouped_mm_swiglu_mxfp8_a), so that recipe="mxfp8" needs no
 * row-wise qdq copy of its activations in memory. Bit-exact with qdq_mxfp8_kernel's row-wise copy
 * (the same scale per 1 x 32 block and the same qdq2 per pair), hence with the C core's
 * mok_qdq_mxfp8_rows.
 *
 * The tile is a warpgroup's 64 rows of one K-block: 64 bf16 per row, K-major in the 128B swizzle
 * (16-byte chunk c of row r at chunk c ^ (r % 8)). K-blocks start at multiples of 64 of K, so each
 * holds two whole 1 x 32 blocks per row; values past K are the loads' zero fill, which leaves every
 * amax as it is and qdq's to 0, as the qdq kernel's reads past N do. Thread t of 128 takes row t / 2
 * and its block t % 2: four 16-byte loads, the amax, 16 qdq2, four 16-byte stores. The 8 threads of
 * a quarter warp (4 rows x 2 blocks) address 8 different chunk positions in each load and store, so
 * no bank conflicts. About 200 instructions per thread and K-block (12 per pair).
 * Measured (performance log v59, H100): a GEMM that rounds its A this way runs ~1.5x as long, since it
 * rounds each value of A once per N-tile and the rounding is not hidden under the MMA; recipe="mxfp8"
 * keeps its qdq passes by default. Neither latency nor the conversions (v60: two K-blocks in flight and a
 * conversion-free rounding, no faster); likely the extra 32 bytes per clock of shared memory on a kernel
 * whose wgmma reads and TMA writes already use all 128.
 */
#ifndef MOK_CUDA_QUANT_QDQ_MXFP8_SMEM_CUH
#define MOK_CUDA_QUANT_QDQ_MXFP8_SMEM_CUH

#include <stdint.h>

#include "mx_qdq.cuh"

namespace mok_qdq {

enum { kSmemTileRows = 64, kSmemRowBytes = 128 };

/* tile: the shared address of the warpgroup's 64 rows (8 KiB, 1024-byte aligned); t: the thread in the
 * warpgroup (0-127); mem: 16-byte loads and stores by shared address (ptx/smem.cuh's shared_u32x4: LDS
 * and STS; a pointer cast from the dynamic shared memory would give generic LD/ST). The caller orders
 * these generic-proxy writes before the wgmma that reads them (fence.proxy.async, then a barrier of the
 * warpgroup). */
template <typename Mem>
__device__ __forceinline__ void qdq_rows_kmajor_sw128(const Mem& mem, uint32_t tile, int t) {
    const int row = t >> 1, block = t & 1;
    const uint32_t row_addr = tile + (uint32_t)(row * kSmemRowBytes);
    uint4 w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = mem.load(row_addr + (uint32_t)(((4 * block + j) ^ (row & 7)) << 4));
    /* ---- the block's magnitude maximum, compared as integers (see qdq_mxfp8.cuh) ---- */
    uint32_t m = 0u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        m = __vmaxu2(m, w[j].x & 0x7FFF7FFFu);
        m = __vmaxu2(m, w[j].y & 0x7FFF7FFFu);
        m = __vmaxu2(m, w[j].z & 0x7FFF7FFFu);
        m = __vmaxu2(m, w[j].w & 0x7FFF7FFFu);
    }
    const uint32_t amax = max(half_of(m, 0), half_of(m, 1));
    const mx_scale s = mx_scale_of(amax, half_of(mx_codes2(amax), 0));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint4 v;
        v.x = qdq2(w[j].x, s, s);
        v.y = qdq2(w[j].y, s, s);
        v.z = qdq2(w[j].z, s, s);
        v.w = qdq2(w[j].w, s, s);
        mem.store(row_addr + (uint32_t)(((4 * block + j) ^ (row & 7)) << 4), v);
    }
}

}  // namespace mok_qdq

#endif /* MOK_CUDA_QUANT_QDQ_MXFP8_SMEM_CUH */
