/*
 * Expert-parallel dispatch (mok_ep_cuda.h): every routed (token, k) pair's row is pushed into the
 * receive space of the rank owning its expert, with the expert's local id; the receiver copies
 * its W * C slots out (zero rows, id -1 in empty slots) and reports the rows per source.
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "comm/exchange.cuh"
#include "common/launch.cuh"
#include "mok_ep_cuda.h"

namespace {

struct mok_ep_dispatch_op {
    mok_ep_dispatch_args a;
    bool vec; /* 16-byte row copies */

    __device__ const mok_ep_comm& comm() const { return a.comm; }

    // Step 2: one warp per pair, pairs strided over the rank's blocks.
    __device__ void send(int local, int me) const {
        const mok_ep_comm& c = a.comm;
        const int lane = (int)threadIdx.x % 32;
        const int64_t warp = (int64_t)blockIdx.x * MOK_EP_WARPS + (int64_t)threadIdx.x / 32;
        const int64_t stride = (int64_t)gridDim.x * MOK_EP_WARPS;
        const int64_t base = (int64_t)local * a.pairs;
        const char* src = static_cast<const char*>(a.src) + (int64_t)local * a.src_rows * c.row_bytes;
        for (int64_t p = warp; p < a.pairs; p += stride) {
            const int d = a.dst[base + p];
            if (d < 0) {
                if (lane == 0 && d == MOK_EP_DST_BAD_ID) {
                    mok_ep_set_error(c, MOK_EP_ERR_BAD_ID, 1);
                } else if (lane == 0 && d == MOK_EP_DST_OVERFLOW) {
                    mok_ep_set_error(c, MOK_EP_ERR_OVERFLOW, 1);
                }
                continue;
            }
            const int64_t slot = (int64_t)me * c.capacity + a.pos[base + p];
            mok_ep_warp_copy(mok_ep_slot(c, d, slot), src + (p / a.src_div) * c.row_bytes, c.row_bytes, vec, lane);
            if (lane == 0) {
                mok_ep_meta(c, d)[slot] = a.eid[base + p];
            }
        }
        // NOTE: block 0 thread t also releases READY to peer t after the barrier, which orders
        // this count before it (the receiver reads COUNT only after acquiring every block's READY).
        if (blockIdx.x == 0 && (int)threadIdx.x < c.world) {
            const int d = (int)threadIdx.x;
            mok_st_relaxed_sys_u64(mok_ep_flags(c, d) + mok_ep_count(c.world) + me,
                                   (uint64_t)a.counts[(int64_t)local * c.world + d]);
        }
    }

    // Step 5: one warp per slot of the W * C receive space.
    __device__ void receive(int local, int me, const int64_t* count) const {
        const mok_ep_comm& c = a.comm;
        const int lane = (int)threadIdx.x % 32;
        const int64_t warp = (int64_t)blockIdx.x * MOK_EP_WARPS + (int64_t)threadIdx.x / 32;
        const int64_t stride = (int64_t)gridDim.x * MOK_EP_WARPS;
        const int64_t slots = (int64_t)c.world * c.capacity;
        char* out = static_cast<char*>(a.recv) + (int64_t)local * slots * c.row_bytes;
        const int32_t* meta = mok_ep_meta(c, me);
        for (int64_t i = warp; i < slots; i += stride) {
            const int64_t s = i / c.capacity, j = i % c.capacity;
            const bool full = j < count[s];
            if (full) {
                mok_ep_warp_copy(out + i * c.row_bytes, mok_ep_slot(c, me, i), c.row_bytes, vec, lane);
            } else {
                mok_ep_warp_zero(out + i * c.row_bytes, c.row_bytes, vec, lane);
            }
            if (lane == 0) {
                a.recv_eid[(int64_t)local * slots + i] = full ? meta[i] : -1;
            }
        }
        if (blockIdx.x == 0 && (int)threadIdx.x < c.world) {
            a.recv_counts[(int64_t)local * c.world + threadIdx.x] = (int32_t)count[threadIdx.x];
        }
    }
};

bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

}  // namespace

extern "C" int mok_ep_dispatch_cuda(const struct mok_ep_dispatch_args* args, cudaStream_t stream) {
    MOK_CHECK_ARG(args != NULL);
    const mok_ep_comm* c = &args->comm;
    MOK_CHECK_ARG(mok_ep_check_comm(c) == 0);
    MOK_CHECK_ARG(args->pairs >= 0 && args->src_rows >= 0 && args->src_div >= 1);
    MOK_CHECK_ARG(args->pairs <= args->src_rows * args->src_div);
    MOK_CHECK_ARG(args->dst != NULL || args->pairs == 0);
    MOK_CHECK_ARG(args->recv != NULL && args->recv_eid != NULL && args->recv_counts != NULL && args->counts != NULL);
    MOK_CHECK_ARG(mok_ep_fits<mok_ep_dispatch_op>(c));
    mok_ep_dispatch_op op;
    op.a = *args;
    // NOTE: peer buffers are allocation starts (256-byte aligned) plus 256-byte multiples.
    op.vec = c->row_bytes % 16 == 0 && aligned16(args->src) && aligned16(args->recv);
    const dim3 grid((unsigned)c->blocks, (unsigned)c->ranks);
    mok_ep_exchange_kernel<mok_ep_dispatch_op><<<grid, MOK_EP_THREADS, 0, stream>>>(op);
    return mok_launch_status();
}
