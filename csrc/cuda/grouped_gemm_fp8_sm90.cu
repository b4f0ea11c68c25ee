/*
 * Launcher of the sm_90a FP8 blockwise grouped GEMM (gemm/grouped_gemm_fp8_sm90.cuh): tensor maps,
 * persistent grid, shared-memory opt-in. The C ABI is mok_fp8_gemm_cuda.h.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "common/launch.cuh"
#include "gemm/cluster_launch.cuh"
#include "gemm/grouped_gemm_fp8_sm90.cuh"
#include "gemm/grouped_gemm_sm90.h"
#include "gemm/tensor_map.h"
#include "mok_fp8_gemm_cuda.h"

namespace {

namespace f8 = mok_sm90_fp8;

template <typename Args>
bool pointers_aligned(const Args* a) {
    return (((uintptr_t)a->a | (uintptr_t)a->b | (uintptr_t)a->out | (uintptr_t)a->sa | (uintptr_t)a->sb) % 16) == 0;
}

/* The forward's SwiGLU output, if any, is written by TMA. (Its shape rule, I % 64 == 0 so that each
 * 64-row half of a tile lies in one scale block, is N % 128 == 0, which every forward needs.) */
bool act_aligned(const struct mok_grouped_gemm_fp8_args* a) { return (uintptr_t)a->act % 16 == 0; }

bool sm90_enabled() {
    const char* env = getenv("MOK_DISABLE_SM90");
    return !(env && env[0] && env[0] != '0');
}

/* CTAs per cluster of the forward: 1, or 2 with MOK_SM90_FP8_CLUSTER=2 (pairs of M-tiles sharing
 * B by TMA multicast; an experiment, read on every call so that one process can compare both). */
int fp8_cluster_size() {
    const char* env = getenv("MOK_SM90_FP8_CLUSTER");
    return env && env[0] == '2' ? 2 : 1;
}

/* MOK_SM90_FP8_BN=128: the plain forward and the weight gradient run 128 x 128 tiles instead of their
 * default widths (BN_FWD, BN_WGRAD: 192); read on every call, so that one process can compare both
 * (performance log v30). */
bool fp8_narrow_tiles() { return env_equals("MOK_SM90_FP8_BN", "128"); }

/* MOK_SM90_FP8_SWIGLU_BN=192: the SwiGLU GEMM1 runs 128 x 192 tiles (96 gate + 96 up rows) instead of
 * 128 x 128. An opt-in experiment: bitwise the same outputs, but +1% / -2% / -5% on the DeepSeek-V3 /
 * Mixtral / Qwen3 shapes (performance log v32); read on every call. */
bool fp8_wide_swiglu() { return env_equals("MOK_SM90_FP8_SWIGLU_BN", "192"); }

/* Persistent launch of one kernel variant (128 x BN tiles) over `units` work units (tiles, or pairs
 * of M-tiles; shared memory opted in once per variant). */
template <int BN, bool kWgrad, int kCluster, bool kSwiGLU = false, bool kSbTiled = false>
int launch(const CUtensorMap& tma_a, const CUtensorMap& tma_b, const CUtensorMap& tma_b_half,
           const CUtensorMap& tma_out, const CUtensorMap& tma_act, const f8::params& p, int64_t units,
           int num_sms_hint, cudaStream_t stream) {
    auto kernel = f8::grouped_gemm_fp8_nt_kernel<BN, kWgrad, kCluster, kSwiGLU, kSbTiled>;
    const int smem = (int)sizeof(typename f8::fp8_tile<BN>::smem_layout) + 1024;
    static bool configured = false;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
            return mok_launch_status();
        configured = true;
    }
    const int num_sms = num_sms_hint > 0 ? num_sms_hint : mok_num_sms();
    if (kCluster == 1) {
        kernel<<<mok_sched_grid(units, num_sms, 1), f8::kThreads, smem, stream>>>(tma_a, tma_b, tma_b_half, tma_out,
                                                                                   tma_act, p);
        return mok_launch_status();
    }
    static int max_clusters = 0;
    return mok_launch_persistent_clusters(kernel, kCluster, units, num_sms, f8::kThreads, smem, stream, &max_clusters,
                                          tma_a, tma_b, tma_b_half, tma_out, tma_act, p);
}

}  // namespace

extern "C" int mok_grouped_gemm_fp8_supported(const struct mok_grouped_gemm_fp8_args* a) {
    if (!sm90_enabled()) return 0;
    if (a->R < 0 || a->E < 1 || a->E > MOK_INT32_LIMIT || a->R > MOK_INT32_LIMIT) return 0;
    if (a->K <= 0 || a->N <= 0 || a->K % f8::BK || a->N % f8::SCALE_BLOCK) return 0;
    if (!pointers_aligned(a) || !act_aligned(a)) return 0;
    return mok_tma::is_hopper() && mok_tma::encode_fn() != NULL;
}

extern "C" int mok_grouped_gemm_fp8_cuda(const struct mok_grouped_gemm_fp8_args* a, cudaStream_t stream) {
    MOK_CHECK_ARG(a != NULL && a->R >= 0 && a->E >= 1 && a->N > 0 && a->K > 0);
    if (a->R == 0) return MOK_OK;
    MOK_CHECK_ARG(a->a != NULL && a->sa != NULL && a->b != NULL && a->sb != NULL && a->offsets != NULL &&
                  a->out != NULL);
    MOK_CHECK_ARG(a->K % f8::BK == 0 && a->N % f8::SCALE_BLOCK == 0 && pointers_aligned(a) && act_aligned(a));

    /* the tile width: 128 for the SwiGLU variant (whole gate and up halves of a scale block), else
     * the plain forward's */
    const bool wide_swiglu = a->act != NULL && fp8_wide_swiglu();
    const int bn = a->act != NULL ? (wide_swiglu ? 192 : (int)f8::BN_SWIGLU)
                                  : fp8_narrow_tiles() ? 128
                                                       : (int)f8::BN_FWD;
    CUtensorMap tma_a, tma_b, tma_b_half, tma_out, tma_act;
    {
        /* A [R, K] bytes: boxes of 128 rows x 128 K (one 128-byte swizzle row each) */
        const cuuint64_t dims[2] = {(cuuint64_t)a->K, (cuuint64_t)a->R};
        const cuuint64_t strides[1] = {(cuuint64_t)a->K};
        const cuuint32_t box[2] = {f8::BK, f8::BM};
        if (!mok_tma::encode(&tma_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, a->a, 2, dims, strides, box)) return MOK_ERR_ARG;
    }
    {
        /* B [E, N, K] bytes: boxes of bn rows of one expert */
        const cuuint64_t dims[3] = {(cuuint64_t)a->K, (cuuint64_t)a->N, (cuuint64_t)a->E};
        const cuuint64_t strides[2] = {(cuuint64_t)a->K, (cuuint64_t)(a->N * a->K)};
        const cuuint32_t box[3] = {f8::BK, (cuuint32_t)bn, 1};
        if (!mok_tma::encode(&tma_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, a->b, 3, dims, strides, box)) return MOK_ERR_ARG;
        /* and in halves of bn / 2 rows: the part of a shared B tile each CTA of a pair multicasts, or
         * a SwiGLU tile's gate and up halves */
        const cuuint32_t half_box[3] = {f8::BK, (cuuint32_t)bn / 2, 1};
        if (!mok_tma::encode(&tma_b_half, CU_TENSOR_MAP_DATA_TYPE_UINT8, a->b, 3, dims, strides, half_box))
            return MOK_ERR_ARG;
    }
    if (wide_swiglu) {
        /* h [R, 2, I] bf16 (gate and up as planes): a 96-column tile's boxes past I are clipped */
        const int64_t I = a->N / 2;
        const cuuint64_t dims[3] = {(cuuint64_t)I, 2, (cuuint64_t)a->R};
        const cuuint64_t strides[2] = {(cuuint64_t)I * 2, (cuuint64_t)a->N * 2};
        const cuuint32_t box[3] = {64, 1, 64};
        if (!mok_tma::encode(&tma_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a->out, 3, dims, strides, box))
            return MOK_ERR_ARG;
    } else {
        /* out [1, R, N] bf16: the BF16 kernel's [64 x 64] epilogue boxes */
        const cuuint64_t dims[3] = {(cuuint64_t)a->N, (cuuint64_t)a->R, 1};
        const cuuint64_t strides[2] = {(cuuint64_t)a->N * 2, (cuuint64_t)(a->N * a->R * 2)};
        const cuuint32_t box[3] = {64, 64, 1};
        if (!mok_tma::encode(&tma_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a->out, 3, dims, strides, box))
            return MOK_ERR_ARG;
    }
    tma_act = tma_out;
    if (a->act != NULL) {
        /* act [1, R, N / 2] bf16, the same boxes */
        const int64_t I = a->N / 2;
        const cuuint64_t dims[3] = {(cuuint64_t)I, (cuuint64_t)a->R, 1};
        const cuuint64_t strides[2] = {(cuuint64_t)I * 2, (cuuint64_t)(I * a->R * 2)};
        const cuuint32_t box[3] = {64, 64, 1};
        if (!mok_tma::encode(&tma_act, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a->act, 3, dims, strides, box))
            return MOK_ERR_ARG;
    }
    f8::params p;
    p.sa = a->sa;
    p.sb = a->sb;
    p.offsets = a->offsets;
    p.E = (int32_t)a->E;
    p.R = a->R;
    p.N = a->N;
    p.Kd = a->K;
    p.num_n_tiles = mok_ceil_div(a->N, bn);
    p.num_kb = a->K / f8::BK;
    p.I = a->N / 2;
    p.error_flag = a->error_flag;

    /* NOTE: a pair needs two SMs of one GPC; with fewer SMs than that, one CTA per cluster */
    const int num_sms = a->num_sms > 0 ? a->num_sms : mok_num_sms();
    /* SwiGLU: I / (bn / 2) tiles per row of tiles, the last one partial where I % 96 != 0 */
    const int64_t tiles = mok_ceil_div(a->R, f8::BM) * p.num_n_tiles;
    if (wide_swiglu) /* (single CTAs: the pairs' multicast halves are not the gate and up halves) */
        return launch<192, false, 1, true>(tma_a, tma_b, tma_b_half, tma_out, tma_act, p, tiles, num_sms, stream);
    if (a->act != NULL)
        return launch<f8::BN_SWIGLU, false, 1, true>(tma_a, tma_b, tma_b_half, tma_out, tma_act, p, tiles, num_sms,
                                                     stream);
    const bool pairs = fp8_cluster_size() == 2 && num_sms >= 2;
    const int64_t pair_units = mok_ceil_div(a->R, 2 * f8::BM) * p.num_n_tiles;
    if (bn == 128)
        return pairs ? launch<128, false, 2>(tma_a, tma_b, tma_b_half, tma_out, tma_act, p, pair_units, num_sms, stream)
                     : launch<128, false, 1>(tma_a, tma_b, tma_b_half, tma_out, tma_act, p, tiles, num_sms, stream);
    return pairs ? launch<f8::BN_FWD, false, 2>(tma_a, tma_b, tma_b_half, tma_out, tma_act, p, pair_units, num_sms, stream)
                 : launch<f8::BN_FWD, false, 1>(tma_a, tma_b, tma_b_half, tma_out, tma_act, p, tiles, num_sms, stream);
}

extern "C" int mok_grouped_gemm_fp8_wgrad_supported(const struct mok_grouped_gemm_fp8_wgrad_args* a) {
    if (!sm90_enabled()) return 0;
    if (a->R < 0 || a->E < 1 || a->E > MOK_INT32_LIMIT || a->R > MOK_INT32_LIMIT) return 0;
    if (a->M <= 0 || a->N <= 0 || a->M % f8::BM || a->N % f8::SCALE_BLOCK || a->R % 16) return 0;
    if (!pointers_aligned(a)) return 0;
    if (a->out_second && ((a->M / 2) % 64 || !mok_sm90_planes_ok(a->out, a->out_second))) return 0;
    return mok_tma::is_hopper() && mok_tma::encode_fn() != NULL;
}

extern "C" int mok_grouped_gemm_fp8_wgrad_cuda(const struct mok_grouped_gemm_fp8_wgrad_args* a, cudaStream_t stream) {
    MOK_CHECK_ARG(a != NULL && a->R >= 0 && a->E >= 1 && a->M > 0 && a->N > 0);
    MOK_CHECK_ARG(a->offsets != NULL && a->out != NULL);
    MOK_CHECK_ARG(a->M % f8::BM == 0 && a->N % f8::SCALE_BLOCK == 0 && a->R % 16 == 0 && pointers_aligned(a));
    /* NOTE: R == 0 still launches: every expert's gradient is zero and must be written */
    const int64_t R = a->R > 0 ? a->R : 16; /* a tensor map needs a non-empty extent (never read: no K-blocks) */
    MOK_CHECK_ARG(a->R == 0 || (a->a != NULL && a->sa != NULL && a->b != NULL && a->sb != NULL));

    const int bn = fp8_narrow_tiles() ? 128 : (int)f8::BN_WGRAD;
    CUtensorMap tma_a, tma_b, tma_out;
    {
        /* A [M, R] bytes: boxes of 128 rows (of M) x 128 R (one 128-byte swizzle row each) */
        const cuuint64_t dims[2] = {(cuuint64_t)R, (cuuint64_t)a->M};
        const cuuint64_t strides[1] = {(cuuint64_t)R};
        const cuuint32_t box[2] = {f8::BK, f8::BM};
        const void* base = a->R > 0 ? a->a : a->out;
        if (!mok_tma::encode(&tma_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, 2, dims, strides, box)) return MOK_ERR_ARG;
    }
    {
        /* B [N, R] bytes: boxes of bn rows (of N) x 128 R */
        const cuuint64_t dims[2] = {(cuuint64_t)R, (cuuint64_t)a->N};
        const cuuint64_t strides[1] = {(cuuint64_t)R};
        const cuuint32_t box[2] = {f8::BK, (cuuint32_t)bn};
        const void* base = a->R > 0 ? a->b : a->out;
        if (!mok_tma::encode(&tma_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, 2, dims, strides, box)) return MOK_ERR_ARG;
    }
    f8::params p;
    memset(&p, 0, sizeof p);
    if (a->out_second) {
        /* split out: rows [0, M / 2) and [M / 2, M) of [E, M / 2, N] each, as planes of one
         * [2, E, M / 2, N] map ([64 x 64] boxes; a chunk's 64 rows never straddle the halves) */
        MOK_CHECK_ARG(a->M % 2 == 0 && (a->M / 2) % 64 == 0 && mok_sm90_planes_ok(a->out, a->out_second));
        const int64_t Mh = a->M / 2;
        uint64_t plane_stride;
        const void* base = mok_sm90_split_base(a->out, a->out_second, &plane_stride, &p.split_flip);
        p.split_rows = Mh;
        const cuuint64_t dims[4] = {(cuuint64_t)a->N, (cuuint64_t)Mh, (cuuint64_t)a->E, 2};
        const cuuint64_t strides[3] = {(cuuint64_t)a->N * 2, (cuuint64_t)(a->N * Mh * 2), plane_stride};
        const cuuint32_t box[4] = {64, 64, 1, 1};
        if (!mok_tma::encode(&tma_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, 4, dims, strides, box))
            return MOK_ERR_ARG;
    } else {
        /* out [E, M, N] bf16: [64 x 64] epilogue boxes of one expert */
        const cuuint64_t dims[3] = {(cuuint64_t)a->N, (cuuint64_t)a->M, (cuuint64_t)a->E};
        const cuuint64_t strides[2] = {(cuuint64_t)a->N * 2, (cuuint64_t)(a->N * a->M * 2)};
        const cuuint32_t box[3] = {64, 64, 1};
        if (!mok_tma::encode(&tma_out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a->out, 3, dims, strides, box))
            return MOK_ERR_ARG;
    }
    p.sa = a->sa;
    p.sb = a->sb;
    p.offsets = a->offsets;
    p.E = (int32_t)a->E;
    p.R = a->R;
    p.N = a->N;
    p.M = a->M;
    p.num_m_tiles = a->M / f8::BM;
    p.num_n_tiles = mok_ceil_div(a->N, bn);
    p.error_flag = a->error_flag;
    const int64_t tiles = a->E * p.num_m_tiles * p.num_n_tiles;
    /* sb_tiled: B's scales per 128 x 128 block (the forward's promotion, one FFMA per accumulator) */
    if (a->sb_tiled)
        return bn == 128
                   ? launch<128, true, 1, false, true>(tma_a, tma_b, tma_b, tma_out, tma_out, p, tiles, a->num_sms, stream)
                   : launch<f8::BN_WGRAD, true, 1, false, true>(tma_a, tma_b, tma_b, tma_out, tma_out, p, tiles,
                                                                a->num_sms, stream);
    return bn == 128 ? launch<128, true, 1>(tma_a, tma_b, tma_b, tma_out, tma_out, p, tiles, a->num_sms, stream)
                     : launch<f8::BN_WGRAD, true, 1>(tma_a, tma_b, tma_b, tma_out, tma_out, p, tiles, a->num_sms, stream);
}
