/*
 * The rowcol quantiser as a persistent kernel fed by cp.async (EXPERIMENTAL, opt-in:
 * MOK_QUANT_ROWCOL_PERSISTENT=1 or 2, performance log v40): the same per-tile work and outputs as
 * quantize_rowcol_bf16_kernel (quantize_tile_block), but each CTA walks tiles blockIdx.x,
 * + gridDim.x, ... and keeps the next tile's bytes in flight while it quantises the current one.
 *
 * Why: the one-CTA-per-tile kernel loads its whole tile before any work and stores only after three
 * barriers, so DRAM is kept busy by whichever resident CTAs happen to be in their load phase; on the
 * H200 it moves 3.1-3.3 TB/s whatever the tensor (0.74-0.88 of the copy). v36 tried a persistent
 * kernel with one bulk copy per tile row and was 40% slower; here every thread copies its own
 * 8 x 16 bytes with cp.async, the access pattern of load_block, and reads back only what it copied,
 * so cp.async.wait_group alone orders the buffer (no barrier, no mbarrier).
 *
 * kBuffers tile buffers of 32 KiB: the copy of tile i + kBuffers is issued into tile i's buffer as
 * soon as the thread's block maxima have consumed the block it read from there (quantize_tile_block's
 * hook), i.e. before tile i's row codes, column scales, column codes and transposed stores.
 * Needs x rows 16-byte aligned (tile_args::vec: N % 8 == 0, x aligned); the launcher runs the
 * one-CTA-per-tile kernel otherwise. Rows past M and pieces past N are never copied; the reader
 * substitutes zeros (as load_block does), so stale bytes of an earlier tile are never used.
 */
#ifndef MOK_CUDA_QUANT_QUANTIZE_ROWCOL_PERSISTENT_CUH
#define MOK_CUDA_QUANT_QUANTIZE_ROWCOL_PERSISTENT_CUH

#include "../ptx/cp_async.cuh"
#include "quantize_bf16_tile.cuh"

namespace mok_qtile {

/* The kernel's dynamic shared memory (tests/emu/cuda_emu.h defines its own). */
#ifndef MOK_DYNAMIC_SMEM
#define MOK_DYNAMIC_SMEM(name) extern __shared__ __align__(128) uint8_t name[]
#endif

/* CTAs per SM the launch bounds ask for: one buffer (54 or 60 KiB of shared memory) leaves the
 * registers of the one-CTA-per-tile kernel's three CTAs; two buffers (86 or 92 KiB) fit two. */
template <int kBuffers>
struct rowcol_persistent_occupancy {
    enum { kCtas = kBuffers == 1 ? 3 : 2 };
};

template <int B, int kBuffers>
struct rowcol_persistent_smem {
    uint4 x[kBuffers][kTile * kPieces]; /* 128 x 128 bf16 tiles, rows of 256 bytes (16 pieces of 8 values) */
    rowcol_smem<B> rc;
};

/* This thread's 8 pieces of tile `tile` into buf (rows past M and pieces past N skipped), as one
 * cp.async group (committed even when empty, so that group counts stay per tile). */
__device__ __forceinline__ void copy_block_async(const tile_args& a, int64_t tile, int64_t tiles, uint4* buf) {
    if (tile < tiles) {
        const int k = (int)tile; /* < tiles <= INT32_MAX (the launcher checks) */
        const tile_thread t = tile_thread_at(a, k / a.nbn, k % a.nbn);
        const int rows = t.cols > 0 ? t.rows : 0;
        const __nv_bfloat16* src = a.x + t.r0 * a.N + t.c;
        uint4* dst = buf + 8 * t.g * kPieces + t.p;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (i < rows) cp_async_16(dst + i * kPieces, src + i * a.N, 16u);
    }
    cp_async_commit_group();
}

/* The thread's 8 x 8 block from a tile buffer; rows past M and pieces past N read as zeros.
 * NOTE: a quarter-warp reads 8 consecutive 16-byte pieces of one row: no bank conflicts. */
__device__ __forceinline__ void read_block(const uint4* buf, const tile_thread& t, uint32_t (&w)[8][4]) {
    const int rows = t.cols > 0 ? t.rows : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const uint4 u = i < rows ? buf[(8 * t.g + i) * kPieces + t.p] : make_uint4(0u, 0u, 0u, 0u);
        w[i][0] = u.x;
        w[i][1] = u.y;
        w[i][2] = u.z;
        w[i][3] = u.w;
    }
}

template <int B, bool kMx, int kBuffers>
__global__ void __launch_bounds__(kThreads, rowcol_persistent_occupancy<kBuffers>::kCtas)
    quantize_rowcol_bf16_persistent_kernel(const tile_args a, int64_t tiles) {
    static_assert(kBuffers == 1 || kBuffers == 2, "one or two tile buffers");
    MOK_DYNAMIC_SMEM(smem_raw);
    rowcol_persistent_smem<B, kBuffers>& s = *reinterpret_cast<rowcol_persistent_smem<B, kBuffers>*>(smem_raw);
    /* (64-bit: tile + 2 * step may pass INT32_MAX when tiles is close to it) */
    const int64_t step = gridDim.x;
    /* the first kBuffers tiles in flight, one group each */
#pragma unroll
    for (int b = 0; b < kBuffers; ++b) copy_block_async(a, blockIdx.x + b * step, tiles, s.x[b]);
    int buf = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += step) {
        /* this tile's group is the oldest of the kBuffers in flight */
        cp_async_wait_group<kBuffers - 1>();
        const tile_thread t = tile_thread_at(a, (int)tile / a.nbn, (int)tile % a.nbn);
        uint32_t w[8][4];
        read_block(s.x[buf], t, w);
        uint4* const refill = s.x[buf];
        quantize_tile_block<B, kMx, true, true>(a, t, w, s.rc, [&] {
            /* w is consumed: the buffer it came from takes the tile kBuffers steps ahead */
            copy_block_async(a, tile + kBuffers * step, tiles, refill);
        });
        buf = kBuffers == 1 ? 0 : buf ^ 1;
    }
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_QUANTIZE_ROWCOL_PERSISTENT_CUH */
