/*
 * Weight-gradient grouped GEMM with a ragged contraction (mok_grouped_gemm_wgrad in mok_core.h):
 *   out[e, m, n] = sum over r in [offsets[e], offsets[e + 1]) (increasing r) of a[r, m] * B[r, n]
 *   B[r, :] = b[b_gather[r] / b_gather_div, :] (zeros when b_gather[r] < 0), or b[r, :].
 *
 * Persistent kernel over the tile space E x ceil(M / 64) x ceil(N / 64) (gemm/scheduler.cuh, one
 * group per expert). The contraction runs over the expert's rows in slabs of 16 rows; both slabs are
 * loaded m-/n-fastest (coalesced, no transpose). An expert with no rows gets a tile of zeros.
 * Rows are clamped to [0, R]: a row range past R (a malformed plan) contributes nothing.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mok_cuda.h"
#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "gemm/mainloop_simt.cuh"
#include "gemm/scheduler.cuh"

namespace {

enum { WG_CTAS_PER_SM = 2 };

struct wgrad_params {
    const void* a;
    const void* b;
    const int32_t* b_gather;
    int64_t b_gather_div;
    const int32_t* offsets;
    int64_t R, E, M, N;
    void* out;
};

/* Row of b read for contraction row r, or -1 for a row of zeros (gather-on-load). */
__device__ __forceinline__ int64_t wg_b_row(const wgrad_params& p, int64_t r) {
    if (p.b_gather == NULL) {
        return r;
    }
    const int32_t g = p.b_gather[r];
    return g < 0 ? -1 : (int64_t)g / p.b_gather_div;
}

template <typename T>
__global__ void __launch_bounds__(mok_simt_cfg::THREADS, 2) grouped_gemm_wgrad_kernel(wgrad_params p) {
    typedef typename mok_acc<T>::type Acc;
    enum { BM = mok_simt_cfg::BM, BN = mok_simt_cfg::BN, BK = mok_simt_cfg::BK, TM = mok_simt_cfg::TM,
           TN = mok_simt_cfg::TN, LA = mok_simt_cfg::LOADS_A, LB = mok_simt_cfg::LOADS_B };
    static_assert(LA == BK / 4 && LB == BK / 4, "row-slab loads use k = tid / 64 + 4 i");
    __shared__ mok_simt_smem<Acc> sm;

    const T* __restrict__ a = (const T*)p.a;
    const T* __restrict__ b = (const T*)p.b;
    T* __restrict__ out = (T*)p.out;
    const int tid = (int)threadIdx.x;
    const int ty = tid / 16, tx = tid % 16;

    struct mok_tile_sched sched;
    mok_sched_init(&sched, p.E, (p.M + BM - 1) / BM, (p.N + BN - 1) / BN, BM, INT64_MAX);
    struct mok_tile tile;
    while (mok_sched_next_tile(&sched, &tile)) {
        mok_sched_wait_ready(&tile);
        const int64_t e = tile.group;
        const int64_t m0 = tile.m0;
        const int64_t n0 = tile.n_tile * BN;

        /* ---- the expert's contraction rows [rb, re), clamped to [0, R] ---- */
        int64_t rb = (int64_t)p.offsets[e];
        int64_t re = (int64_t)p.offsets[e + 1];
        rb = rb < 0 ? 0 : (rb > p.R ? p.R : rb);
        re = re < rb ? rb : (re > p.R ? p.R : re);
        const int64_t num_slabs = (re - rb + BK - 1) / BK;

        Acc acc[TM][TN];
        mok_simt_zero<Acc>(acc);
        T ra[LA], rbv[LB];

        /* ---- software-pipelined slab loop (as in grouped_gemm.cu) ----
         * Iteration s stages slab s - 1, issues the loads of slab s, multiplies slab s - 1.
         * Slab s covers rows [rb + s * BK, rb + s * BK + BK); this thread loads the rows
         * k = tid / 64 + 4 i of it at column tid % 64 of both operands. */
        for (int64_t s = 0; s <= num_slabs; ++s) {
            if (s > 0) {
                /* ---- stage slab s - 1: registers -> shared memory ---- */
#pragma unroll
                for (int i = 0; i < LA; ++i) {
                    sm.a[tid / 64 + 4 * i][tid % 64] = mok_to_acc(ra[i]);
                }
#pragma unroll
                for (int i = 0; i < LB; ++i) {
                    sm.b[tid / 64 + 4 * i][tid % 64] = mok_to_acc(rbv[i]);
                }
                __syncthreads();
            }
            if (s < num_slabs) {
                /* ---- issue the global loads of slab s ---- */
                const int64_t r0 = rb + s * BK;
#pragma unroll
                for (int i = 0; i < LA; ++i) {
                    const int64_t r = r0 + tid / 64 + 4 * i;
                    const int64_t m = m0 + tid % 64;
                    ra[i] = (r < re && m < p.M) ? a[r * p.M + m] : mok_zero<T>();
                }
#pragma unroll
                for (int i = 0; i < LB; ++i) {
                    const int64_t r = r0 + tid / 64 + 4 * i;
                    const int64_t n = n0 + tid % 64;
                    /* NOTE: the gather index is read per slab (4 rows per thread), not cached per
                     * tile: the contraction length of an expert is unbounded. */
                    const int64_t br = r < re ? wg_b_row(p, r) : -1;
                    rbv[i] = (br >= 0 && n < p.N) ? b[br * p.N + n] : mok_zero<T>();
                }
            }
            if (s > 0) {
                /* ---- multiply-accumulate slab s - 1 (rows in increasing order), release ---- */
                mok_simt_mma<Acc>(&sm, acc, ty, tx);
                __syncthreads();
            }
        }

        /* ---- epilogue: round once, store out[e, m, n] (zeros for an expert with no rows) ---- */
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int64_t m = m0 + ty + 16 * i;
            if (m < p.M) {
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const int64_t n = n0 + tx + 16 * j;
                    if (n < p.N) {
                        out[(e * p.M + m) * p.N + n] = mok_from_acc<T>(acc[i][j]);
                    }
                }
            }
        }
    }
}

}  // namespace

extern "C" int mok_grouped_gemm_wgrad_cuda(const struct mok_grouped_gemm_wgrad_args* args, cudaStream_t stream) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->E >= 0 && args->M >= 0 && args->N >= 0);
    MOK_CHECK_ARG(args->offsets != NULL && args->out != NULL && args->a != NULL && args->b != NULL);
    MOK_CHECK_ARG(args->b_gather == NULL || args->b_gather_div >= 1);
    if (args->dtype != MOK_BF16 && args->dtype != MOK_F16 && args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (args->E == 0 || args->M == 0 || args->N == 0) {
        return 0;
    }

    /* ---- persistent grid over E x M-tiles x N-tiles ---- */
    wgrad_params p;
    p.a = args->a;
    p.b = args->b;
    p.b_gather = args->b_gather;
    p.b_gather_div = args->b_gather_div >= 1 ? args->b_gather_div : 1;
    p.offsets = args->offsets;
    p.R = args->R;
    p.E = args->E;
    p.M = args->M;
    p.N = args->N;
    p.out = args->out;
    const int64_t num_tiles = p.E * mok_ceil_div(p.M, mok_simt_cfg::BM) * mok_ceil_div(p.N, mok_simt_cfg::BN);
    const int num_sms = args->num_sms > 0 ? args->num_sms : mok_num_sms();
    const unsigned int grid = mok_sched_grid(num_tiles, num_sms, WG_CTAS_PER_SM);
    const unsigned int threads = mok_simt_cfg::THREADS;

    switch (args->dtype) {
        case MOK_BF16: grouped_gemm_wgrad_kernel<__nv_bfloat16><<<grid, threads, 0, stream>>>(p); break;
        case MOK_F16: grouped_gemm_wgrad_kernel<__half><<<grid, threads, 0, stream>>>(p); break;
        case MOK_F32: grouped_gemm_wgrad_kernel<float><<<grid, threads, 0, stream>>>(p); break;
        default: grouped_gemm_wgrad_kernel<double><<<grid, threads, 0, stream>>>(p); break;
    }
    return mok_launch_status();
}
