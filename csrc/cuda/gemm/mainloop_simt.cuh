/*
 * SIMT (CUDA core) mainloop building blocks of the grouped GEMMs in gemm/grouped_gemm_simt.cuh (every
 * dtype, NN and unaligned shapes; bf16 NT runs on the wgmma kernels): the tile shape, the shared-memory
 * staging buffers and the per-slab multiply-accumulate.
 *
 * Output tile BM x BN, computed by THREADS threads laid out as 16 x 16; thread (ty, tx) owns the
 * TM x TN elements (ty + 16 * i, tx + 16 * j). The contraction runs in slabs of BK.
 *
 * Shared memory (accumulation type Acc, float or double):
 *   a[BK][BM + 1]  A slab, k-major (a[k][m])
 *   b[BK][BN + 1]  B slab, k-major (b[k][n])
 * NOTE: the +1 column skews the banks of the transposed (k-fastest) stores of the A / NT-B loads.
 *
 * Determinism: each output element is ONE accumulator updated by mok_fma in increasing k order
 * (slabs in order, k within a slab in order): bitwise reproducible run to run.
 */
#ifndef MOK_CUDA_GEMM_MAINLOOP_SIMT_CUH
#define MOK_CUDA_GEMM_MAINLOOP_SIMT_CUH

#include "../common/dtype.cuh"

struct mok_simt_cfg {
    enum {
        BM = 64,
        BN = 64,
        BK = 16,
        THREADS = 256,
        TM = 4,
        TN = 4,
        /* per-thread element counts of the two global -> shared load patterns */
        LOADS_A = BM * BK / THREADS,
        LOADS_B = BN * BK / THREADS,
    };
};

static_assert(mok_simt_cfg::THREADS == 256, "the 16 x 16 thread layout assumes 256 threads");
static_assert(mok_simt_cfg::BM == 16 * mok_simt_cfg::TM, "BM must equal 16 * TM");
static_assert(mok_simt_cfg::BN == 16 * mok_simt_cfg::TN, "BN must equal 16 * TN");
static_assert(mok_simt_cfg::BK == 16, "k-fastest load patterns use tid % 16 as k");
static_assert(mok_simt_cfg::BM == 64 && mok_simt_cfg::BN == 64, "m/n-fastest load patterns use tid % 64");
static_assert(mok_simt_cfg::LOADS_A * mok_simt_cfg::THREADS == mok_simt_cfg::BM * mok_simt_cfg::BK,
              "A slab must split evenly over the threads");
static_assert(mok_simt_cfg::LOADS_B * mok_simt_cfg::THREADS == mok_simt_cfg::BN * mok_simt_cfg::BK,
              "B slab must split evenly over the threads");

template <typename Acc>
struct mok_simt_smem {
    Acc a[mok_simt_cfg::BK][mok_simt_cfg::BM + 1];
    Acc b[mok_simt_cfg::BK][mok_simt_cfg::BN + 1];
};
static_assert(sizeof(mok_simt_smem<double>) <= 48 * 1024, "static shared memory limit");

/* acc = 0 */
template <typename Acc>
__device__ __forceinline__ void mok_simt_zero(Acc (&acc)[mok_simt_cfg::TM][mok_simt_cfg::TN]) {
#pragma unroll
    for (int i = 0; i < mok_simt_cfg::TM; ++i) {
#pragma unroll
        for (int j = 0; j < mok_simt_cfg::TN; ++j) {
            acc[i][j] = (Acc)0;
        }
    }
}

/* acc[i][j] += sum over the slab's k (increasing) of a[k][ty + 16 i] * b[k][tx + 16 j].
 * The caller brackets it with __syncthreads (slab stored before, slab consumed after). */
template <typename Acc>
__device__ __forceinline__ void mok_simt_mma(const mok_simt_smem<Acc>* sm, Acc (&acc)[mok_simt_cfg::TM][mok_simt_cfg::TN],
                                             int ty, int tx) {
#pragma unroll
    for (int kk = 0; kk < mok_simt_cfg::BK; ++kk) {
        Acc av[mok_simt_cfg::TM], bv[mok_simt_cfg::TN];
        /* NOTE: a[kk][ty + 16 i] is a broadcast within a warp (two ty per warp); b[kk][tx + 16 j]
         * reads 16 consecutive words: no bank conflicts. */
#pragma unroll
        for (int i = 0; i < mok_simt_cfg::TM; ++i) {
            av[i] = sm->a[kk][ty + 16 * i];
        }
#pragma unroll
        for (int j = 0; j < mok_simt_cfg::TN; ++j) {
            bv[j] = sm->b[kk][tx + 16 * j];
        }
#pragma unroll
        for (int i = 0; i < mok_simt_cfg::TM; ++i) {
#pragma unroll
            for (int j = 0; j < mok_simt_cfg::TN; ++j) {
                acc[i][j] = mok_fma(av[i], bv[j], acc[i][j]);
            }
        }
    }
}

#endif /* MOK_CUDA_GEMM_MAINLOOP_SIMT_CUH */
