/*
 * Launcher of the sm_90a BF16 grouped GEMM (gemm/grouped_gemm_sm90.cuh): tensor maps, grid,
 * shared-memory opt-in. Kernel variants: {plain, SwiGLU epilogue} x {TMA A, gathered A} x {B K-major
 * ("NT"), B N-major ("NN", plain only)}, and the weight gradient; with A's rows quantise-dequantised
 * to MXFP8 on load (qdq_a_mxfp8), the three that recipe="mxfp8" runs: SwiGLU with gathered A, plain
 * NT and plain NN with TMA A.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "common/launch.cuh"
#include "gemm/cluster_launch.cuh"
#include "gemm/grouped_gemm_sm90.cuh"
#include "gemm/grouped_gemm_sm90.h"
#include "gemm/tensor_map.h"

namespace {

using mok_tma::encode_fn;
using mok_tma::is_hopper;

/* A bf16 tensor of `rank` dims (dims[0] contiguous) with 128B swizzle boxes (box[0] = 64). */
bool encode(CUtensorMap* map, const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides_bytes,
            const cuuint32_t* box) {
    return mok_tma::encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims, strides_bytes, box);
}

/* [64 rows][64 columns] boxes of a [outer, rows, cols] tensor with row stride `row_elems`
 * (cols <= row_elems: a column slice of wider rows) and outer stride `outer_elems`: the MN-major
 * operand chunks ([64 K][64 M or N]) and the epilogue's store boxes alike. */
bool encode_chunks(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t outer, int64_t row_elems,
                   int64_t outer_elems) {
    static_assert(mok_sm90::MN_CHUNK == 64 && mok_sm90::BK == 64, "one box shape serves loads and stores");
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)outer};
    const cuuint64_t strides[2] = {(cuuint64_t)row_elems * 2, (cuuint64_t)outer_elems * 2};
    const cuuint32_t box[3] = {mok_sm90::MN_CHUNK, mok_sm90::BK, 1};
    return encode(map, base, 3, dims, strides, box);
}

/* An N-major (MN-major) operand [outer, K, N] (N contiguous). */
bool encode_mn_major(CUtensorMap* map, const void* base, int64_t N, int64_t K, int64_t outer) {
    return encode_chunks(map, base, N, K, outer, N, N * K);
}

/* CTAs per cluster: 1, or 2 with MOK_SM90_CLUSTER=2 (a pair of M-tiles sharing B through TMA
 * multicast; read on every call, so benchmarks and tests can compare both).
 * NOTE: pairs are opt-in: with constant data (benchmarks/sm90_gemm_timing.cu) they were 1-10%
 * slower than single CTAs on every shape measured (performance log v13). */
int cluster_size() {
    const char* env = getenv("MOK_SM90_CLUSTER");
    return env && env[0] == '2' ? 2 : 1;
}

template <bool kSwiGLU, bool kGather, bool kBMN, bool kWgrad, int kCluster, bool kQdqA>
int launch_cluster(const CUtensorMap& tma_a, const CUtensorMap& tma_b, const CUtensorMap& tma_out,
                   const CUtensorMap& tma_act, const mok_sm90::params& p, int num_sms, cudaStream_t stream) {
    auto kernel = mok_sm90::grouped_gemm_bf16_nt_kernel<kSwiGLU, kGather, kBMN, kWgrad, kCluster, kQdqA>;
    const int smem = (int)sizeof(mok_sm90::smem_layout) + 1024;
    static bool configured = false;
    if (!configured) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
            return mok_launch_status();
        configured = true;
    }
    /* ---- units of kCluster M-tiles; every CTA of a cluster walks the same units ---- */
    const int64_t unit_m = (int64_t)mok_sm90::BM * kCluster;
    const int64_t units = kWgrad ? p.E * mok_ceil_div(p.M, unit_m) * p.num_n_tiles
                                 : mok_ceil_div(p.R, unit_m) * p.num_n_tiles;
    if (kCluster == 1) {
        kernel<<<mok_sched_grid(units, num_sms, 1), mok_sm90::kThreads, smem, stream>>>(tma_a, tma_b, tma_out, tma_act,
                                                                                       p);
        return mok_launch_status();
    }
    static int max_clusters = 0;
    return mok_launch_persistent_clusters(kernel, kCluster, units, num_sms, mok_sm90::kThreads, smem, stream,
                                          &max_clusters, tma_a, tma_b, tma_out, tma_act, p);
}

template <bool kSwiGLU, bool kGather, bool kBMN, bool kWgrad = false, bool kQdqA = false>
int launch(const CUtensorMap& tma_a, const CUtensorMap& tma_b, const CUtensorMap& tma_out, const CUtensorMap& tma_act,
           const mok_sm90::params& p, int num_sms, cudaStream_t stream) {
    /* NOTE: a pair needs two SMs of one GPC; with fewer SMs than that, one CTA per cluster. */
    if (cluster_size() == 2 && num_sms >= 2)
        return launch_cluster<kSwiGLU, kGather, kBMN, kWgrad, 2, kQdqA>(tma_a, tma_b, tma_out, tma_act, p, num_sms,
                                                                        stream);
    return launch_cluster<kSwiGLU, kGather, kBMN, kWgrad, 1, kQdqA>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream);
}

}  // namespace

extern "C" int mok_grouped_gemm_sm90_supported(const struct mok_grouped_gemm_args* a) {
    /* NOTE: read on every call (cheap), so tests and benchmarks can compare both kernels. */
    const char* env = getenv("MOK_DISABLE_SM90");
    if ((env && env[0] && env[0] != '0') || a->dtype != MOK_BF16) return 0;
    if (!a->trans_b && a->swiglu_out) return 0; /* SwiGLU reads gate and up rows of a K-major weight */
    if (a->Kd <= 0 || a->Kd % 8 || a->N % 8 || a->E < 1 || a->E > MOK_INT32_LIMIT) return 0;
    if (a->swiglu_out && (a->N / 2) % 8) return 0;
    if (a->a_gather && (a->a_gather_div < 1 || a->a_gather_div > MOK_INT32_LIMIT)) return 0;
    if (((uintptr_t)a->a | (uintptr_t)a->b | (uintptr_t)a->out) % 16) return 0;
    if (a->swiglu_out && (uintptr_t)a->swiglu_out % 16) return 0;
    /* the on-load qdq's variants (the launcher builds only these) */
    if (a->qdq_a_mxfp8 && (a->swiglu_out != NULL) != (a->a_gather != NULL)) return 0;
    if (a->b_second) {
        /* split weights: gate | up rows (NT SwiGLU) or K halves whose K-blocks never straddle (NN) */
        if (a->trans_b ? a->swiglu_out == NULL : (a->Kd % 2 || (a->Kd / 2) % mok_sm90::BK)) return 0;
        if (!mok_sm90_planes_ok(a->b, a->b_second) || a->qdq_a_mxfp8) return 0;
    }
    return is_hopper() && encode_fn() != NULL;
}

extern "C" int mok_grouped_gemm_sm90(const struct mok_grouped_gemm_args* a, cudaStream_t stream) {
    const bool swiglu = a->swiglu_out != NULL;
    const bool gather = a->a_gather != NULL;
    mok_sm90::params p;
    p.a = static_cast<const __nv_bfloat16*>(a->a);
    p.a_gather = a->a_gather;
    p.a_gather_div = (int32_t)(gather ? a->a_gather_div : 1);
    p.offsets = a->offsets;
    p.E = (int32_t)a->E;
    p.R = a->R;
    p.N = a->N;
    p.Kd = a->Kd;
    p.out = static_cast<__nv_bfloat16*>(a->out);
    p.swiglu_out = static_cast<__nv_bfloat16*>(a->swiglu_out);
    p.num_n_tiles = swiglu ? mok_ceil_div(a->N / 2, mok_sm90::BN / 2) : mok_ceil_div(a->N, mok_sm90::BN);
    p.M = 0;
    p.wa = p.wb = NULL;
    p.split_rows = 0;
    p.split_flip = 0;
    if (p.R == 0) return 0;
    if (a->b_second && !mok_grouped_gemm_sm90_supported(a)) return MOK_ERR_ARG;

    const cuuint64_t row_bytes = (cuuint64_t)a->Kd * 2;
    CUtensorMap tma_b, tma_a;
    if (a->trans_b && a->b_second) {
        /* ---- split SwiGLU weight: gate [E, I, K] and up [E, I, K] as planes of one [2, E, I, K] map ---- */
        const cuuint64_t I = (cuuint64_t)(a->N / 2);
        uint64_t plane_stride;
        const void* base = mok_sm90_split_base(a->b, a->b_second, &plane_stride, &p.split_flip);
        p.split_rows = (int64_t)I;
        const cuuint64_t b_dims[4] = {(cuuint64_t)a->Kd, I, (cuuint64_t)a->E, 2};
        const cuuint64_t b_strides[3] = {row_bytes, I * row_bytes, plane_stride};
        const cuuint32_t b_box[4] = {mok_sm90::BK, mok_sm90::BN / 2, 1, 1};
        if (!encode(&tma_b, base, 4, b_dims, b_strides, b_box)) return MOK_ERR_ARG;
    } else if (a->trans_b) {
        /* ---- B [E, N, K] viewed as [E, halves, Nh, K]: SwiGLU reads the gate half and the up half
         * of the same rows as two boxes; the plain GEMM has one half ---- */
        const cuuint64_t Nh = (cuuint64_t)(swiglu ? a->N / 2 : a->N);
        const cuuint64_t halves = swiglu ? 2 : 1;
        const cuuint64_t b_dims[4] = {(cuuint64_t)a->Kd, Nh, halves, (cuuint64_t)a->E};
        const cuuint64_t b_strides[3] = {row_bytes, Nh * row_bytes, (cuuint64_t)a->N * row_bytes};
        const cuuint32_t b_box[4] = {mok_sm90::BK, mok_sm90::BN / 2, 1, 1};
        if (!encode(&tma_b, a->b, 4, b_dims, b_strides, b_box)) return MOK_ERR_ARG;
    } else if (a->b_second) {
        /* ---- split NN weight: K halves [E, K / 2, N] as planes of one [2, E, K / 2, N] map ---- */
        const int64_t Kh = a->Kd / 2;
        uint64_t plane_stride;
        const void* base = mok_sm90_split_base(a->b, a->b_second, &plane_stride, &p.split_flip);
        p.split_rows = Kh;
        const cuuint64_t dims[4] = {(cuuint64_t)a->N, (cuuint64_t)Kh, (cuuint64_t)a->E, 2};
        const cuuint64_t strides[3] = {(cuuint64_t)a->N * 2, (cuuint64_t)(Kh * a->N * 2), plane_stride};
        const cuuint32_t box[4] = {mok_sm90::MN_CHUNK, mok_sm90::BK, 1, 1};
        if (!encode(&tma_b, base, 4, dims, strides, box)) return MOK_ERR_ARG;
    } else {
        /* ---- B [E, K, N], N contiguous: MN-major chunks ---- */
        if (!encode_mn_major(&tma_b, a->b, a->N, a->Kd, a->E)) return MOK_ERR_ARG;
    }
    if (gather) {
        tma_a = tma_b; /* unused by the gathering kernel */
    } else {
        const cuuint64_t a_dims[2] = {(cuuint64_t)a->Kd, (cuuint64_t)a->R};
        const cuuint64_t a_strides[1] = {row_bytes};
        const cuuint32_t a_box[2] = {mok_sm90::BK, mok_sm90::BM};
        if (!encode(&tma_a, a->a, 2, a_dims, a_strides, a_box)) return MOK_ERR_ARG;
    }
    /* ---- epilogue maps: out [R, N], or h [R, 2, I] (gate | up) and act [R, I] ---- */
    CUtensorMap tma_out, tma_act;
    if (swiglu) {
        /* NOTE: h as [R, 2, I], so that a gate box never spills into the up half when I % 64 != 0. */
        const int64_t I = a->N / 2;
        const cuuint64_t h_dims[3] = {(cuuint64_t)I, 2, (cuuint64_t)a->R};
        const cuuint64_t h_strides[2] = {(cuuint64_t)I * 2, (cuuint64_t)a->N * 2};
        const cuuint32_t h_box[3] = {mok_sm90::MN_CHUNK, 1, 64};
        if (!encode(&tma_out, a->out, 3, h_dims, h_strides, h_box)) return MOK_ERR_ARG;
        if (!encode_chunks(&tma_act, a->swiglu_out, I, a->R, 1, I, I * a->R)) return MOK_ERR_ARG;
    } else {
        if (!encode_chunks(&tma_out, a->out, a->N, a->R, 1, a->N, a->N * a->R)) return MOK_ERR_ARG;
        tma_act = tma_out;
    }
    const int num_sms = a->num_sms > 0 ? a->num_sms : mok_num_sms();
    if (a->qdq_a_mxfp8) {
        /* ---- A's rows qdq'd to MXFP8 on load (supported: SwiGLU with gathered A, plain with TMA A) ---- */
        if (swiglu) return launch<true, true, false, false, true>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream);
        return a->trans_b ? launch<false, false, false, false, true>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream)
                          : launch<false, false, true, false, true>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream);
    }
    if (swiglu) {
        return gather ? launch<true, true, false>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream)
                      : launch<true, false, false>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream);
    }
    if (!a->trans_b) {
        return gather ? launch<false, true, true>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream)
                      : launch<false, false, true>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream);
    }
    return gather ? launch<false, true, false>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream)
                  : launch<false, false, false>(tma_a, tma_b, tma_out, tma_act, p, num_sms, stream);
}

extern "C" int mok_grouped_gemm_wgrad_sm90_supported(int64_t R, int64_t E, int64_t M, int64_t N, int split) {
    const char* env = getenv("MOK_DISABLE_SM90");
    if (env && env[0] && env[0] != '0') return 0;
    if (R <= 0 || M % 8 || N % 8 || M <= 0 || N <= 0 || E < 1 || R > MOK_INT32_LIMIT) return 0;
    /* split output: every 64-row store chunk in one half */
    if (split && (M % 2 || (M / 2) % 64)) return 0;
    return is_hopper() && encode_fn() != NULL;
}

extern "C" int mok_grouped_gemm_wgrad_sm90(const void* a, const void* b, const int32_t* offsets, int64_t R,
                                           int64_t E, int64_t M, int64_t N, void* out, void* out_second,
                                           int num_sms, cudaStream_t stream) {
    mok_sm90::params p;
    p.a = NULL;
    p.a_gather = NULL;
    p.a_gather_div = 1;
    p.offsets = offsets;
    p.E = (int32_t)E;
    p.R = R;
    p.N = N;
    p.Kd = 0;
    p.out = static_cast<__nv_bfloat16*>(out);
    p.swiglu_out = NULL;
    p.num_n_tiles = mok_ceil_div(N, mok_sm90::BN);
    p.M = M;
    p.wa = static_cast<const __nv_bfloat16*>(a);
    p.wb = static_cast<const __nv_bfloat16*>(b);
    p.split_rows = 0;
    p.split_flip = 0;
    /* ---- a [R, M] and b [R, N]: the contraction (rows) is the outer dimension of both, so both
     * are MN-major operands ---- */
    CUtensorMap tma_a, tma_b;
    if (!encode_mn_major(&tma_a, a, M, R, 1)) return MOK_ERR_ARG;
    if (!encode_mn_major(&tma_b, b, N, R, 1)) return MOK_ERR_ARG;
    CUtensorMap tma_out;
    if (out_second) {
        /* ---- split output: rows [0, M / 2) and [M / 2, M) of [E, M / 2, N] each, as planes of one
         * [2, E, M / 2, N] map ---- */
        if (M % 2 || (M / 2) % 64 || !mok_sm90_planes_ok(out, out_second)) return MOK_ERR_ARG;
        const int64_t Mh = M / 2;
        uint64_t plane_stride;
        const void* base = mok_sm90_split_base(out, out_second, &plane_stride, &p.split_flip);
        p.split_rows = Mh;
        const cuuint64_t dims[4] = {(cuuint64_t)N, (cuuint64_t)Mh, (cuuint64_t)E, 2};
        const cuuint64_t strides[3] = {(cuuint64_t)N * 2, (cuuint64_t)(Mh * N * 2), plane_stride};
        const cuuint32_t box[4] = {mok_sm90::MN_CHUNK, mok_sm90::BK, 1, 1};
        if (!encode(&tma_out, base, 4, dims, strides, box)) return MOK_ERR_ARG;
    } else if (!encode_chunks(&tma_out, out, N, M, E, N, M * N)) {
        return MOK_ERR_ARG;
    }
    return launch<false, false, false, true>(tma_a, tma_b, tma_out, tma_out, p, num_sms > 0 ? num_sms : mok_num_sms(),
                                             stream);
}
