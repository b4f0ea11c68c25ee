/*
 * Expert-parallel combine (mok_ep_cuda.h): each full slot s * C + j of a rank's expert outputs is
 * pushed back to slot (me * C + j) of its source s; the source then gathers one row per (token, k)
 * pair in its own order (zero rows for pairs that were not routed). The K-sum happens after this
 * kernel, on the source (mok.ops.combine), in k order.
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "comm/exchange.cuh"
#include "common/launch.cuh"
#include "mok_ep_cuda.h"

namespace {

struct mok_ep_combine_op {
    mok_ep_combine_args a;
    bool vec;

    __device__ const mok_ep_comm& comm() const { return a.comm; }

    // Step 2: one warp per full slot, slots strided over the rank's blocks.
    __device__ void send(int local, int me) const {
        const mok_ep_comm& c = a.comm;
        const int lane = (int)threadIdx.x % 32;
        const int64_t warp = (int64_t)blockIdx.x * MOK_EP_WARPS + (int64_t)threadIdx.x / 32;
        const int64_t stride = (int64_t)gridDim.x * MOK_EP_WARPS;
        const int64_t slots = (int64_t)c.world * c.capacity;
        const char* rows = static_cast<const char*>(a.rows) + (int64_t)local * slots * c.row_bytes;
        const int32_t* counts = a.recv_counts + (int64_t)local * c.world;
        for (int64_t i = warp; i < slots; i += stride) {
            const int s = (int)(i / c.capacity);
            const int64_t j = i % c.capacity;
            if (j >= counts[s]) {
                continue;
            }
            mok_ep_warp_copy(mok_ep_slot(c, s, (int64_t)me * c.capacity + j), rows + i * c.row_bytes, c.row_bytes,
                             vec, lane);
        }
    }

    // Step 5: one warp per (token, k) pair of this rank.
    __device__ void receive(int local, int me, const int64_t* count) const {
        (void)me;
        (void)count;
        const mok_ep_comm& c = a.comm;
        const int lane = (int)threadIdx.x % 32;
        const int64_t warp = (int64_t)blockIdx.x * MOK_EP_WARPS + (int64_t)threadIdx.x / 32;
        const int64_t stride = (int64_t)gridDim.x * MOK_EP_WARPS;
        const int64_t base = (int64_t)local * a.pairs;
        char* out = static_cast<char*>(a.out) + base * c.row_bytes;
        const int mine = c.rank_base + local;
        for (int64_t p = warp; p < a.pairs; p += stride) {
            const int d = a.dst[base + p];
            if (d >= 0) {
                const int64_t slot = (int64_t)d * c.capacity + a.pos[base + p];
                mok_ep_warp_copy(out + p * c.row_bytes, mok_ep_slot(c, mine, slot), c.row_bytes, vec, lane);
            } else {
                mok_ep_warp_zero(out + p * c.row_bytes, c.row_bytes, vec, lane);
            }
        }
    }
};

bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

}  // namespace

extern "C" int mok_ep_combine_cuda(const struct mok_ep_combine_args* args, cudaStream_t stream) {
    MOK_CHECK_ARG(args != NULL);
    const mok_ep_comm* c = &args->comm;
    MOK_CHECK_ARG(mok_ep_check_comm(c) == 0);
    MOK_CHECK_ARG(args->pairs >= 0 && args->rows != NULL && args->recv_counts != NULL);
    MOK_CHECK_ARG((args->dst != NULL && args->pos != NULL && args->out != NULL) || args->pairs == 0);
    MOK_CHECK_ARG(mok_ep_fits<mok_ep_combine_op>(c));
    mok_ep_combine_op op;
    op.a = *args;
    op.vec = c->row_bytes % 16 == 0 && aligned16(args->rows) && (args->out == NULL || aligned16(args->out));
    const dim3 grid((unsigned)c->blocks, (unsigned)c->ranks);
    mok_ep_exchange_kernel<mok_ep_combine_op><<<grid, MOK_EP_THREADS, 0, stream>>>(op);
    return mok_launch_status();
}
