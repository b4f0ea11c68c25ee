/*
 * mok CUDA launchers: the C ABI between csrc/torch and the kernels. No torch types here.
 *
 * Every launcher is `int mok_<name>(const struct mok_<name>_args*, cudaStream_t)`: it checks its
 * arguments, launches on the given stream and returns 0, or a negative mok_status (mok_core.h) for
 * bad arguments, or a positive cudaError_t when a launch failed. Launchers never synchronise.
 *
 * The semantics of each op are those of the function of the same stem in csrc/core/mok_core.h
 * (the CPU oracle); only the storage differs (device pointers). Data pointers carry a mok_dtype;
 * MOK_BF16, MOK_F16, MOK_F32 and MOK_F64 are supported everywhere unless noted; weights are in the
 * accumulation type (float, or double for MOK_F64). All reductions run in a fixed order: results
 * are bitwise reproducible run to run.
 */
#ifndef MOK_CUDA_H
#define MOK_CUDA_H

#include <stdint.h>
#include <cuda_runtime.h>

#include "../core/mok_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Error bits a kernel ORs into the host-mapped error word (args.error_flag, may be NULL). */
enum {
    MOK_DEVICE_ERR_EXPERT_ID = 1,      /* an expert id outside [0, E) with skip_invalid == 0 */
    MOK_DEVICE_ERR_UNALIGNED_PLAN = 2, /* a kernel that needs 128-aligned expert offsets got others */
};

struct mok_route_topk_args {
    const void* logits; /* [T, E], MOK_F32 or MOK_F64 */
    const void* bias;   /* [E] same dtype, or NULL */
    mok_dtype dtype;
    int64_t T, E, K;
    int score_func; /* mok_score_func */
    int64_t n_group, topk_group;
    int renormalize;
    double scaling;
    int32_t* topk_idx; /* [T, K] */
    void* topk_w;      /* [T, K] dtype */
};
/* CUDA limits and choices: 1 <= E <= 512 (larger E is MOK_ERR_ARG); one warp per token; the softmax
 * denominator and renormalisation sums run serially in increasing index order (the core's order);
 * selection ranks NaN below every number (ties, NaN among NaN included, go to the lower id). */
int mok_route_topk_cuda(const struct mok_route_topk_args* args, cudaStream_t stream);

struct mok_route_topk_backward_args {
    const void* grad_w;       /* [T, K] */
    const void* logits;       /* [T, E] */
    const int32_t* topk_idx;  /* [T, K] */
    mok_dtype dtype;          /* MOK_F32 or MOK_F64 */
    int64_t T, E, K;
    int score_func;
    int renormalize;
    double scaling;
    void* grad_logits;        /* [T, E] */
};
int mok_route_topk_backward_cuda(const struct mok_route_topk_backward_args* args, cudaStream_t stream);

struct mok_plan_build_args {
    const int32_t* topk_idx; /* [T, K] */
    int64_t T, K, E, tile, capacity;
    int skip_invalid;
    int32_t* counts;      /* [E] */
    int32_t* offsets;     /* [E + 1] */
    int32_t* row_of;      /* [T * K] */
    int32_t* src_of_row;  /* [capacity] */
    int32_t* num_skipped; /* [1] */
    void* workspace;      /* device scratch of mok_plan_workspace_bytes(T, K, E) bytes */
    int32_t* error_flag;  /* host-mapped error word or NULL; MOK_DEVICE_ERR_EXPERT_ID is ORed in */
};
size_t mok_plan_workspace_bytes(int64_t T, int64_t K, int64_t E);
/* Invalid ids with skip_invalid == 0 cannot be reported synchronously (no host sync): such pairs
 * are treated as skipped (row -1, counted in num_skipped) and MOK_DEVICE_ERR_EXPERT_ID is set. */
int mok_plan_build_cuda(const struct mok_plan_build_args* args, cudaStream_t stream);

struct mok_gather_rows_args {
    const void* x; /* [T, H] */
    mok_dtype dtype;
    int64_t T, H, K, R;
    const int32_t* src_of_row; /* [R] */
    const void* w;             /* [T * K] accumulation type, or NULL */
    void* out;                 /* [R, H] */
    /* [T, K] or NULL: the plan's inverse map (row of pair t * K + k). Only a speed hint: plain bf16
     * copies (w NULL) with 4 <= K <= 32 then walk the tokens (x read once); the result is the same
     * whatever it holds. */
    const int32_t* row_of;
};
int mok_gather_rows_cuda(const struct mok_gather_rows_args* args, cudaStream_t stream);

struct mok_combine_args {
    const void* rows; /* [R, H] */
    mok_dtype dtype;
    int64_t R, H, T, K;
    const int32_t* row_of; /* [T, K] */
    const void* w;         /* [T, K] accumulation type, or NULL */
    void* y;               /* [T, H] */
};
/* CUDA: row_of entries >= R (or < 0) are skipped; src_of_row entries >= T * K in gather_rows give a
 * zero row (out-of-range indices cannot be reported without a host sync). */
int mok_combine_cuda(const struct mok_combine_args* args, cudaStream_t stream);

struct mok_combine_weight_grad_args {
    const void* dy;   /* [T, H] */
    const void* rows; /* [R, H] */
    mok_dtype dtype;
    int64_t R, H, T, K;
    const int32_t* row_of; /* [T, K] */
    void* d_w;             /* [T, K] accumulation type */
};
/* CUDA: the sum over h is a fixed-shape reduction (32 lane-strided partials, then a fixed shuffle
 * tree): deterministic, equal to the core's serial sum up to rounding. */
int mok_combine_weight_grad_cuda(const struct mok_combine_weight_grad_args* args, cudaStream_t stream);

struct mok_swiglu_args {
    const void* h;     /* [R, 2I] */
    const void* d_act; /* [R, I], backward only */
    mok_dtype dtype;
    int64_t R, I;
    void* out; /* forward: act [R, I]; backward: d_h [R, 2I] */
};
int mok_swiglu_forward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream);
int mok_swiglu_backward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream);

/* mok_swiglu_scaled_backward (mok_core.h) on the GPU: s[r] = w[src_of_row[r]] (0 for src < 0 or
 * src >= n_pairs). d_s is a fixed-shape per-row reduction: deterministic, equal to the core's
 * serial sum up to rounding. */
struct mok_swiglu_scaled_backward_args {
    const void* h;   /* [R, 2I] */
    const void* d_z; /* [R, I] */
    mok_dtype dtype;
    int64_t R, I;
    const int32_t* src_of_row; /* [R] */
    const void* w;             /* [n_pairs] accumulation type */
    int64_t n_pairs;
    void* d_h; /* [R, 2I] */
    void* z;   /* [R, I] */
    void* d_s; /* [R] accumulation type */
};
int mok_swiglu_scaled_backward_cuda(const struct mok_swiglu_scaled_backward_args* args, cudaStream_t stream);

/* Grouped GEMM over the plan's rows (see mok_grouped_gemm in mok_core.h). With swiglu_out != NULL
 * (NT only, N even) the epilogue also writes swiglu_out[r, :N/2] = silu(out[r, :N/2]) * out[r, N/2:]
 * computed from the rounded values of out (so it equals mok_swiglu_forward applied to out). */
struct mok_grouped_gemm_args {
    const void* a;             /* [Ra, Kd] */
    const int32_t* a_gather;   /* [R] or NULL */
    int64_t a_gather_div;
    const void* b;             /* NT: [E, N, Kd]; NN: [E, Kd, N] */
    mok_dtype dtype;
    const int32_t* offsets;    /* [E + 1], device */
    int64_t R, E, N, Kd;
    int trans_b;
    void* out;                 /* [R, N] */
    void* swiglu_out;          /* [R, N / 2] or NULL */
    int num_sms;               /* persistent grid size hint (0: query the device) */
    int qdq_a_mxfp8;           /* 1: A's rows are quantise-dequantised to MXFP8 (1 x 32 blocks along Kd,
                                * mok_qdq_mxfp8_rows) as they are loaded; bf16 on the sm_90a kernel only
                                * (mok_grouped_gemm_sm90_supported), else MOK_ERR_ARG: the caller makes
                                * the row-wise copy instead */
    const void* b_second;      /* NULL, or B's second half as its own tensor (torchtitan's w3 beside w1):
                                * NT with SwiGLU: b holds the gate rows [E, N / 2, Kd] and b_second the
                                * up rows; NN: b holds K rows [0, Kd / 2) [E, Kd / 2, N] and b_second the
                                * rest. The sm_90a kernel only (mok_grouped_gemm_sm90_supported; NN needs
                                * Kd / 2 % 64 == 0), else MOK_ERR_ARG: the caller concatenates instead */
};
/* CUDA: a persistent kernel; the SwiGLU epilogue is a second kernel on the same stream
 * (mok_swiglu_forward_cuda on out), so it is exactly mok_swiglu_forward of the rounded out. */
int mok_grouped_gemm_cuda(const struct mok_grouped_gemm_args* args, cudaStream_t stream);

struct mok_grouped_gemm_wgrad_args {
    const void* a;            /* [R, M] */
    const void* b;            /* [Rb, N] */
    const int32_t* b_gather;  /* [R] or NULL */
    int64_t b_gather_div;
    mok_dtype dtype;
    const int32_t* offsets;   /* [E + 1], device */
    int64_t R, E, M, N;
    void* out;                /* [E, M, N] */
    int num_sms;
};
int mok_grouped_gemm_wgrad_cuda(const struct mok_grouped_gemm_wgrad_args* args, cudaStream_t stream);

/* FP8 E4M3 block quantisation (mok_quantize_* in mok_core.h, bit-exact with it). */
enum mok_fp8_recipe {
    MOK_FP8_BLOCKWISE_1X128 = 0,   /* fp32 scales [M, ceil(N / 128)] */
    MOK_FP8_BLOCKWISE_128X128 = 1, /* fp32 scales [ceil(M / 128), ceil(N / 128)] */
    MOK_FP8_MXFP8 = 2,             /* E8M0 codes [M, ceil(N / 32)] */
};
struct mok_quantize_fp8_args {
    const void* x; /* [M, N] */
    mok_dtype dtype;
    int64_t M, N;
    int recipe;    /* mok_fp8_recipe */
    uint8_t* q;    /* [M, N] E4M3 codes */
    void* scales;  /* float or uint8, by recipe */
};
int mok_quantize_fp8_cuda(const struct mok_quantize_fp8_args* args, cudaStream_t stream);

/* Row-wise and column-wise copies from one read of x (bf16 only; recipes 1x128 and mxfp8):
 * (q, scales) as mok_quantize_fp8_cuda(x), (qt, scales_t) as mok_quantize_fp8_cuda(x^T contiguous).
 * Recipe 128x128 (expert weights [E, N, K] as x [E * N, K], with col_tile and batch_rows = N, a multiple
 * of 128; no src_of_row, no scales_t_mn_major): (q, scales) as mok_quantize_fp8_cuda(x), and per expert e
 * qt[e] [K, N] = q[e]^T with scales_t[e] [ceil(K / 128), N / 128] = scales[e]^T; or, with qt and scales_t
 * NULL, (q, scales) alone.
 * With src_of_row set, the copies of the gathered rows instead: of x_rows [M, N] = gather_rows(x,
 * src_of_row, w, K) (row m is x[src_of_row[m] / K], times w[src_of_row[m]] rounded to bf16 when w is
 * set, zeros where src_of_row[m] is outside [0, T * K), as mok_gather_rows_cuda), without writing x_rows. */
struct mok_quantize_fp8_rowcol_args {
    const void* x;  /* [M, N], or [T, N] with src_of_row */
    mok_dtype dtype;
    int64_t M, N;
    int recipe;     /* MOK_FP8_BLOCKWISE_1X128 or MOK_FP8_MXFP8 */
    uint8_t* q;     /* [M, N] */
    void* scales;   /* [M, ceil(N / B)] */
    uint8_t* qt;    /* [N, M] */
    void* scales_t; /* [N, ceil(M / B)], or [ceil(M / B), N] with scales_t_mn_major */
    int scales_t_mn_major; /* scales_t transposed (MN-major: the FP8 weight gradient's operand layout) */
    int col_tile;          /* blockwise only: qt in 128 x 128 blocks, quantize(x^T, "blockwise_128x128"):
                            * scales_t [ceil(N / 128), ceil(M / 128)] (MN-major: [ceil(M / 128), ceil(N / 128)]) */
    const int32_t* src_of_row; /* [M] or NULL */
    const float* w;            /* [T * K] or NULL (with src_of_row only) */
    int64_t T, K;              /* with src_of_row: rows of x and the plan's top_k (K >= 1) */
    int64_t batch_rows;        /* recipe 128x128: rows per expert (qt [M / batch_rows, N, batch_rows]) */
    const void* x_up;          /* recipe 128x128 or NULL: x [E, batch_rows / 2, N] and x_up the same are the two
                                * halves of each expert's rows (a multiple of 128 each): the copies of their
                                * concatenation along the rows, which is never made */
};
int mok_quantize_fp8_rowcol_cuda(const struct mok_quantize_fp8_rowcol_args* args, cudaStream_t stream);

/* SwiGLU (forward: act [R, I] from h [R, 2I]) or its gradient (backward: d_h [R, 2I] from h and d_act
 * [R, I]) quantised 1 x 128 (blockwise_1x128) in the same pass: q / scales (row-wise) when q is set,
 * qt / scales_t (column-wise, of the result's transpose) when qt is set, the bf16 result when out is
 * set. Bit for bit mok_swiglu_{forward,backward}_cuda then mok_quantize_fp8{,_rowcol}_cuda. bf16;
 * needs I % 128 == 0 and 16-byte aligned h, d_act and out. */
struct mok_swiglu_quantize_fp8_args {
    const void* h;     /* [R, 2I] */
    const void* d_act; /* [R, I]; NULL: forward */
    int64_t R, I;
    void* out;         /* act [R, I] or d_h [R, 2I], or NULL */
    uint8_t* q;        /* [R, N] (N = I forward, 2I backward), or NULL */
    float* scales;     /* [R, N / 128] */
    uint8_t* qt;       /* [N, R], or NULL */
    float* scales_t;   /* [N, ceil(R / 128)]; col_tile: [ceil(N / 128), ceil(R / 128)]; transposed when
                        * scales_t_mn_major */
    int scales_t_mn_major; /* the FP8 weight gradient's operand layout, written by the kernel */
    int col_tile;          /* the column-wise copy in 128 x 128 blocks (quantize(y^T, "blockwise_128x128")) */
    /* Row-scaled (v53; the all-FP8 layer's router weights, z = s * act): with row_scale set, forward
     * (needs qt): the column-wise copy is of z = bf16(s[r] * act[r]), the row-wise copy and out stay
     * act's; backward: d_act holds d_z and y = mok_swiglu_scaled_backward(h, d_z, s)'s d_h, with
     * d_s_part[tn * R + r] = sum over columns [128 tn, 128 tn + 128) of d_z[r, j] * act[r, j] (a
     * fixed-shape sum; the caller adds the I / 128 partials in a fixed order). */
    const float* row_scale; /* [R] or NULL */
    float* d_s_part;        /* [I / 128, R]: backward with row_scale */
};
int mok_swiglu_quantize_fp8_cuda(const struct mok_swiglu_quantize_fp8_args* args, cudaStream_t stream);

struct mok_dequantize_fp8_args {
    const uint8_t* q;
    const void* scales;
    int64_t M, N;
    int recipe;
    float* y;      /* [M, N] */
};
int mok_dequantize_fp8_cuda(const struct mok_dequantize_fp8_args* args, cudaStream_t stream);

/* Batched transpose of 1-byte elements (FP8 codes): out[b, c, r] = in[b, r, c], in [B, R, C] and out
 * [B, C, R] contiguous, 16-byte aligned, R and C multiples of 16 (transpose_bytes.cu). MOK_OK,
 * MOK_ERR_ARG, or the launch's CUDA error. */
int mok_transpose_bytes_cuda(const void* in, void* out, int64_t B, int64_t R, int64_t C, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MOK_CUDA_H */
