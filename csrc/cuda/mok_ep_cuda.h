/*
 * mok expert-parallel exchange launchers: the C ABI between csrc/torch/ep_ops.cpp and
 * csrc/cuda/ep_{dispatch,combine}.cu. No torch types here.
 *
 * A launch serves `ranks` ranks of a group of `world` (ranks == 1: one rank per process, real
 * symmetric memory; ranks == world: virtual ranks in one process), rank = rank_base + blockIdx.y,
 * `blocks` blocks per rank (gridDim.x). Every rank must use the same `blocks`. With virtual ranks,
 * world * blocks must not exceed what the GPU holds at once (SMs), or the spin-waits could wait for
 * blocks that never start.
 *
 * Pointer table (int64 [2 * world + 1], device memory):
 *   table[r]             rank r's exchange buffer (mok_ep_buffer_bytes bytes, see below)
 *   table[world + r]     rank r's flag words (MOK_EP_FLAG_WORDS(world) uint64, zero at creation)
 *   table[2 * world]     the host-mapped error record (int32 [MOK_EP_ERR_WORDS])
 *
 * Exchange buffer of one rank (C = capacity rows per (source, destination) pair):
 *   [0, meta)            int32 [world * C]: local expert id of each received slot (dispatch only)
 *   [meta, ...)          world * C rows of row_bytes: slot s * C + j holds the j-th row from rank s
 *   meta = round_up(world * C * 4, 256)
 *
 * Flag words of rank r (uint64; counters only grow, "epoch" e = number of calls so far):
 *   [0, W)        READY[s]  += 1 by each block of source s once its rows for r are written
 *   [W, 2W)       FREE[d]   += 1 by each block of destination d once it finished reading what r sent
 *   [2W, 3W)      COUNT[s]  rows source s sent for the current call (written before READY)
 *   [3W]          EPOCH     calls completed by rank r (advanced by the kernel's last block)
 *   [3W + 1]      ARRIVE    blocks of rank r that finished a call (monotonic)
 *
 * Protocol of one call, epoch e (every wait bounded by timeout_us; on timeout the block records
 * (rank, peer) in the error record, skips the rest and exits):
 *   1. wait FREE[d] >= (e - 1) * blocks for every destination d (its buffer is free to overwrite);
 *   2. write rows (and slot metadata, counts) into the destinations' buffers;
 *   3. __syncthreads(), then red.release.sys READY[me] += 1 in every peer (per-block ready counter);
 *   4. wait (ld.acquire.sys) READY[s] >= e * blocks for every source s;
 *   5. copy the received rows out of the buffer into the op's output (gathering as the op needs);
 *   6. __syncthreads(), then red.release.sys FREE[me] += 1 in every source.
 */
#ifndef MOK_EP_CUDA_H
#define MOK_EP_CUDA_H

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Destination codes of the layout besides a rank (mok/ep.py DST_*). */
enum {
    MOK_EP_DST_NONE = -1,     /* not routed: nothing sent */
    MOK_EP_DST_BAD_ID = -2,   /* expert id >= E: nothing sent, MOK_EP_ERR_BAD_ID recorded */
    MOK_EP_DST_OVERFLOW = -3, /* beyond the capacity: nothing sent, MOK_EP_ERR_OVERFLOW recorded */
};

/* Host-mapped error record, int32 words (plain stores of constants: no host-memory atomics). */
enum {
    MOK_EP_ERR_TIMEOUT = 0,   /* 1 when some wait timed out */
    MOK_EP_ERR_RANK = 1,      /* rank + 1 of a rank that timed out */
    MOK_EP_ERR_PEER = 2,      /* peer + 1 it waited for */
    MOK_EP_ERR_BAD_ID = 3,    /* 1 when a pair had an expert id >= E */
    MOK_EP_ERR_OVERFLOW = 4,  /* 1 when a pair exceeded the capacity */
    MOK_EP_ERR_WORDS = 8,
};

#ifdef __CUDACC__
#define MOK_EP_HD __host__ __device__
#else
#define MOK_EP_HD
#endif

#define MOK_EP_FLAG_WORDS(world) (3 * (int64_t)(world) + 2)
#define MOK_EP_MAX_WORLD 64
#define MOK_EP_THREADS 256

static inline MOK_EP_HD int64_t mok_ep_meta_bytes(int64_t world, int64_t capacity) {
    return (world * capacity * 4 + 255) / 256 * 256;
}
static inline MOK_EP_HD int64_t mok_ep_buffer_bytes(int64_t world, int64_t capacity, int64_t row_bytes) {
    return mok_ep_meta_bytes(world, capacity) + world * capacity * row_bytes;
}

/* What every exchange launch shares. */
struct mok_ep_comm {
    const int64_t* table; /* device pointer table, see above */
    int world, ranks, rank_base, blocks;
    int64_t capacity;   /* C */
    int64_t row_bytes;  /* bytes of one row (H * element size) */
    int64_t buf_bytes;  /* bytes of each rank's exchange buffer (>= mok_ep_buffer_bytes) */
    uint64_t timeout_ns;
    int silent_rank;    /* debug: this rank sends nothing and never signals READY (-1: none) */
};

/* Dispatch: pair p of local rank i (global rank_base + i) with dst[i][p] >= 0 sends row
 * src[i][p / src_div] to slot (me * C + pos[i][p]) of rank dst[i][p], with its local expert id.
 * Outputs (local ranks i): recv [ranks, W * C, row] (zero rows in empty slots), recv_eid
 * [ranks, W * C] (-1 in empty slots), recv_counts [ranks, W] (rows received from each source). */
struct mok_ep_dispatch_args {
    struct mok_ep_comm comm;
    const void* src;        /* [ranks, src_rows, row_bytes] */
    int64_t src_rows, pairs, src_div;
    const int32_t* dst;     /* [ranks, pairs] */
    const int32_t* pos;     /* [ranks, pairs] */
    const int32_t* eid;     /* [ranks, pairs] */
    const int32_t* counts;  /* [ranks, W]: pairs sent to each destination */
    void* recv;
    int32_t* recv_eid;
    int32_t* recv_counts;
};
int mok_ep_dispatch_cuda(const struct mok_ep_dispatch_args* args, cudaStream_t stream);

/* Combine: slot s * C + j (j < recv_counts[i][s]) of local rank i's rows goes back to slot
 * (me * C + j) of rank s; out[i][p] = the row of pair p (zero when dst[i][p] < 0). */
struct mok_ep_combine_args {
    struct mok_ep_comm comm;
    const void* rows;           /* [ranks, W * C, row_bytes] */
    const int32_t* recv_counts; /* [ranks, W] */
    int64_t pairs;
    const int32_t* dst;         /* [ranks, pairs] */
    const int32_t* pos;         /* [ranks, pairs] */
    void* out;                  /* [ranks, pairs, row_bytes] */
};
int mok_ep_combine_cuda(const struct mok_ep_combine_args* args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MOK_EP_CUDA_H */
