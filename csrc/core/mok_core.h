/*
 * mok core: the plain-C (C11) host library. It is the CPU implementation of every mok op and the
 * bit-exact oracle for the GPU kernels. No torch, no CUDA.
 *
 * Conventions shared by every function here:
 * - Tensors are dense, row-major, contiguous; shapes are given as int64_t.
 * - Data tensors ("void*" + mok_dtype) are MOK_BF16 (uint16_t bit patterns), MOK_F16 (uint16_t bit
 *   patterns), MOK_F32 or MOK_F64. Arithmetic is done in the "accumulation type" of the dtype:
 *   double for MOK_F64, float for everything else. Weight vectors (router weights, combine weights)
 *   are given in the accumulation type (float*, or double* when the data is MOK_F64).
 * - Index tensors are int32_t.
 * - Functions return MOK_OK (0) or a negative mok_status; they never print and never abort.
 * - Every reduction runs in a fixed order, so results are bitwise reproducible.
 */
#ifndef MOK_CORE_H
#define MOK_CORE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MOK_F32 = 0,
    MOK_F64 = 1,
    MOK_BF16 = 2,
    MOK_F16 = 3,
} mok_dtype;

typedef enum {
    MOK_OK = 0,
    MOK_ERR_ARG = -1,        /* a size or pointer argument is invalid (negative size, NULL, ...) */
    MOK_ERR_EXPERT_ID = -2,  /* an expert id outside [0, num_experts) and skip_invalid == 0 */
    MOK_ERR_CAPACITY = -3,   /* the plan's capacity is smaller than mok_plan_capacity() */
    MOK_ERR_DTYPE = -4,      /* unsupported dtype */
} mok_status;
/* (Clarification: the CPU routing functions also return MOK_ERR_ARG if their O(E) scratch memory
 * cannot be allocated; nothing else in the core allocates.) */

/* A short English name of a status code ("expert id out of range", ...). */
const char* mok_status_string(int status);

/* ------------------------------------------------------------------------------------------------
 * Scalar conversions (all exact bit-level specifications, tested exhaustively in tests/test_core.c)
 * ---------------------------------------------------------------------------------------------- */

/* bf16: round-to-nearest-even from float; NaN stays NaN (quiet, sign kept). */
uint16_t mok_f32_to_bf16(float x);
float mok_bf16_to_f32(uint16_t v);
/* IEEE half, round-to-nearest-even, overflow to Inf (the IEEE rule), NaN stays NaN. */
uint16_t mok_f32_to_f16(float x);
float mok_f16_to_f32(uint16_t v);

/* FP8 E4M3 (OCP "e4m3fn": bias 7, no Inf, NaN = S.1111.111, max finite 448).
 * Encoding is round-to-nearest-even with saturation (PTX cvt.rn.satfinite): |x| > 448 and +-Inf
 * become +-448, NaN becomes 0x7F (0xFF if the sign bit is set). Subnormals are produced. */
uint8_t mok_f32_to_e4m3(float x);
float mok_e4m3_to_f32(uint8_t v);
/* FP8 E5M2 (bias 15, IEEE-like). Encoding is RNE with saturation: |x| > 57344 and +-Inf become
 * +-57344, NaN becomes 0x7F / 0xFF. Decoding maps 0x7C/0xFC to +-Inf and 0x7D-0x7F to NaN. */
uint8_t mok_f32_to_e5m2(float x);
float mok_e5m2_to_f32(uint8_t v);
/* E8M0 scale (OCP MX): value 2^(v - 127); v = 0xFF is NaN. */
float mok_e8m0_to_f32(uint8_t v);
/* The MXFP8 scale of a block with absolute maximum amax, by the RCEIL rule: the smallest power of
 * two 2^e with amax / 2^e <= 448, i.e. e = ceil(log2(amax / 448)) computed exactly from the bits of
 * the float amax / 448.0f, clamped to [-127, 127]. amax == 0 gives e = -127 (code 0). A NaN or Inf
 * amax gives the NaN code 0xFF. Returns the E8M0 code e + 127. */
uint8_t mok_e8m0_rceil_from_amax(float amax);

/* ------------------------------------------------------------------------------------------------
 * Block quantisation to FP8 E4M3.
 * x is [M, N] (row-major, dtype dt); q is [M, N] E4M3 codes. Blocks run along N (the GEMM's K dim).
 * Partial blocks at the end of a row (N % B != 0) or at the bottom (M % B != 0 for BxB) cover
 * the elements that exist.
 * ---------------------------------------------------------------------------------------------- */

/* Blockwise (DeepSeek-V3) 1xB: for each row and each block of B columns, amax = max |x| over the
 * block, scale = amax / 448.0f (float division), q = e4m3(x / scale) (float division, RNE, sat).
 * amax == 0 gives scale = 1.0f (all codes 0). A block that holds NaN or Inf gets scale = NaN and
 * every code 0x7F. scales is [M, ceil(N/B)] float. */
/* (Clarification: MOK_F64 input is first rounded to float; all block arithmetic is in float. If
 * amax / 448.0f underflows to 0 for a nonzero amax (amax < ~6.3e-43), the literal rule applies:
 * scale = 0 and x / 0 gives +-448 codes, and 0x7F for zero elements of that block.) */
int mok_quantize_blockwise_1xb(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, uint8_t* q,
                               float* scales);
/* Blockwise BxB (weights): the same rule with one amax per BxB tile; scales is
 * [ceil(M/B), ceil(N/B)] float. */
int mok_quantize_blockwise_bxb(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, uint8_t* q,
                               float* scales);
/* MXFP8 1xB (B = 32 for MXFP8): code = mok_e8m0_rceil_from_amax(amax); q = e4m3(x * 2^-e) where
 * x * 2^-e is computed exactly (ldexpf); a NaN scale code (NaN/Inf in the block) gives every code
 * 0x7F. scales is [M, ceil(N/B)] uint8 E8M0 codes. */
int mok_quantize_mx_1xb(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, uint8_t* q, uint8_t* scales);

/* Dequantisation: y = e4m3_to_f32(q) * scale, written as float [M, N]. */
int mok_dequantize_blockwise_1xb(const uint8_t* q, const float* scales, int64_t M, int64_t N, int64_t B, float* y);
int mok_dequantize_blockwise_bxb(const uint8_t* q, const float* scales, int64_t M, int64_t N, int64_t B, float* y);
int mok_dequantize_mx_1xb(const uint8_t* q, const uint8_t* scales, int64_t M, int64_t N, int64_t B, float* y);

/* MXFP8 quantise-dequantise ("qdq") of bf16 x [M, N] into bf16 y [M, N] (bf16 bit patterns, same
 * layout): each element becomes the value of its MXFP8 encoding, mok_quantize_mx_1xb's rule with
 * B = 32 (RCEIL E8M0 scale from the block's amax, E4M3 code by RNE with saturation) followed by
 * mok_dequantize_mx_1xb's e4m3(code) * 2^e, rounded to bf16. That rounding is exact: for bf16
 * inputs every such value is a bf16 value (or +-Inf: elements with |x| >= 1.9375 * 2^127 round
 * to 2^128, in the fp32 dequantisation too), which test_core.c checks for every bf16 element and
 * every scale. So y is bit for bit bf16(dequantize(quantize(x))), and -0 stays -0.
 * A block holding NaN or Inf (NaN scale, NaN codes) becomes the quiet NaN 0x7fc0 in every element.
 *
 * rows: 1 x 32 blocks along N (the last block of a row may be partial); rows [r_begin, r_end).
 * cols: 32 x 1 blocks along M, i.e. of the columns, restarting at each segment start: segment e is
 *   rows [offsets[e], offsets[e+1]) (a plan's experts), whose last block may be partial; rows
 *   outside [offsets[0], offsets[E]) are written as +0 (a plan's unused rows). offsets NULL: one
 *   segment [0, M). Offsets must be non-negative, non-decreasing and offsets[E] <= M (else
 *   MOK_ERR_ARG). Columns [c_begin, c_end) are written (all their rows).
 * A plan padded to multiples of 32 gives the same y on the rows of its pairs as an unpadded one:
 * padding rows are zero and zeros do not change a block's amax. The CUDA kernel needs every
 * offsets[e] to be a multiple of 32 (its blocks are aligned to 32 rows of x). */
int mok_qdq_mxfp8_rows(const uint16_t* x, int64_t M, int64_t N, int64_t r_begin, int64_t r_end, uint16_t* y);
int mok_qdq_mxfp8_cols(const uint16_t* x, int64_t M, int64_t N, const int32_t* offsets, int64_t E, int64_t c_begin,
                       int64_t c_end, uint16_t* y);

/* ------------------------------------------------------------------------------------------------
 * Routing: top-k selection over router logits.
 * ---------------------------------------------------------------------------------------------- */

typedef enum { MOK_SCORE_SOFTMAX = 0, MOK_SCORE_SIGMOID = 1 } mok_score_func;

/* logits [T, E] (dt = MOK_F32 or MOK_F64), bias [E] in the same dtype or NULL.
 * For each token t:
 *   s = softmax(logits[t]) (max-subtracted, exp, divided by the sum) or sigmoid(logits[t]);
 *   c = s + bias (the "choice" score; bias affects selection only);
 *   if n_group > 1 (E % n_group == 0): experts form n_group groups of E/n_group consecutive ids;
 *     a group's score is the sum of its top min(2, E/n_group) choice scores; the topk_group groups
 *     with the highest score are kept (ties: lower group id first); other experts are excluded;
 *   the K experts with the highest c among the allowed ones are selected, ordered by descending c
 *     (ties: lower expert id first);
 *   every ranking here (group scores, a group's top two, the selection) puts NaN below every number,
 *     NaNs among themselves by lower id (a NaN logit's expert is chosen only when no number is left);
 *   w_k = s[idx_k]; if renormalize: w_k = w_k / (sum_k w_k + 1e-20); then w_k *= scaling.
 * Outputs topk_idx [T, K] int32 and topk_w [T, K] in dt. Requires 1 <= K <= E (and
 * K <= topk_group * E / n_group when grouped), else MOK_ERR_ARG. */
/* (Clarification: for MOK_F32, scaling and the 1e-20 are first rounded to float; every operation is
 * done in the accumulation type, in the order written above.) */
int mok_route_topk(const void* logits, const void* bias, mok_dtype dt, int64_t T, int64_t E, int64_t K,
                   int score_func, int64_t n_group, int64_t topk_group, int renormalize, double scaling,
                   int32_t* topk_idx, void* topk_w);

/* Gradient of topk_w with respect to logits for fixed topk_idx (bias and grouping carry no gradient):
 *   dsel_k = scaling * g_k                                         (no renormalisation)
 *   dsel_k = scaling * (g_k / S - sum_j g_j sel_j / S^2), S = sum_j sel_j + 1e-20   (renormalised)
 *   ds_e = sum of dsel_k over k with idx_k == e
 *   softmax: dlogit_e = s_e * (ds_e - sum_e' s_e' ds_e');  sigmoid: dlogit_e = ds_e * s_e * (1 - s_e)
 * grad_w [T, K], logits [T, E], grad_logits [T, E], all in dt. */
/* (Clarification: an id in topk_idx outside [0, E) gives MOK_ERR_EXPERT_ID.) */
int mok_route_topk_backward(const void* grad_w, const void* logits, const int32_t* topk_idx, mok_dtype dt, int64_t T,
                            int64_t E, int64_t K, int score_func, int renormalize, double scaling,
                            void* grad_logits);

/* ------------------------------------------------------------------------------------------------
 * Routing plan: where each (token, k) pair lives in the expert-ordered, tile-padded row space.
 * ---------------------------------------------------------------------------------------------- */

/* Static row capacity of a plan: round_up(T*K + min(E, T*K) * (tile - 1), tile); 0 when T*K == 0.
 * It bounds sum_e round_up(count_e, tile) for any routing. */
int64_t mok_plan_capacity(int64_t T, int64_t K, int64_t E, int64_t tile);
/* (Clarification: mok_plan_capacity returns -1 for a negative size or tile < 1. In mok_plan_build
 * num_skipped may be NULL; T * K and capacity must fit int32 (else MOK_ERR_ARG); outputs are
 * unspecified when an error is returned.) */

/* topk_idx [T, K] int32. Outputs:
 *   counts [E]        number of (t, k) pairs routed to expert e;
 *   offsets [E + 1]   first row of expert e; offsets[e+1] - offsets[e] = round_up(counts[e], tile);
 *                     offsets[E] is the number of rows in use (<= capacity);
 *   row_of [T * K]    row of pair (t, k), or -1 for a skipped pair;
 *   src_of_row [capacity]  t * K + k of the pair in that row, -1 for padding rows and unused rows;
 *   num_skipped [1]   number of pairs whose expert id was outside [0, E).
 * Rows of an expert hold its pairs in increasing t * K + k order (deterministic).
 * An id outside [0, E) is MOK_ERR_EXPERT_ID unless skip_invalid != 0, in which case the pair is
 * skipped and counted. capacity < mok_plan_capacity(T, K, E, tile) is MOK_ERR_CAPACITY. */
int mok_plan_build(const int32_t* topk_idx, int64_t T, int64_t K, int64_t E, int64_t tile, int64_t capacity,
                   int skip_invalid, int32_t* counts, int32_t* offsets, int32_t* row_of, int32_t* src_of_row,
                   int32_t* num_skipped);

/* ------------------------------------------------------------------------------------------------
 * Row movement: gather (dispatch) and weighted fixed-order combine.
 * ---------------------------------------------------------------------------------------------- */

/* out[r, :] = (w ? w[src] : 1) * x[src / K, :] for src = src_of_row[r] >= 0; out[r, :] = 0 for src < 0.
 * x [T, H], out [R, H] in dt; w [T * K] in the accumulation type or NULL. Rows [r_begin, r_end). */
int mok_gather_rows(const void* x, mok_dtype dt, int64_t T, int64_t H, int64_t K, const int32_t* src_of_row,
                    const void* w, int64_t r_begin, int64_t r_end, void* out);

/* y[t, :] = sum over k = 0..K-1 (in that order, skipping row_of[t, k] < 0) of
 *           (w ? w[t, k] : 1) * rows[row_of[t, k], :], accumulated in the accumulation type.
 * rows [R, H], y [T, H] in dt; w [T, K] in the accumulation type or NULL. Tokens [t_begin, t_end). */
/* (Clarification: a row_of value >= R in [t_begin, t_end) gives MOK_ERR_ARG before anything is written;
 * likewise a src_of_row value >= T * K in mok_gather_rows.) */
int mok_combine(const void* rows, mok_dtype dt, int64_t R, int64_t H, const int32_t* row_of, const void* w,
                int64_t K, int64_t t_begin, int64_t t_end, void* y);

/* d_w[t, k] = sum_h dy[t, h] * rows[row_of[t, k], h] (h in increasing order, accumulation type),
 * 0 where row_of[t, k] < 0. d_w [T, K] in the accumulation type. Tokens [t_begin, t_end). */
int mok_combine_weight_grad(const void* dy, const void* rows, mok_dtype dt, int64_t H, const int32_t* row_of,
                            int64_t K, int64_t t_begin, int64_t t_end, void* d_w);

/* ------------------------------------------------------------------------------------------------
 * SwiGLU on concatenated [gate | up] rows: h [R, 2I]; act [R, I] = silu(gate) * up,
 * silu(g) = g / (1 + exp(-g)). Backward: d_gate = d_act * up * sig(g) * (1 + g * (1 - sig(g))),
 * d_up = d_act * silu(g). Rows [r_begin, r_end).
 * ---------------------------------------------------------------------------------------------- */
int mok_swiglu_forward(const void* h, mok_dtype dt, int64_t I, int64_t r_begin, int64_t r_end, void* act);
int mok_swiglu_backward(const void* h, const void* d_act, mok_dtype dt, int64_t I, int64_t r_begin, int64_t r_end,
                        void* d_h);

/* Backward of the row-scaled SwiGLU z[r, :] = s[r] * act[r, :], act = SwiGLU(h) rounded to dt (the
 * forward's act), s[r] = w[src_of_row[r]] (accumulation type; 0 where src_of_row[r] < 0, a padding
 * row), for an incoming d_z [R, I]:
 *   d_h[r]  = the SwiGLU backward of h[r] for d_act = s[r] * d_z[r] (mok_swiglu_backward's formula)
 *   d_s[r]  = sum_j d_z[r, j] * act[r, j]   (j increasing, accumulation type)
 *   z[r]    = s[r] * act[r]                  (recomputed: the operand of a weight gradient)
 * In an MoE layer s is the router weight of the row's (token, k) pair: y = sum_k w * (act @ W^T)
 * equals the unweighted combine of z @ W^T, so this gives the router-weight gradient from d_z =
 * dy @ W (width I) instead of a dot product with the saved rows (width H). src_of_row entries must
 * be < n_pairs (the size of w). Rows [r_begin, r_end). */
int mok_swiglu_scaled_backward(const void* h, const void* d_z, mok_dtype dt, int64_t I, const int32_t* src_of_row,
                               const void* w, int64_t n_pairs, int64_t r_begin, int64_t r_end, void* d_h, void* z,
                               void* d_s);

/* ------------------------------------------------------------------------------------------------
 * Grouped GEMMs over the plan's row space (rows [offsets[e], offsets[e+1]) belong to expert e;
 * rows at or past offsets[E] are written as 0). Accumulation in the accumulation type, k in
 * increasing order; the result is rounded once to dt.
 * ---------------------------------------------------------------------------------------------- */

/* A row r of the GEMM reads a[a_row(r), :] where a_row(r) = r when a_gather is NULL, else
 * a_gather[r] / a_gather_div (a row of zeros when a_gather[r] < 0): gather-on-load of token rows.
 * trans_b != 0 ("NT"): out[r, n] = sum_k A[r, k] * b[e, n, k]   (b [E, N, Kd]);
 * trans_b == 0 ("NN"): out[r, n] = sum_k A[r, k] * b[e, k, n]   (b [E, Kd, N]).
 * out [R, N] in dt; rows [r_begin, r_end). */
int mok_grouped_gemm(const void* a, const int32_t* a_gather, int64_t a_gather_div, const void* b, mok_dtype dt,
                     const int32_t* offsets, int64_t E, int64_t N, int64_t Kd, int trans_b, int64_t r_begin,
                     int64_t r_end, void* out);

/* Weight gradient with a ragged contraction over each expert's rows:
 *   out[e, m, n] = sum_{r in [offsets[e], offsets[e+1])} a[r, m] * B[r, n]
 * where B[r, :] = b[b_row(r), :] with the same gather rule as above (b_gather may be NULL).
 * a [R, M], out [E, M, N] in dt; experts [e_begin, e_end). An expert with no rows gets zeros. */
int mok_grouped_gemm_wgrad(const void* a, const void* b, const int32_t* b_gather, int64_t b_gather_div, mok_dtype dt,
                           const int32_t* offsets, int64_t M, int64_t N, int64_t e_begin, int64_t e_end, void* out);

/* ------------------------------------------------------------------------------------------------
 * FP8 blockwise grouped GEMM "NT" (DeepSeek-V3's recipe), the CPU op and the oracle of the sm_90a
 * kernel: a [R, K] E4M3 codes with fp32 scales sa [R, ceil(K/128)] (mok_quantize_blockwise_1xb,
 * B = 128), b [E, N, K] E4M3 codes with fp32 scales sb [E, ceil(N/128), ceil(K/128)]
 * (mok_quantize_blockwise_bxb of b viewed as [E * N, K], B = 128). For offsets[e] <= r < offsets[e+1]:
 *   out[r, n] = sum_kb sa[r, kb] * sb[e, n / 128, kb] * sum_{k in block kb} A[r, k] * b[e, n, k]
 * Blocks cover k in [128 kb, min(128 kb + 128, K)). Arithmetic, in this order:
 *   s_kb = the block's sum of products of decoded codes, in double (exact: every product is a
 *          multiple of 2^-18 and |s_kb| < 2^25, so no rounding happens in any order);
 *   acc  = sum over kb in increasing order of s_kb * ((double)sa * (double)sb), in double
 *          (sa * sb is exact in double; one rounding per product and per sum);
 *   out  = mok_f32_to_bf16((float)acc): double -> float (RNE), then float -> bf16 (RNE). This
 *          double rounding can differ from a direct double -> bf16 rounding in one ulp of bf16 on
 *          rare ties; the GPU kernel (fp32 accumulation) is compared within a tolerance anyway.
 * NaN codes (0x7F / 0xFF) and NaN scales propagate to the rows they touch. Rows before offsets[0]
 * or at/after offsets[E] are written as +0. out [R, N] bf16 bit patterns; rows [r_begin, r_end).
 * a, sa, b, sb may be NULL when K == 0 (expert rows are then 0). Offsets must be non-negative and
 * non-decreasing (MOK_ERR_ARG otherwise); the CUDA kernel further needs K % 128 == N % 128 == 0 and
 * 128-aligned offsets, the core does not. */
int mok_grouped_gemm_fp8_blockwise(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                                   const int32_t* offsets, int64_t E, int64_t N, int64_t K, int64_t r_begin,
                                   int64_t r_end, uint16_t* out);

/* FP8 blockwise weight gradient (a K-grouped GEMM: the contraction runs over each expert's rows of
 * the plan's row space), the CPU op and the oracle of the sm_90a kernel. Both operands are
 * column-wise copies (mok_quantize_blockwise_1xb of the transposed tensors, B = 128): a [M, R] and
 * b [N, R] E4M3 codes with fp32 scales per 1x128 block along R, stored MN-major (the transposes of
 * the quantiser's [M, ceil(R/128)] scales, as the kernel reads them: one K-block's scales contiguous):
 * sa [ceil(R/128), M], sb [ceil(R/128), N]. For expert e with rows [lo, hi) = [offsets[e], offsets[e+1]):
 *   out[e, m, n] = sum_kb sa[kb, m] * sb[kb, n] * sum_{r in [lo, hi) and in block kb} A[m, r] * B[n, r]
 * Block kb covers rows [128 kb, 128 kb + 128); when offsets are not multiples of 128 a block may
 * straddle two experts, and each expert sums its own rows of it with the block's scales.
 * Arithmetic, in this order (as mok_grouped_gemm_fp8_blockwise):
 *   s_kb = the sum of products of decoded codes over the expert's rows of block kb, in double
 *          (exact: at most 128 products, each a multiple of 2^-18, |s_kb| < 2^25);
 *   acc  = sum over kb in increasing order of s_kb * ((double)sa * (double)sb), in double;
 *   out  = mok_f32_to_bf16((float)acc).
 * An expert with no rows gets +0. NaN codes and NaN scales propagate to the outputs they touch.
 * out [E, M, N] bf16 bit patterns; experts [e_begin, e_end) are written (0 <= e_begin <= e_end <= E).
 * Offsets must be non-negative, non-decreasing and offsets[E] <= R (MOK_ERR_ARG otherwise); rows
 * before offsets[0] or at/after offsets[E] are not read. a, sa, b, sb may be NULL when R == 0. The
 * CUDA kernel further needs M % 128 == N % 128 == 0, R % 16 == 0 and 128-aligned offsets. */
int mok_grouped_gemm_fp8_wgrad_blockwise(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                                         const int32_t* offsets, int64_t E, int64_t R, int64_t M, int64_t N,
                                         int64_t e_begin, int64_t e_end, uint16_t* out);
/* The same with b's scales in blocks of sb_block_n columns: 1 (the above: sb [ceil(R/128), N]) or 128
 * (128 x 128 blocks of B^T, i.e. rows x columns of the activation it was quantised from: sb
 * [ceil(R/128), ceil(N/128)], sb[kb, n / 128] multiplying column n; what mok_quantize_blockwise_bxb
 * of b's [R, N] source gives, the weight gradient's operand when the activation's column-wise copy is
 * quantised in tiles). Other sb_block_n: MOK_ERR_ARG. */
int mok_grouped_gemm_fp8_wgrad_blockwise_nb(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                                            int64_t sb_block_n, const int32_t* offsets, int64_t E, int64_t R, int64_t M,
                                            int64_t N, int64_t e_begin, int64_t e_end, uint16_t* out);

#ifdef __cplusplus
}
#endif

#endif /* MOK_CORE_H */
