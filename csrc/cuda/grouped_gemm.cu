/*
 * Grouped GEMM over the plan's row space (mok_grouped_gemm in mok_core.h), NT and NN, with
 * gather-on-load of the A rows and the optional SwiGLU epilogue.
 *
 *   NT (trans_b != 0): out[r, n] = sum_k A[r, k] * b[e(r), n, k]    b [E, N, Kd]
 *   NN (trans_b == 0): out[r, n] = sum_k A[r, k] * b[e(r), k, n]    b [E, Kd, N]
 *   A[r, :] = a[a_gather[r] / a_gather_div, :] (zeros when a_gather[r] < 0), or a[r, :] without a_gather.
 *
 * Persistent kernel: grid = num_sms * CTAS_PER_SM CTAs, each walking 64 x 64 output tiles of the
 * [R, N] row space through mok_tile_sched (gemm/scheduler.cuh). Rows at or past offsets[E] (read on
 * the device) are written as 0.
 *
 * Experts of an M-tile: plan offsets are multiples of the plan tile, which need not be a multiple
 * of BM, so one M-tile may hold rows of several experts. The kernel finds the experts of the tile's
 * first and last rows by binary search over offsets and runs one mainloop pass per expert in that
 * range, restricted to the expert's rows (other rows load as zero and are not stored). In the
 * common case (plan tile a multiple of 64) that is exactly one pass.
 *
 * SwiGLU epilogue (swiglu_out != NULL): done as a second phase; after the GEMM kernel the launcher
 * runs mok_swiglu_forward_cuda(h = out, I = N / 2, out = swiglu_out) on the same stream, which reads
 * the rounded values of out and therefore equals mok_swiglu_forward applied to out exactly.
 *
 * bf16 NT problems go to the sm_90a wgmma kernel instead (grouped_gemm_sm90.cu), which fuses the
 * SwiGLU epilogue; this SIMT kernel serves the other dtypes, NN and unaligned shapes.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mok_cuda.h"
#include "common/dtype.cuh"
#include "common/launch.cuh"
#include "gemm/mainloop_simt.cuh"
#include "gemm/grouped_gemm_sm90.h"
#include "gemm/scheduler.cuh"

namespace {

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

/* Row of a read by GEMM row r, or -1 for a row of zeros (gather-on-load). */
__device__ __forceinline__ int64_t gg_a_row(const grouped_gemm_params& p, int64_t r) {
    if (p.a_gather == NULL) {
        return r;
    }
    const int32_t g = p.a_gather[r];
    return g < 0 ? -1 : (int64_t)g / p.a_gather_div;
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
                a_row[i] = (r >= lo && r < hi) ? gg_a_row(p, r) : -1;
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

template <typename T>
void grouped_gemm_launch(const grouped_gemm_params& p, int trans_b, unsigned int grid, cudaStream_t stream) {
    if (trans_b) {
        grouped_gemm_kernel<T, true><<<grid, mok_simt_cfg::THREADS, 0, stream>>>(p);
    } else {
        grouped_gemm_kernel<T, false><<<grid, mok_simt_cfg::THREADS, 0, stream>>>(p);
    }
}

}  // namespace

extern "C" int mok_grouped_gemm_cuda(const struct mok_grouped_gemm_args* args, cudaStream_t stream) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->E >= 0 && args->N >= 0 && args->Kd >= 0);
    MOK_CHECK_ARG(args->offsets != NULL && args->out != NULL);
    MOK_CHECK_ARG(args->a != NULL && args->b != NULL);
    MOK_CHECK_ARG(args->a_gather == NULL || args->a_gather_div >= 1);
    MOK_CHECK_ARG(args->swiglu_out == NULL || (args->trans_b != 0 && args->N % 2 == 0));
    if (args->dtype != MOK_BF16 && args->dtype != MOK_F16 && args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (args->R == 0 || args->N == 0) {
        return 0;
    }
    /* ---- the sm_90a wgmma kernel where it applies (bf16 NT), the SIMT kernel otherwise ---- */
    if (mok_grouped_gemm_sm90_supported(args)) {
        return mok_grouped_gemm_sm90(args, stream);
    }

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

    switch (args->dtype) {
        case MOK_BF16: grouped_gemm_launch<__nv_bfloat16>(p, args->trans_b, grid, stream); break;
        case MOK_F16: grouped_gemm_launch<__half>(p, args->trans_b, grid, stream); break;
        case MOK_F32: grouped_gemm_launch<float>(p, args->trans_b, grid, stream); break;
        default: grouped_gemm_launch<double>(p, args->trans_b, grid, stream); break;
    }
    int status = mok_launch_status();
    if (status != 0 || args->swiglu_out == NULL) {
        return status;
    }

    /* ---- SwiGLU epilogue as a second phase on the same stream (see the file header) ---- */
    struct mok_swiglu_args sw;
    sw.h = args->out;
    sw.d_act = NULL;
    sw.dtype = args->dtype;
    sw.R = args->R;
    sw.I = args->N / 2;
    sw.out = args->swiglu_out;
    return mok_swiglu_forward_cuda(&sw, stream);
}
