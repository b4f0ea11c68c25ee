/*
 * The routing plan's kernels (mok_plan_build in mok_core.h; launcher: plan_build.cu), deterministic, no host
 * sync, no atomics. Kept in a header of its own so that the CPU emulation (tests/emu/plan_emu.cpp) runs the
 * same kernels in the same order (plan_build_launches) against the C core.
 *
 * The flat pairs p = t * K + k (TK = T * K of them) are cut into chunks of PLAN_CHUNK pairs;
 * NC = ceil(TK / PLAN_CHUNK). Workspace: int32 ws[E][NC] (expert-major), the count of expert e in
 * chunk c, turned in place into the exclusive prefix over chunks.
 *
 *   kernel 0  plan_fill_kernel        src_of_row[0, capacity) = -1 (padding and unused rows)
 *   kernel 1  plan_hist_kernel        one block per chunk: ws[e][c] = count of e in chunk c; flags
 *                                      invalid ids into the host-mapped error word
 *   kernel 2  plan_scan_chunks_kernel one warp per expert: exclusive scan of ws[e][:], counts[e]
 *   kernel 3  plan_offsets_kernel     one block: offsets[e] = sum_{e' < e} round_up(counts[e'], tile),
 *                                      offsets[E], num_skipped = TK - sum counts
 *   kernel 4  plan_assign_kernel      one block per chunk: row of pair p = offsets[e] + ws[e][c]
 *                                      + (number of earlier pairs of e in the chunk); row_of, src_of_row
 *
 * Rows of an expert therefore hold its pairs in increasing p order, independent of scheduling.
 */
#ifndef MOK_CUDA_PLAN_PLAN_BUILD_CUH
#define MOK_CUDA_PLAN_PLAN_BUILD_CUH

#include <stdint.h>
#include <cuda_runtime.h>

#include "../mok_cuda.h"
#include "../common/launch.cuh"

namespace mok_plan {

enum { PLAN_CHUNK = 256, PLAN_THREADS = 256, PLAN_SCAN_THREADS = 1024 };
static_assert(PLAN_CHUNK == PLAN_THREADS, "one thread per pair of a chunk");

struct plan_params {
    const int32_t* topk_idx;
    int64_t TK, E, NC, tile, capacity;
    int skip_invalid;
    int32_t* counts;
    int32_t* offsets;
    int32_t* row_of;
    int32_t* src_of_row;
    int32_t* num_skipped;
    int32_t* ws;
    int32_t* error_flag;
};

/* ---- kernel 0: every row starts as padding ---- */
__global__ void __launch_bounds__(PLAN_THREADS) plan_fill_kernel(int32_t* __restrict__ src_of_row, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        src_of_row[i] = -1;
    }
}

/* Load chunk c's ids into ids[] (-1 for invalid ids and for slots past TK); returns this thread's id. */
__device__ __forceinline__ int32_t plan_load_chunk(const plan_params& p, int64_t c, int32_t* ids, bool* invalid) {
    const int64_t pair = c * PLAN_CHUNK + threadIdx.x;
    int32_t id = -1;
    *invalid = false;
    if (pair < p.TK) {
        id = p.topk_idx[pair];
        if (id < 0 || (int64_t)id >= p.E) {
            id = -1;
            *invalid = true;
        }
    }
    ids[threadIdx.x] = id;
    return id;
}

/* ---- kernel 1: per-chunk per-expert histogram ---- */
__global__ void __launch_bounds__(PLAN_THREADS) plan_hist_kernel(plan_params p) {
    __shared__ int32_t ids[PLAN_CHUNK];
    const int64_t c = blockIdx.x;
    bool invalid;
    const int32_t id = plan_load_chunk(p, c, ids, &invalid);

    /* ---- zero this chunk's column, then each expert's first pair writes the count ---- */
    for (int64_t e = threadIdx.x; e < p.E; e += blockDim.x) {
        p.ws[e * p.NC + c] = 0;
    }
    /* NOTE: the barrier orders the zeroing stores before the count stores of other threads of the
     * block, makes ids[] visible, and tells whether any pair of the chunk must be reported. */
    const int report = __syncthreads_or(invalid && !p.skip_invalid && p.error_flag != NULL);

    /* ---- report invalid ids: one store per chunk into the host-mapped error word ----
     * NOTE: not an atomic: system-scope atomics on host memory need hostNativeAtomicSupported,
     * which PCIe-attached GPUs lack. A volatile read-OR-write and a system fence; concurrent
     * writers can only race on other bits, and MOK_DEVICE_ERR_EXPERT_ID is set by every one. */
    if (report && threadIdx.x == 0) {
        volatile int32_t* flag = p.error_flag;
        *flag = *flag | (int32_t)MOK_DEVICE_ERR_EXPERT_ID;
        __threadfence_system();
    }
    if (id >= 0) {
        bool first = true;
        int32_t n = 0;
        for (int j = 0; j < PLAN_CHUNK; ++j) {
            /* NOTE: all threads read ids[j] together: a shared-memory broadcast. */
            const int32_t v = ids[j];
            if (v == id) {
                first = first && j >= (int)threadIdx.x;
                ++n;
            }
        }
        if (first) {
            p.ws[(int64_t)id * p.NC + c] = n;
        }
    }
}

/* ---- kernel 2: per expert, exclusive scan over the chunks: one warp per expert, 32 chunks per step
 * (coalesced; integer sums, so the order of additions does not change the result) ----
 * NOTE: one serial thread per expert read ws[e][:] with a stride of NC between the lanes of a warp
 * and took 0.1 ms on the Qwen3-30B-A3B shape (512 chunks, 128 experts), measured. */
__global__ void __launch_bounds__(PLAN_THREADS) plan_scan_chunks_kernel(plan_params p) {
    const int lane = threadIdx.x & 31;
    const int64_t e = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (e >= p.E) {
        return;
    }
    int32_t* __restrict__ col = p.ws + e * p.NC;
    int32_t run = 0;
    for (int64_t c0 = 0; c0 < p.NC; c0 += 32) {
        const int64_t c = c0 + lane;
        const int32_t v = c < p.NC ? col[c] : 0;
        int32_t incl = v;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int32_t up = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += up;
        }
        if (c < p.NC) col[c] = run + incl - v;
        run += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) p.counts[e] = run;
}

/* ---- kernel 3: padded expert offsets (one block) ---- */
__global__ void __launch_bounds__(PLAN_SCAN_THREADS) plan_offsets_kernel(plan_params p) {
    __shared__ int64_t part_rows[PLAN_SCAN_THREADS];
    __shared__ int64_t part_pairs[PLAN_SCAN_THREADS];
    const int64_t per = (p.E + PLAN_SCAN_THREADS - 1) / PLAN_SCAN_THREADS;
    const int64_t e_lo = (int64_t)threadIdx.x * per;
    const int64_t e_hi = e_lo + per < p.E ? e_lo + per : p.E;

    /* ---- phase 1: each thread sums the padded counts of its contiguous experts ---- */
    int64_t rows = 0, pairs = 0;
    for (int64_t e = e_lo; e < e_hi; ++e) {
        const int64_t n = p.counts[e];
        rows += (n + p.tile - 1) / p.tile * p.tile;
        pairs += n;
    }
    part_rows[threadIdx.x] = rows;
    part_pairs[threadIdx.x] = pairs;
    __syncthreads();

    /* ---- phase 2: exclusive scan of the partials (thread 0, serial; integer sums are exact) ---- */
    if (threadIdx.x == 0) {
        int64_t run_rows = 0, run_pairs = 0;
        for (int i = 0; i < PLAN_SCAN_THREADS; ++i) {
            const int64_t r = part_rows[i], q = part_pairs[i];
            part_rows[i] = run_rows;
            run_rows += r;
            run_pairs += q;
        }
        p.offsets[p.E] = (int32_t)run_rows;
        p.num_skipped[0] = (int32_t)(p.TK - run_pairs);
    }
    __syncthreads();

    /* ---- phase 3: each thread writes the offsets of its experts ---- */
    int64_t run = part_rows[threadIdx.x];
    for (int64_t e = e_lo; e < e_hi; ++e) {
        p.offsets[e] = (int32_t)run;
        const int64_t n = p.counts[e];
        run += (n + p.tile - 1) / p.tile * p.tile;
    }
}

/* ---- kernel 4: rows of the pairs, in increasing pair order within each expert ---- */
__global__ void __launch_bounds__(PLAN_THREADS) plan_assign_kernel(plan_params p) {
    __shared__ int32_t ids[PLAN_CHUNK];
    const int64_t c = blockIdx.x;
    const int64_t pair = c * PLAN_CHUNK + threadIdx.x;
    bool invalid;
    const int32_t id = plan_load_chunk(p, c, ids, &invalid);
    __syncthreads();
    if (pair >= p.TK) {
        return;
    }
    if (id < 0) {
        /* skipped pair (invalid id): no row */
        p.row_of[pair] = -1;
        return;
    }
    /* ---- rank among the earlier pairs of the same expert in this chunk ---- */
    int32_t rank = 0;
    for (int j = 0; j < (int)threadIdx.x; ++j) {
        rank += ids[j] == id ? 1 : 0;
    }
    const int64_t row = (int64_t)p.offsets[id] + (int64_t)p.ws[(int64_t)id * p.NC + c] + rank;
    p.row_of[pair] = (int32_t)row;
    /* NOTE: row < offsets[E] <= capacity: the launcher checked capacity >= mok_plan_capacity. */
    p.src_of_row[row] = (int32_t)pair;
}

/* mok_plan_capacity of the core, recomputed here (the CUDA library does not link the core). */
inline int64_t plan_capacity(int64_t TK, int64_t E, int64_t tile) {
    if (TK == 0) {
        return 0;
    }
    const int64_t busy = E < TK ? E : TK;
    return (TK + busy * (tile - 1) + tile - 1) / tile * tile;
}


/* The plan's launches in stream order, each as launch(kernel, grid, block, kernel arguments...): the
 * launcher's <<<>>> on its stream, the emulation's run of every CTA. */
template <class Launch>
void plan_build_launches(const plan_params& p, Launch&& launch) {
    /* ---- kernel 0: src_of_row = -1 (stream order puts it before kernel 4's stores) ---- */
    if (p.capacity > 0) {
        launch(plan_fill_kernel, mok_grid_stride_blocks(p.capacity, PLAN_THREADS, 8), (unsigned)PLAN_THREADS,
               p.src_of_row, p.capacity);
    }
    /* ---- kernels 1-2: histogram and per-expert chunk scan (kernel 2 also covers TK == 0) ---- */
    if (p.NC > 0) {
        launch(plan_hist_kernel, (unsigned)p.NC, (unsigned)PLAN_THREADS, p);
    }
    if (p.E > 0) {
        launch(plan_scan_chunks_kernel, (unsigned)mok_ceil_div(p.E * 32, PLAN_THREADS), (unsigned)PLAN_THREADS, p);
    }
    /* ---- kernel 3: offsets, offsets[E], num_skipped ---- */
    launch(plan_offsets_kernel, 1u, (unsigned)PLAN_SCAN_THREADS, p);
    /* ---- kernel 4: row_of and src_of_row ---- */
    if (p.NC > 0) {
        launch(plan_assign_kernel, (unsigned)p.NC, (unsigned)PLAN_THREADS, p);
    }
}

}  // namespace mok_plan

#endif /* MOK_CUDA_PLAN_PLAN_BUILD_CUH */
