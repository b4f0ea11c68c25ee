/*
 * SwiGLU + quantisation with the loads streamed through shared memory (performance log v54): the
 * same outputs as swiglu_quantize_bf16_kernel (swiglu_quantize_tile.cuh), bit for bit, from a
 * persistent kernel whose inputs arrive by cp.async ahead of their use.
 *
 * Why: the per-tile kernel reaches 0.52-0.64 of the copy bandwidth with both copies (H100, v53) and
 * 0.78-0.85 with the row-wise copy alone. A CTA loads its tile, then computes, then quantises with three
 * barriers, and its loads sit in registers (24 x 16 bytes per thread at 128 registers): while a CTA
 * quantises it has nothing in flight, and only two CTAs fit an SM. Here each thread's loads go by
 * cp.async into shared memory kAhead items ahead of their use, so the next item's inputs are in flight
 * while this one is quantised.
 *
 * Measured (v54, H100, benchmarks/swiglu_quant_timing.cu): the forward at one CTA an SM, one item ahead,
 * 0.87-0.95 of the copy bandwidth against 0.67-0.73 per tile (at two CTAs an SM it spills and gains
 * nothing): the library's forward. The backward (swiglu_backward_split_stream_kernel below, v55) streams
 * per output tile at two CTAs an SM, 0.63-0.78 of copy against 0.55-0.64 per tile (its row-scaled form: v56).
 * A first backward form of the forward kernel, reading g, u and d_act once and making both halves of d_h
 * per item (6 bytes read per (r, j) instead of 10), ran at 0.40-0.48 (v54): one CTA of 8 warps could not
 * issue two tiles' gradient and quantisation per item fast enough, and the bytes it saved were mostly the
 * L2's (the per-tile grid re-reads g and d_act within about a wave). It was removed in v55 (git history has
 * it), as was its row-scaled form (0.29-0.35 of copy); the row-scaled backward is now the split kernel's (v56).
 *
 * Work item of the forward: one 128 x 128 tile of [R, I] (tile (tm, tn), row-major, item += gridDim.x),
 * reading g and u and writing act's tile.
 *
 * Slots (forward): thread t's slot for (set, row i of its 8 x 8 block, input in) at ((set * 8 + i) * kIn + in) *
 * kThreads + t, so a warp's 32 slots are 512 consecutive bytes (no bank conflicts either way). Each row
 * is one commit group, so exactly 8 * kAhead groups are in flight at every row's start (an exhausted
 * stream commits empty ones) and cp.async.wait_group(8 * kAhead - 1) completes the row's. A row's slots
 * are refilled after the values computed from them: the refill is issued after instructions that
 * depend on the slots' loads, so those loads have read the slots before a copy can write them (each
 * thread reads only the slots it fills, so no barrier is involved).
 */
#ifndef MOK_CUDA_QUANT_SWIGLU_QUANTIZE_STREAM_CUH
#define MOK_CUDA_QUANT_SWIGLU_QUANTIZE_STREAM_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "stream_copies.cuh"
#include "swiglu_quantize_tile.cuh"

namespace mok_qtile {

/* Dynamic shared memory of the streamed forward: kAhead items' inputs (g and u: two 16-byte slots per row
 * and thread). */
static inline size_t stream_smem_bytes(int ahead) { return (size_t)ahead * 8 * 2 * kThreads * 16; }

/* The thread's rows of one item for its loads: row pointers and how many of its 8 rows lie inside R
 * (-1: no such item, the stream is exhausted). */
struct item_rows {
    const __nv_bfloat16* g;  /* h + r0 * 2I + c: the block's first g row (u is I further) */
    const __nv_bfloat16* da; /* d_act + r0 * I + c (backward) */
    const float* s;          /* row_scale + r0 (the row-scaled backward) */
    int rows;
};

template <bool kBackward>
__device__ __forceinline__ item_rows item_rows_of(const swiglu_tile_args& sw, int nbn, int items, int item) {
    item_rows r;
    r.g = sw.h;
    r.da = sw.d_act;
    r.s = nullptr;
    r.rows = -1;
    if (item >= items) return r;
    const int tm = item / nbn, tn = item - tm * nbn;
    const int64_t r0 = (int64_t)tm * kTile + 8 * ((int)threadIdx.x / kPieces);
    const int64_t c = (int64_t)tn * kTile + 8 * ((int)threadIdx.x % kPieces);
    r.rows = (int)(sw.R - r0 > 8 ? 8 : sw.R - r0); /* >= 1 for an item's first row, may be <= 0 for others */
    r.rows = r.rows < 0 ? 0 : r.rows;
    r.g = sw.h + r0 * 2 * sw.I + c;
    if (kBackward) r.da = sw.d_act + r0 * sw.I + c;
    if (kBackward) r.s = sw.row_scale + r0;
    return r;
}

/* The forward's row i loads (g, u) into its two slots (u's at slots[kThreads]) and one commit; rows past
 * R are zero-filled without reading, and an exhausted stream commits an empty group. */
__device__ __forceinline__ void issue_forward_row(const item_rows& r, const swiglu_tile_args& sw, int i, uint4* slots) {
    if (r.rows >= 0) {
        const bool live = i < r.rows; /* else src is not read: h's first element stands in for it */
        const __nv_bfloat16* g = live ? r.g + i * 2 * sw.I : sw.h;
        stream_copy16(slots, g, live);
        stream_copy16(slots + kThreads, live ? g + sw.I : sw.h, live);
    }
    stream_commit();
}

/* The forward: act [R, I] from h, its copies as swiglu_quantize_bf16_kernel<false, kRows, kCols, ., kScaled>
 * makes them (a: act's tile_args, M = R, N = I). Grid: at most one CTA per item (tile of [R, I]),
 * persistent over items (the launcher sizes it to the resident CTAs); dynamic shared memory
 * stream_smem_bytes(kAhead). Each thread's loads run kAhead items ahead of its compute: item k's row i
 * sits in slot set k % kAhead, and once computed the set's row i is refilled with item k + kAhead's.
 * kMinBlocks: CTAs per SM the registers must allow. */
template <bool kRows, bool kCols, bool kScaled, int kAhead, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) swiglu_quantize_stream_kernel(const tile_args a,
                                                                                      const swiglu_tile_args sw) {
    enum { kIn = 2, kSetSlots = 8 * kIn * kThreads };
    __shared__ rowcol_smem<128> s;
    __shared__ float s_scale[kScaled ? kTile : 1]; /* kScaled: the item's row scales */
    uint4* const fifo = stream_fifo() + threadIdx.x;
    const int nbn = (int)(sw.I / kTile), items = (int)((sw.R + kTile - 1) / kTile) * nbn;
    const int step = (int)gridDim.x;

#pragma unroll 1
    for (int k = 0; k < kAhead; ++k) {
        const item_rows r = item_rows_of<false>(sw, nbn, items, (int)blockIdx.x + k * step);
#pragma unroll 1
        for (int i = 0; i < 8; ++i) issue_forward_row(r, sw, i, fifo + k * kSetSlots + i * kIn * kThreads);
    }

    /* kScaled: thread t < 128 holds the next item's scale of row t (loaded an item ahead) */
    const auto scale_of = [&](int item) {
        const int64_t r = (int64_t)(item / nbn) * kTile + (int64_t)threadIdx.x;
        return item < items && threadIdx.x < kTile && r < sw.R ? __ldg(sw.row_scale + r) : 0.f;
    };
    float next_scale = kScaled ? scale_of((int)blockIdx.x) : 0.f;

    int set = 0;
#pragma unroll 1
    for (int item = (int)blockIdx.x; item < items; item += step) {
        const int tm = item / nbn, tn = item - tm * nbn;
        const tile_thread t = tile_thread_at(a, tm, tn); /* t.c: the column in [0, I) */
        if (kScaled) {
            __syncthreads(); /* the previous item's readers of s_scale are done */
            if (threadIdx.x < kTile) s_scale[threadIdx.x] = next_scale;
            __syncthreads();
            next_scale = scale_of(item + step);
        }
        const float* sc = s_scale + 8 * t.g;
        const item_rows next = item_rows_of<false>(sw, nbn, items, item + kAhead * step);
        uint4* const slots = fifo + set * kSetSlots;
        uint32_t w[8][4]; /* act */
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            stream_wait<8 * kAhead - 1>(); /* row i's group is the oldest of the 8 kAhead in flight */
            uint4* const row = slots + i * kIn * kThreads;
            swiglu_row_words<false>(stream_read(row), stream_read(row + kThreads), make_uint4(0u, 0u, 0u, 0u), false,
                                    w[i]);
            /* NOTE: after the packs above, which depend on the row's slot loads (see the file comment) */
            issue_forward_row(next, sw, i, row);
        }
        set = set + 1 == kAhead ? 0 : set + 1;
        if (sw.out != 0) store_block(sw.out + t.r0 * a.N + t.c, a.N, t.rows, w);
        if (kScaled && kCols) quantize_act_and_z<kRows>(a, t, w, s, sc);
        else quantize_tile_block<128, false, kRows, kCols>(a, t, w, s);
    }
    stream_wait<0>(); /* nothing in flight when the CTA exits (only empty groups are left by now) */
}

/* The library's backward (v55; its row-scaled form v56): streamed per output tile, as the per-tile kernel divides
 * it (a d_gate tile reads g, u and d_act, a d_up tile g and d_act), at two CTAs an SM (121-126 registers, 16 warps
 * an SM as the per-tile kernel has) with each thread's loads kDepth rows ahead by cp.async. Why: the pair form
 * (both halves per item, one CTA an SM, v54) issued too slowly; this keeps the per-tile kernel's instructions and
 * warps and adds only the loads ahead. Measured (v55, H100, benchmarks/swiglu_quant_timing.cu): 0.73 / 0.63 /
 * 0.78 of copy at a 4-row ring on Qwen3 / Mixtral / DeepSeek-V3 against 0.62 / 0.55 / 0.64 per tile (6 rows
 * alike; 8 rows fit one CTA an SM only: 0.59-0.62). So the per-tile kernel was not issue-bound: its warps
 * waited on loads it could not issue early.
 * Work item: one 128 x 128 tile of d_h [R, 2I] (row-major). The CTA's rows form one sequence (item n's row i
 * is row q = 8n + i); row q sits in ring slot q % kDepth (kIn = 3 16-byte slots a row; a d_up item leaves its
 * u slot unused), and once used its slot is refilled with row q + kDepth (this item's or the next's), so
 * kDepth groups are in flight at every row's start. Why a ring and not a whole item ahead: 8 rows of three
 * inputs are 96 KiB a CTA, and two such CTAs with their 22.5 KiB of quantiser scratch do not fit an SM.
 * kScaled (swiglu_quantize_tile.cuh's row-scaled backward, v53's form): the row's scale s[r] rides in the row's
 * group (a 4-byte copy into a float ring after the 16-byte slots; why not registers: v53's per-tile kernel
 * spilled holding 8 of them), and a d_gate item's thread of piece p writes row r0 + p's partial sum of
 * d_z . act over the tile's 128 columns (each row's 8 columns, then the half-warp's butterfly, as swiglu_block).
 * 128 registers, no spills; measured (v56, H100): 0.61 / 0.59 / 0.74 of copy against the per-tile scaled
 * kernel's 0.51 / 0.45 / 0.56, and 7-21% slower than the plain form (its dot redoes act's forward).
 * Same outputs as swiglu_quantize_bf16_kernel<true, kRows, kCols, ., kScaled>. */
static inline size_t split_stream_smem_bytes(int depth, bool scaled = false) {
    return (size_t)depth * 3 * kThreads * 16 + (scaled ? (size_t)depth * kThreads * 4 : 0);
}

template <bool kRows, bool kCols, int kMinBlocks, int kDepth, bool kScaled = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) swiglu_backward_split_stream_kernel(const tile_args a,
                                                                                             const swiglu_tile_args sw) {
    static_assert(kDepth >= 1 && kDepth <= 8, "the ring holds at most one item's rows");
    enum { kIn = 3 };
    __shared__ rowcol_smem<128> s;
    uint4* const ring = stream_fifo() + threadIdx.x;
    /* kScaled: slot sl's row scale at scales[sl * kThreads] */
    float* const scales = reinterpret_cast<float*>(stream_fifo() + kDepth * kIn * kThreads) + threadIdx.x;
    const int nbn = (int)(sw.I / kTile), nbo = 2 * nbn; /* tiles along I and along d_h's columns */
    const int in_items = (int)((sw.R + kTile - 1) / kTile) * nbn; /* tiles of [R, I] */
    const int items = 2 * in_items, step = (int)gridDim.x;
    /* an item's rows: those of its tile of [R, I] (item_rows_of; rows -1 past the last item); up: a d_up tile */
    const auto rows_of = [&](int item, bool& up) {
        const int tm = item / nbo, to = item - tm * nbo;
        up = to >= nbn;
        return item_rows_of<true>(sw, nbn, in_items, item >= items ? in_items : tm * nbn + (up ? to - nbn : to));
    };
    /* row i's loads into slot sl and one commit (a d_up item's u is not loaded) */
    const auto issue = [&](const item_rows& r, bool up, int i, int sl) {
        uint4* const row = ring + sl * kIn * kThreads;
        if (r.rows >= 0) {
            const bool live = i < r.rows;
            const __nv_bfloat16* g = live ? r.g + i * 2 * sw.I : sw.h;
            stream_copy16(row, g, live);
            if (!up) stream_copy16(row + kThreads, live ? g + sw.I : sw.h, live);
            stream_copy16(row + 2 * kThreads, live ? r.da + i * sw.I : sw.h, live);
            if (kScaled) stream_copy4(scales + sl * kThreads, live ? r.s + i : sw.row_scale, live);
        }
        stream_commit();
    };
    bool up;
    item_rows cur = rows_of((int)blockIdx.x, up);
#pragma unroll 1
    for (int i = 0; i < kDepth; ++i) issue(cur, up, i, i);
    int slot0 = 0; /* the ring slot of the item's row 0 */
#pragma unroll 1
    for (int item = (int)blockIdx.x; item < items; item += step) {
        const int tm = item / nbo, to = item - tm * nbo;
        const tile_thread t = tile_thread_at(a, tm, to); /* in d_h */
        bool next_up;
        const item_rows next = rows_of(item + step, next_up);
        uint32_t w[8][4];
        float mine = 0.f; /* kScaled d_gate: row r0 + t.p's partial sum */
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            stream_wait<kDepth - 1>(); /* row i's group is the oldest of the kDepth in flight */
            int sl = slot0 + i;
            while (sl >= kDepth) sl -= kDepth;
            uint4* const row = ring + sl * kIn * kThreads;
            const uint4 gq = stream_read(row), dq = stream_read(row + 2 * kThreads);
            const uint4 uq = up ? make_uint4(0u, 0u, 0u, 0u) : stream_read(row + kThreads); /* d_up: u unused */
            const float si = kScaled ? stream_read_f32(scales + sl * kThreads) : 1.f;
            const float dot = swiglu_row_words<true, kScaled>(gq, uq, dq, up, w[i], si);
            if (kScaled && !up) { /* up is the CTA's: every lane runs the shuffles */
                const float sum = row_band_sum(dot);
                if (t.p == i) mine = sum;
            }
            /* NOTE: after the packs above, which depend on the row's slot loads; row q + kDepth */
            if (i + kDepth < 8) issue(cur, up, i + kDepth, sl);
            else issue(next, next_up, i + kDepth - 8, sl);
        }
        if (kScaled && !up && t.p < t.rows) sw.d_s_part[(int64_t)to * sw.R + t.r0 + t.p] = mine;
        slot0 = (slot0 + 8) % kDepth;
        cur = next;
        up = next_up;
        if (sw.out != 0) store_block(sw.out + t.r0 * a.N + t.c, a.N, t.rows, w);
        quantize_tile_block<128, false, kRows, kCols>(a, t, w, s);
    }
    stream_wait<0>();
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_SWIGLU_QUANTIZE_STREAM_CUH */
