/*
 * The rowcol quantiser as a persistent kernel (EXPERIMENTAL, opt-in: MOK_QUANT_ROWCOL_PERSISTENT=1,
 * performance log v36): the same tile work and outputs as quantize_rowcol_bf16_kernel, but each CTA
 * walks tiles blockIdx.x, + gridDim.x, ... and keeps the next two tiles' bytes in flight.
 *
 * Why: the one-CTA-per-tile kernel loads its whole tile before any work and stores only after two
 * barriers, so DRAM is kept busy only by the resident CTAs' first loads; on the H200 it reaches
 * 0.73-0.78x of the copy bandwidth on DeepSeek-V3's activation (RESULTS v9), 0.82-0.86x on an H100
 * (v19), and more CTAs per SM did not help (v34). Here two CTAs per SM each hold two 32 KiB tile
 * buffers filled by bulk copies (one per row, issued by warp 0, completing on the buffer's
 * mbarrier): while a CTA quantises tile i from one buffer, tile i + 1 is landing in the other,
 * and the first buffer is refilled with tile i + 2 as soon as every thread has its 8 x 8 block in
 * registers (after rowcol_tile's first barrier).
 *
 * Needs x rows 16-byte aligned (tile_args::vec: N % 8 == 0, x aligned); the launcher falls back to
 * the one-CTA-per-tile kernel otherwise. Rows past M and pieces past N are never copied; the reader
 * treats them as zeros (as load_block does), so stale bytes of an earlier tile are never used.
 */
#ifndef MOK_CUDA_QUANT_QUANTIZE_ROWCOL_PERSISTENT_CUH
#define MOK_CUDA_QUANT_QUANTIZE_ROWCOL_PERSISTENT_CUH

#include "../ptx/mbarrier.cuh"
#include "../ptx/tma.cuh"
#include "quantize_bf16_tile.cuh"

namespace mok_qtile {

enum { kPersistentCtasPerSm = 2 };

/* The kernel's dynamic shared memory (tests/emu/cuda_emu.h defines its own). */
#ifndef MOK_DYNAMIC_SMEM
#define MOK_DYNAMIC_SMEM(name) extern __shared__ __align__(128) uint8_t name[]
#endif

/* 64 KiB of tile buffers plus the tile kernel's 22 or 28 KiB: two CTAs per SM. */
template <int B>
struct rowcol_persistent_smem {
    uint4 x[2][kTile * kPieces]; /* two 128 x 128 bf16 tiles, rows of 256 bytes (16 pieces of 8 values) */
    rowcol_smem<B> rc;
    uint64_t full[2];            /* buffer b's bytes have landed (one phase per fill) */
};

/* Warp 0: copy tile `tile` of x into dst, one bulk copy per row, completing on full. */
__device__ __forceinline__ void load_tile_async(const tile_args& a, int tile, uint4* dst, uint64_t* full) {
    const int lane = (int)threadIdx.x % 32;
    const int tm = tile / a.nbn, tn = tile - tm * a.nbn;
    const int64_t m0 = (int64_t)tm * kTile, n0 = (int64_t)tn * kTile;
    const int rows = (int)(a.M - m0 < kTile ? a.M - m0 : kTile);
    const uint32_t row_bytes = (uint32_t)((a.N - n0 < kTile ? a.N - n0 : kTile) * 2); /* N % 8 == 0: a multiple of 16 */
    /* NOTE: every thread read this buffer through the generic proxy before the barrier that led here;
     * order those reads before the async-proxy writes below. */
    fence_proxy_async_shared();
    if (lane == 0) mbarrier_arrive_expect_tx(full, (uint32_t)rows * row_bytes);
    __syncwarp();
    for (int r = lane; r < rows; r += 32) bulk_load(dst + r * kPieces, a.x + (m0 + r) * a.N + n0, row_bytes, full);
}

/* The thread's 8 x 8 block from a tile buffer (rows past M and pieces past N read as zeros). */
__device__ __forceinline__ void load_block_smem(const uint4* xs, const tile_thread& t, uint32_t (&w)[8][4]) {
    const int rows = t.cols > 0 ? t.rows : 0;
    /* NOTE: a quarter-warp reads 8 consecutive 16-byte pieces of one row: no bank conflicts. */
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const uint4 u = i < rows ? xs[(8 * t.g + i) * kPieces + t.p] : make_uint4(0u, 0u, 0u, 0u);
        w[i][0] = u.x;
        w[i][1] = u.y;
        w[i][2] = u.z;
        w[i][3] = u.w;
    }
}

template <int B, bool kMx>
__global__ void __launch_bounds__(kThreads, kPersistentCtasPerSm)
    quantize_rowcol_bf16_persistent_kernel(const tile_args a, int tiles) {
    MOK_DYNAMIC_SMEM(smem_raw);
    rowcol_persistent_smem<B>& s = *reinterpret_cast<rowcol_persistent_smem<B>*>(smem_raw);
    const bool loader = threadIdx.x < 32;
    if (threadIdx.x == 0) {
        mbarrier_init(&s.full[0], 1);
        mbarrier_init(&s.full[1], 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    const int step = (int)gridDim.x;
    if (loader) {
        if ((int64_t)blockIdx.x < tiles) load_tile_async(a, (int)blockIdx.x, s.x[0], &s.full[0]);
        if ((int64_t)blockIdx.x + step < tiles) load_tile_async(a, (int)blockIdx.x + step, s.x[1], &s.full[1]);
    }
    int it = 0;
    /* (64-bit: tile + 2 * step may pass INT32_MAX when tiles is close to it) */
    for (int64_t tile = blockIdx.x; tile < tiles; tile += step, ++it) {
        const int buf = it & 1;
        mbarrier_wait_parity(&s.full[buf], (uint32_t)(it >> 1) & 1u);
        const tile_thread t = tile_thread_of(a, (int)tile);
        uint32_t w[8][4];
        load_block_smem(s.x[buf], t, w);
        rowcol_tile<B, kMx>(a, t, w, s.rc, [&] {
            /* every thread holds its block: refill this buffer with the tile after next */
            const int64_t next = tile + 2 * step;
            if (loader && next < tiles) load_tile_async(a, (int)next, s.x[buf], &s.full[buf]);
        });
    }
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_QUANTIZE_ROWCOL_PERSISTENT_CUH */
