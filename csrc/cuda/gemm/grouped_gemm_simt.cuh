/*
 * The SIMT (CUDA core) grouped GEMMs and the launchers' choice among their instantiations, for
 * grouped_gemm.cu / grouped_gemm_wgrad.cu (which check the arguments; the first hands bf16 NT problems
 * to the wgmma kernel) and for the CPU emulation (tests/emu/gemm_simt_emu.cpp), which runs these same
 * kernels through grouped_gemm_simt_run / grouped_gemm_wgrad_simt_run with a launch that runs every CTA.
 *
 *   grouped_gemm_kernel<T, TRANS_B>   out[r, n] = sum_k A[r, k] * b[e(r), n, k] (NT) or b[e(r), k, n] (NN),
 *                                     A[r, :] = a[a_gather[r] / a_gather_div, :] (zeros where a_gather[r] < 0);
 *                                     rows outside [offsets[0], offsets[E]) written as 0
 *   grouped_gemm_wgrad_kernel<T>      out[e, m, n] = sum over the expert's rows r (increasing) of a[r, m] * B[r, n],
 *                                     B[r, :] = b[b_gather[r] / b_gather_div, :]; an expert with no rows gets 0
 *
 * Both: persistent grids of num_sms * 2 CTAs over 64 x 64 output tiles (gemm/scheduler.cuh), the
 * mainloop of gemm/mainloop_simt.cuh, one accumulator per output element updated by mok_fma in
 * increasing k (or r) and rounded once: bitwise reproducible.
 *
 * Experts of an M-tile (NT/NN): plan offsets are multiples of the plan tile, which need not be a
 * multiple of BM, so one M-tile may hold rows of several experts. The kernel finds the experts of the
 * tile's first and last rows by binary search over offsets and runs one mainloop pass per expert in
 * that range, restricted to the expert's rows (other rows load as zero and are not stored). In the
 * common case (plan tile a multiple of 64) that is exactly one pass.
 *
 * Weight gradient: the contraction runs over the expert's rows in slabs of 16 rows, both slabs loaded
 * m-/n-fastest (coalesced, no transpose). Rows are clamped to [0, R]: a row range past R (a malformed
 * plan) contributes nothing.
 */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_SIMT_CUH
#define MOK_CUDA_GEMM_GROUPED_GEMM_SIMT_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../mok_cuda.h"
#include "../common/dtype.cuh"
#include "../common/launch.cuh"
#include "mainloop_simt.cuh"
#include "scheduler.cuh"

namespace mok_gemm_simt {

enum { GG_CTAS_PER_SM = 2 };

struct grouped_gemm_params {
    const void* a;
    const int32_t* a_gather;
    int64_t a_gather_div;
    const void* b;
    const int32_t* offsets;
    int64_t R, E, N, Kd;
    void* out;
};

/* Row of the gathered operand read for row r: r without a gather, else gather[r] / div, or -1 for a row of
 * zeros (gather[r] < 0): gather-on-load of token rows, the same rule for A (NT/NN) and B (weight gradient). */
__device__ __forceinline__ int64_t gathered_row(const int32_t* gather, int64_t div, int64_t r) {
    if (gather == NULL) {
        return r;
    }
    const int32_t g = gather[r];
    return g < 0 ? -1 : (int64_t)g / div;
}

template <typename T, bool TRANS_B>
__global__ void __launch_bounds__(mok_simt_cfg::THREADS, 2) grouped_gemm_kernel(grouped_gemm_params p) {
    typedef typename mok_acc<T>::type Acc;
    enum { BM = mok_simt_cfg::BM, BN = mok_simt_cfg::BN, BK = mok_simt_cfg::BK, TM = mok_simt_cfg::TM,
           TN = mok_simt_cfg::TN, LA = mok_simt_cfg::LOADS_A, LB = mok_simt_cfg::LOADS_B };
    __shared__ mok_simt_smem<Acc> sm;

    const T* __restrict__ a = (const T*)p.a;
    const T* __restrict__ b = (const T*)p.b;
    T* __restrict__ out = (T*)p.out;
    const int tid = (int)threadIdx.x;
    const int ty = tid / 16, tx = tid % 16;

    /* ---- rows in use: [row_begin, rows_used), read from the device-side plan ---- */
    const int64_t rows_used = mok_rows_in_use(p.offsets, p.E, p.R);
    int64_t row_begin = (int64_t)p.offsets[0];
    row_begin = row_begin < 0 ? 0 : (row_begin > rows_used ? rows_used : row_begin);

    struct mok_tile_sched sched;
    mok_sched_init(&sched, 1, (p.R + BM - 1) / BM, (p.N + BN - 1) / BN, BM, rows_used);
    struct mok_tile tile;
    while (mok_sched_next_tile(&sched, &tile)) {
        mok_sched_wait_ready(&tile);
        const int64_t m0 = tile.m0;
        const int64_t n0 = tile.n_tile * BN;
        const int64_t m_end = m0 + BM < p.R ? m0 + BM : p.R;

        /* ---- zero-fill this thread's rows that belong to no expert ---- */
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int64_t r = m0 + ty + 16 * i;
            if (r < m_end && (r < row_begin || r >= rows_used)) {
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const int64_t n = n0 + tx + 16 * j;
                    if (n < p.N) {
                        out[r * p.N + n] = mok_zero<T>();
                    }
                }
            }
        }
        if (!tile.in_use) {
            continue;
        }
        const int64_t lo_all = m0 > row_begin ? m0 : row_begin;
        const int64_t hi_all = m_end < rows_used ? m_end : rows_used;
        if (lo_all >= hi_all) {
            continue;
        }

        /* ---- experts spanned by the tile's rows in use ---- */
        /* NOTE: every value below depends only on the tile and on global memory that no thread
         * writes, so all threads agree and the __syncthreads inside the passes are uniform. */
        const int64_t e_first = mok_expert_of_row(p.offsets, p.E, lo_all);
        int64_t e_last = mok_expert_of_row(p.offsets, p.E, hi_all - 1);
        e_last = e_last < p.E - 1 ? e_last : p.E - 1;
        for (int64_t e = e_first < 0 ? 0 : e_first; e <= e_last; ++e) {
            const int64_t off_lo = (int64_t)p.offsets[e], off_hi = (int64_t)p.offsets[e + 1];
            const int64_t lo = lo_all > off_lo ? lo_all : off_lo;
            const int64_t hi = hi_all < off_hi ? hi_all : off_hi;
            if (lo >= hi) {
                continue;
            }

            /* ---- per-pass A rows of this thread's loads (m = tid / 16 + 16 i, k = tid % 16) ---- */
            int64_t a_row[LA];
#pragma unroll
            for (int i = 0; i < LA; ++i) {
                const int64_t r = m0 + tid / 16 + 16 * i;
                a_row[i] = (r >= lo && r < hi) ? gathered_row(p.a_gather, p.a_gather_div, r) : -1;
            }
            const T* __restrict__ be = b + e * p.N * p.Kd;

            Acc acc[TM][TN];
            mok_simt_zero<Acc>(acc);
            T ra[LA], rb[LB];
            const int64_t num_slabs = (p.Kd + BK - 1) / BK;

            /* ---- software-pipelined slab loop ----
             * Iteration s stages slab s - 1 (registers -> shared), issues the global loads of slab s
             * into registers, then multiplies slab s - 1, so global latency overlaps the mma.
             * Slab s covers k in [s * BK, s * BK + BK); out-of-range k, rows and columns load zero. */
            for (int64_t s = 0; s <= num_slabs; ++s) {
                if (s > 0) {
                    /* ---- stage slab s - 1: registers -> shared memory ---- */
#pragma unroll
                    for (int i = 0; i < LA; ++i) {
                        sm.a[tid % 16][tid / 16 + 16 * i] = mok_to_acc(ra[i]);
                    }
#pragma unroll
                    for (int i = 0; i < LB; ++i) {
                        if (TRANS_B) {
                            sm.b[tid % 16][tid / 16 + 16 * i] = mok_to_acc(rb[i]);
                        } else {
                            sm.b[tid / 64 + 4 * i][tid % 64] = mok_to_acc(rb[i]);
                        }
                    }
                    __syncthreads();
                }
                if (s < num_slabs) {
                    /* ---- issue the global loads of slab s (in flight during the mma below) ---- */
                    const int64_t k0 = s * BK;
#pragma unroll
                    for (int i = 0; i < LA; ++i) {
                        const int64_t k = k0 + tid % 16;
                        ra[i] = (a_row[i] >= 0 && k < p.Kd) ? a[a_row[i] * p.Kd + k] : mok_zero<T>();
                    }
#pragma unroll
                    for (int i = 0; i < LB; ++i) {
                        if (TRANS_B) {
                            const int64_t n = n0 + tid / 16 + 16 * i;
                            const int64_t k = k0 + tid % 16;
                            rb[i] = (n < p.N && k < p.Kd) ? be[n * p.Kd + k] : mok_zero<T>();
                        } else {
                            const int64_t k = k0 + tid / 64 + 4 * i;
                            const int64_t n = n0 + tid % 64;
                            rb[i] = (k < p.Kd && n < p.N) ? be[k * p.N + n] : mok_zero<T>();
                        }
                    }
                }
                if (s > 0) {
                    /* ---- multiply-accumulate slab s - 1, then release the buffers ---- */
                    mok_simt_mma<Acc>(&sm, acc, ty, tx);
                    __syncthreads();
                }
            }

            /* ---- epilogue: round once to T, store the expert's rows ---- */
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const int64_t r = m0 + ty + 16 * i;
                if (r >= lo && r < hi) {
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        const int64_t n = n0 + tx + 16 * j;
                        if (n < p.N) {
                            out[r * p.N + n] = mok_from_acc<T>(acc[i][j]);
                        }
                    }
                }
            }
        }
    }
}

/* The NT / NN kernel for args (checked by the caller, R and N > 0, dtype one of the four), launched as
 * launch(kernel, grid, block, params). */
template <class Launch>
int grouped_gemm_simt_run(const struct mok_grouped_gemm_args* args, Launch&& launch) {
    /* ---- persistent grid over the [R, N] tile space ---- */
    grouped_gemm_params p;
    p.a = args->a;
    p.a_gather = args->a_gather;
    p.a_gather_div = args->a_gather_div >= 1 ? args->a_gather_div : 1;
    p.b = args->b;
    p.offsets = args->offsets;
    p.R = args->R;
    p.E = args->E;
    p.N = args->N;
    p.Kd = args->Kd;
    p.out = args->out;
    const int64_t num_tiles = mok_ceil_div(p.R, mok_simt_cfg::BM) * mok_ceil_div(p.N, mok_simt_cfg::BN);
    const int num_sms = args->num_sms > 0 ? args->num_sms : mok_num_sms();
    const unsigned int grid = mok_sched_grid(num_tiles, num_sms, GG_CTAS_PER_SM);
    const unsigned int threads = mok_simt_cfg::THREADS;

    switch (args->dtype) {
        case MOK_BF16:
            args->trans_b ? launch(grouped_gemm_kernel<__nv_bfloat16, true>, grid, threads, p)
                          : launch(grouped_gemm_kernel<__nv_bfloat16, false>, grid, threads, p);
            break;
        case MOK_F16:
            args->trans_b ? launch(grouped_gemm_kernel<__half, true>, grid, threads, p)
                          : launch(grouped_gemm_kernel<__half, false>, grid, threads, p);
            break;
        case MOK_F32:
            args->trans_b ? launch(grouped_gemm_kernel<float, true>, grid, threads, p)
                          : launch(grouped_gemm_kernel<float, false>, grid, threads, p);
            break;
        default:
            args->trans_b ? launch(grouped_gemm_kernel<double, true>, grid, threads, p)
                          : launch(grouped_gemm_kernel<double, false>, grid, threads, p);
            break;
    }
    return 0;
}

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

        /* ---- software-pipelined slab loop (as in grouped_gemm_kernel) ----
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
                    const int64_t br = r < re ? gathered_row(p.b_gather, p.b_gather_div, r) : -1;
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

/* The weight-gradient kernel for args (checked by the caller, E, M and N > 0, dtype one of the four). */
template <class Launch>
int grouped_gemm_wgrad_simt_run(const struct mok_grouped_gemm_wgrad_args* args, Launch&& launch) {
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
        case MOK_BF16: launch(grouped_gemm_wgrad_kernel<__nv_bfloat16>, grid, threads, p); break;
        case MOK_F16: launch(grouped_gemm_wgrad_kernel<__half>, grid, threads, p); break;
        case MOK_F32: launch(grouped_gemm_wgrad_kernel<float>, grid, threads, p); break;
        default: launch(grouped_gemm_wgrad_kernel<double>, grid, threads, p); break;
    }
    return 0;
}

}  // namespace mok_gemm_simt

#endif /* MOK_CUDA_GEMM_GROUPED_GEMM_SIMT_CUH */
