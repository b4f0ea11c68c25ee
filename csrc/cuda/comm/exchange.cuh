/*
 * The exchange protocol shared by dispatch and combine (mok_ep_cuda.h describes the buffers, the
 * flag words and the six steps). A kernel instantiates mok_ep_exchange_kernel<Op> with an Op that
 * provides the data movement of its direction:
 *
 *   __device__ const mok_ep_comm& comm() const;
 *   __device__ void send(int local, int me) const;                       step 2: rows to peers
 *   __device__ void receive(int local, int me, const int64_t* count) const;  step 5: rows out
 *
 * `local` is the index of the rank among the launch's stacked ranks (blockIdx.y), `me` its rank
 * in the group; `count[s]` the rows source s sent this call (COUNT words, read after the wait).
 */
#ifndef MOK_CUDA_COMM_EXCHANGE_CUH
#define MOK_CUDA_COMM_EXCHANGE_CUH

#include <stdint.h>
#include <cuda_runtime.h>

#include "../mok_ep_cuda.h"
#include "flags.cuh"

enum {
    MOK_EP_WARPS = MOK_EP_THREADS / 32,
};

/* Flag word offsets (x world). */
__device__ __forceinline__ int64_t mok_ep_ready(int W) { return 0 * (int64_t)W; }
__device__ __forceinline__ int64_t mok_ep_free(int W) { return 1 * (int64_t)W; }
__device__ __forceinline__ int64_t mok_ep_count(int W) { return 2 * (int64_t)W; }
__device__ __forceinline__ int64_t mok_ep_epoch(int W) { return 3 * (int64_t)W; }
__device__ __forceinline__ int64_t mok_ep_arrive(int W) { return 3 * (int64_t)W + 1; }

__device__ __forceinline__ char* mok_ep_buf(const mok_ep_comm& c, int r) {
    return reinterpret_cast<char*>(c.table[r]);
}
__device__ __forceinline__ uint64_t* mok_ep_flags(const mok_ep_comm& c, int r) {
    return reinterpret_cast<uint64_t*>(c.table[c.world + r]);
}
/* Slot metadata (local expert ids) of rank r's buffer. */
__device__ __forceinline__ int32_t* mok_ep_meta(const mok_ep_comm& c, int r) {
    return reinterpret_cast<int32_t*>(mok_ep_buf(c, r));
}
/* Row `slot` of rank r's receive space. */
__device__ __forceinline__ char* mok_ep_slot(const mok_ep_comm& c, int r, int64_t slot) {
    return mok_ep_buf(c, r) + mok_ep_meta_bytes(c.world, c.capacity) + slot * c.row_bytes;
}

/* Error record words: plain stores of constants (host-memory atomics are not portable). */
__device__ __forceinline__ void mok_ep_set_error(const mok_ep_comm& c, int word, int32_t value) {
    volatile int32_t* rec = reinterpret_cast<volatile int32_t*>(c.table[2 * c.world]);
    rec[word] = value;
    __threadfence_system();
}

__device__ __forceinline__ void mok_ep_record_timeout(const mok_ep_comm& c, int me, int peer) {
    mok_ep_set_error(c, MOK_EP_ERR_RANK, me + 1);
    mok_ep_set_error(c, MOK_EP_ERR_PEER, peer + 1);
    mok_ep_set_error(c, MOK_EP_ERR_TIMEOUT, 1);
}

/* One warp copies (or zeroes) one row. vec: row_bytes and every base pointer are 16-byte aligned. */
__device__ __forceinline__ void mok_ep_warp_copy(char* dst, const char* src, int64_t bytes, bool vec, int lane) {
    if (vec) {
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (int64_t i = lane; i < bytes / 16; i += 32) {
            d[i] = s[i];
        }
    } else {
        for (int64_t i = lane; i < bytes; i += 32) {
            dst[i] = src[i];
        }
    }
}

__device__ __forceinline__ void mok_ep_warp_zero(char* dst, int64_t bytes, bool vec, int lane) {
    if (vec) {
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (int64_t i = lane; i < bytes / 16; i += 32) {
            d[i] = make_uint4(0u, 0u, 0u, 0u);
        }
    } else {
        for (int64_t i = lane; i < bytes; i += 32) {
            dst[i] = 0;
        }
    }
}

/* The six steps of one call (mok_ep_cuda.h). Grid (blocks, ranks), MOK_EP_THREADS threads. */
template <class Op>
__global__ void __launch_bounds__(MOK_EP_THREADS) mok_ep_exchange_kernel(const Op op) {
    const mok_ep_comm& c = op.comm();
    const int W = c.world;
    const int local = (int)blockIdx.y;
    const int me = c.rank_base + local;
    const uint64_t nb = gridDim.x;
    const int t = (int)threadIdx.x;
    uint64_t* mine = mok_ep_flags(c, me);

    __shared__ int s_failed;
    __shared__ int64_t s_count[MOK_EP_MAX_WORLD];
    if (t == 0) {
        s_failed = 0;
    }
    // NOTE: EPOCH was written by the previous call's last block; kernel boundaries order it.
    const uint64_t e = mok_ld_relaxed_sys_u64(mine + mok_ep_epoch(W)) + 1;
    const uint64_t deadline = mok_globaltimer_ns() + c.timeout_ns;
    __syncthreads();

    // 1. every destination has finished reading what this rank sent it last call
    if (t < W && !mok_wait_geq_u64(mine + mok_ep_free(W) + t, (e - 1) * nb, deadline)) {
        mok_ep_record_timeout(c, me, t);
        s_failed = 1;
    }
    __syncthreads();
    if (!s_failed) {
        const bool silent = me == c.silent_rank;
        // 2. rows (and metadata, counts) into the destinations' buffers
        if (!silent) {
            op.send(local, me);
        }
        __syncthreads();
        // 3. this block's rows are written: bump READY[me] in every peer
        if (!silent && t < W) {
            mok_red_release_sys_add_u64(mok_ep_flags(c, t) + mok_ep_ready(W) + me, 1);
        }
        // 4. every block of every source has written its rows for this call
        if (t < W) {
            if (mok_wait_geq_u64(mine + mok_ep_ready(W) + t, e * nb, deadline)) {
                s_count[t] = (int64_t)mok_ld_relaxed_sys_u64(mine + mok_ep_count(W) + t);
            } else {
                mok_ep_record_timeout(c, me, t);
                s_failed = 1;
            }
        }
        __syncthreads();
        if (!s_failed) {
            // 5. rows out of the receive space
            op.receive(local, me, s_count);
            __syncthreads();
            // 6. done reading: each source may overwrite its slots in the next call
            if (t < W) {
                mok_red_release_sys_add_u64(mok_ep_flags(c, t) + mok_ep_free(W) + me, 1);
            }
        }
    }
    // The last block of this rank to finish advances the epoch (every block has read it by now).
    if (t == 0) {
        const unsigned long long done =
            atomicAdd(reinterpret_cast<unsigned long long*>(mine + mok_ep_arrive(W)), 1ull) + 1ull;
        if (done == e * nb) {
            mok_st_relaxed_sys_u64(mine + mok_ep_epoch(W), e);
        }
    }
}

/* Host side: checks shared by both launchers; 0 or MOK_ERR_ARG. */
static inline int mok_ep_check_comm(const mok_ep_comm* c) {
    if (c->table == NULL || c->world < 1 || c->world > MOK_EP_MAX_WORLD || c->ranks < 1 || c->blocks < 1 ||
        c->rank_base < 0 || c->rank_base + c->ranks > c->world || c->capacity < 1 || c->row_bytes < 0 ||
        c->buf_bytes < mok_ep_buffer_bytes(c->world, c->capacity, c->row_bytes)) {
        return -1;
    }
    return 0;
}

/* True when every rank of the launch can be resident at once (spin-waits need it). */
template <class Op>
static inline bool mok_ep_fits(const mok_ep_comm* c) {
    if (c->ranks == 1) {
        return true; /* one rank per process: nothing in this launch waits for another block's start */
    }
    /* NOTE: cached once per kernel (every GPU of a node is the same model); races store equal values. */
    static int per_sm = 0;
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        (per_sm == 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mok_ep_exchange_kernel<Op>,
                                                                      MOK_EP_THREADS, 0) != cudaSuccess)) {
        (void)cudaGetLastError();
        return false;
    }
    return (int64_t)c->blocks * c->ranks <= (int64_t)sms * per_sm;
}

#endif /* MOK_CUDA_COMM_EXCHANGE_CUH */
