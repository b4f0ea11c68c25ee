/*
 * The 1 x 128 rowcol quantiser (row-wise and column-wise FP8 copies from one read of x) with its loads
 * streamed through shared memory, plain or of a plan's gathered rows: the same outputs as
 * quantize_rowcol_bf16_kernel<128, false, kGather> (quantize_bf16_tile.cuh), bit for bit. EXPERIMENTAL
 * (opt-in, MOK_QUANT_ROWCOL_STREAM=1). Measured in the layer (v55, H100): 1.5-2% slower on Qwen3 and
 * DeepSeek-V3, even on Mixtral; not yet timed stand-alone (v55's rowcol_timing.cu run had the launch
 * without its shared-memory opt-in). The per-tile gathered pass already runs at 0.91-0.96 of copy
 * stand-alone there, so the headroom this kernel was written for is the layer's, not the kernel's.
 *
 * Why: v54's streamed SwiGLU forward (swiglu_quantize_stream.cuh: persistent CTAs, one an SM, each
 * thread's loads one tile ahead by cp.async) ran at 0.87-0.95 of the copy bandwidth where its per-tile
 * kernel ran at 0.67-0.73; the all-FP8 layer's two gathered rowcol passes (x_rows from x, d_rows from
 * dy) run at 0.69-0.76 and take 1.64 ms of DeepSeek-V3's 20.8 ms step (H100, v54's trace).
 *
 * Work item: one 128 x 128 tile, in the per-tile kernel's order (row-major; gathered: tile_thread_banded's
 * column bands), item += gridDim.x. Thread t's slot for row i of its 8 x 8 block at i * kThreads + t; one
 * commit group per row, so 8 groups are in flight at every row's start and wait_group(7) completes the
 * row's. A slot is refilled with the next item's row after the value read from it has been used (the
 * refill is issued after instructions that depend on the slot's load). Gathered rows: the next item's
 * row indices are loaded an item earlier still (two items ahead of their tile, into registers), so the
 * refills never wait on an index load; a row's routing weight (weighted d_rows) one item ahead, applied
 * when the row is read (as mok_gathered::load_block applies it). Rows past M, padding rows and columns
 * past N are zero-filled without reading.
 * Needs a.vec (N % 8 == 0, 16-byte aligned x and 8-byte aligned q), as the launcher checks.
 */
#ifndef MOK_CUDA_QUANT_ROWCOL_STREAM_CUH
#define MOK_CUDA_QUANT_ROWCOL_STREAM_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "gathered_block.cuh"
#include "quantize_bf16_tile.cuh"
#include "stream_copies.cuh"

namespace mok_qtile {

/* Dynamic shared memory of quantize_rowcol_stream_kernel: one item's rows, 16 bytes per row and thread. */
static inline size_t rowcol_stream_smem_bytes() { return (size_t)8 * kThreads * 16; }

/* Item idx's tile for this thread (row-major, or in column bands for gathered rows). */
template <bool kGather>
__device__ __forceinline__ tile_thread rowcol_stream_tile(const tile_args& a, int idx) {
    if (kGather) return tile_thread_banded_at(a, idx);
    const int tm = idx / a.nbn;
    return tile_thread_at(a, tm, idx - tm * a.nbn);
}

/* The thread's 8 row sources of one item: rows of x for the plain kernel (-1: no row), gathered: the
 * plan's source pairs (outside [0, src_limit): a zero row). */
template <bool kGather>
__device__ __forceinline__ void load_row_sources(const tile_args& a, int idx, int items, int (&src)[8]) {
    const tile_thread t = rowcol_stream_tile<kGather>(a, idx < items ? idx : 0);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const bool row = idx < items && i < t.rows && t.cols > 0;
        if (kGather) src[i] = row ? __ldg(a.gather.src + t.r0 + i) : -1;
        else src[i] = row ? (int)(t.r0 + i) : -1;
    }
}

/* Row i of an item into its slot (one commit group); its source src (see load_row_sources). */
template <bool kGather>
__device__ __forceinline__ void issue_rowcol_row(const tile_args& a, const tile_thread& t, int src, uint4* slot) {
    const bool real = kGather ? src >= 0 && src < a.gather.src_limit : src >= 0;
    const int64_t row = !real ? 0 : kGather ? (int64_t)((uint32_t)src / (uint32_t)a.gather.top_k) : (int64_t)src;
    stream_copy16(slot, real ? a.x + row * a.N + t.c : a.x, real);
    stream_commit();
}

/* kMinBlocks: CTAs per SM the registers must allow (1: 255 registers, as v54's streamed forward). Grid: at
 * most one CTA per tile, persistent over the tiles; dynamic shared memory rowcol_stream_smem_bytes(). */
template <bool kGather, int kMinBlocks = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocks) quantize_rowcol_stream_kernel(const tile_args a) {
    __shared__ rowcol_smem<128> s;
    uint4* const slots = stream_fifo() + threadIdx.x;
    const int items = (int)((a.M + kTile - 1) / kTile) * a.nbn, step = (int)gridDim.x;
    const bool weighted = kGather && a.gather.w != nullptr;

    /* the first item's rows in flight; the next item's sources and weights, the one after's sources */
    int src[8], src_next[8];
    float w_cur[8], w_next[8];
    load_row_sources<kGather>(a, (int)blockIdx.x, items, src);
    {
        const tile_thread t0 = rowcol_stream_tile<kGather>(a, (int)blockIdx.x < items ? (int)blockIdx.x : 0);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            w_cur[i] = weighted && src[i] >= 0 && src[i] < a.gather.src_limit ? __ldg(a.gather.w + src[i]) : 1.f;
            issue_rowcol_row<kGather>(a, t0, (int)blockIdx.x < items ? src[i] : -1, slots + i * kThreads);
        }
    }
    load_row_sources<kGather>(a, (int)blockIdx.x + step, items, src);      /* item 1's */
    load_row_sources<kGather>(a, (int)blockIdx.x + 2 * step, items, src_next); /* item 2's */

#pragma unroll 1
    for (int item = (int)blockIdx.x; item < items; item += step) {
        const tile_thread t = rowcol_stream_tile<kGather>(a, item);
        const int next = item + step;
        const tile_thread tn = rowcol_stream_tile<kGather>(a, next < items ? next : item);
        /* the next item's weights (its sources arrived an item ago) */
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w_next[i] = weighted && src[i] >= 0 && src[i] < a.gather.src_limit ? __ldg(a.gather.w + src[i]) : 1.f;
        uint32_t w[8][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            stream_wait<7>(); /* row i's group is the oldest of the 8 in flight */
            const uint4 v = stream_read(slots + i * kThreads);
            w[i][0] = v.x;
            w[i][1] = v.y;
            w[i][2] = v.z;
            w[i][3] = v.w;
            if (weighted) /* a padding row is zeros times 1: still zeros (load_block) */
#pragma unroll
                for (int k = 0; k < 4; ++k) w[i][k] = mok_gathered::scaled_pair(w[i][k], w_cur[i]);
            /* NOTE: after the uses of v above (see the file comment); past the last item: an empty group */
            if (next < items) issue_rowcol_row<kGather>(a, tn, src[i], slots + i * kThreads);
            else stream_commit();
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            w_cur[i] = w_next[i];
            src[i] = src_next[i];
        }
        load_row_sources<kGather>(a, item + 3 * step, items, src_next);
        quantize_tile_block<128, false, true, true>(a, t, w, s);
    }
    stream_wait<0>();
}

/* CTAs of a quantize_rowcol_stream_kernel launch: resident CTAs, or fewer tiles. */
static inline int64_t rowcol_stream_grid(int64_t M, int64_t N, int ctas_per_sm, int sms) {
    const int64_t tiles = tile_count(M, N), resident = (int64_t)ctas_per_sm * sms;
    return tiles < resident ? tiles : resident;
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_ROWCOL_STREAM_CUH */
