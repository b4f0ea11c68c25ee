/* Block quantisation of [M, N] tensors to FP8 E4M3 (blockwise 1xB / BxB, MXFP8 1xB), and the MXFP8
 * quantise-dequantise of bf16 tensors (row-wise and column-wise with expert segments). */
#include <math.h>

#include "internal.h"

/* A rectangular block [r0, r1) x [c0, c1) of a row-major [?, N] tensor. */
typedef struct {
    int64_t r0, r1, c0, c1, N;
} block;

static int check_args(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, const void* q,
                      const void* scales) {
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (M < 0 || N < 0 || B <= 0) return MOK_ERR_ARG;
    if (M > 0 && N > 0 && (!x || !q || !scales)) return MOK_ERR_ARG;
    return MOK_OK;
}

static int check_deq_args(const uint8_t* q, const void* scales, int64_t M, int64_t N, int64_t B, const float* y) {
    if (M < 0 || N < 0 || B <= 0) return MOK_ERR_ARG;
    if (M > 0 && N > 0 && (!q || !scales || !y)) return MOK_ERR_ARG;
    return MOK_OK;
}

/* Total for b <= 0 (returns 0) because callers compute it before validating B. */
static int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

/* max |x| over the block (in float); *bad is set when the block holds NaN or Inf. */
static float block_amax(const void* x, mok_dtype dt, block b, int* bad) {
    float amax = 0.0f;
    int64_t r, c;
    *bad = 0;
    for (r = b.r0; r < b.r1; r++) {
        for (c = b.c0; c < b.c1; c++) {
            float v = fabsf(mok_load_f(x, dt, r * b.N + c));
            if (!isfinite(v)) *bad = 1;
            else if (v > amax) amax = v;
        }
    }
    return amax;
}

static void block_fill(uint8_t* q, block b, uint8_t code) {
    int64_t r;
    for (r = b.r0; r < b.r1; r++) memset(q + r * b.N + b.c0, code, (size_t)(b.c1 - b.c0));
}

/* DeepSeek-style block: float scale = amax / 448, codes e4m3(x / scale). Returns the scale. */
static float quant_block_float(const void* x, mok_dtype dt, block b, uint8_t* q) {
    int bad;
    float amax = block_amax(x, dt, b, &bad), scale;
    int64_t r, c;
    if (bad) {
        block_fill(q, b, 0x7f);
        return NAN;
    }
    scale = amax == 0.0f ? 1.0f : amax / 448.0f;
    for (r = b.r0; r < b.r1; r++)
        for (c = b.c0; c < b.c1; c++) q[r * b.N + c] = mok_f32_to_e4m3(mok_load_f(x, dt, r * b.N + c) / scale);
    return scale;
}

/* The three steps of MXFP8, shared by the quantiser, the dequantiser and the quantise-dequantise
 * below, so that all of them have the same numerics by construction. */

/* The E8M0 code of an MX block: RCEIL of its amax, 0xff (NaN) when it holds NaN or Inf. */
static uint8_t mx_block_code(const void* x, mok_dtype dt, block b) {
    int bad;
    float amax = block_amax(x, dt, b, &bad);
    return bad ? 0xff : mok_e8m0_rceil_from_amax(amax);
}

/* The E4M3 code of v in a block of finite scale code `code` (2^e, e = code - 127): e4m3(v * 2^-e),
 * the scaling exact (ldexpf rounds once, only when the result is subnormal). */
static uint8_t mx_encode(float v, uint8_t code) { return mok_f32_to_e4m3(ldexpf(v, 127 - (int)code)); }

/* The value a code stands for: e4m3(q) * 2^e (exact in float: 4 significant bits times a power of
 * two within float's range, or Inf past it); NaN for a NaN code or scale. */
static float mx_decode(uint8_t q, uint8_t code) { return mok_e4m3_to_f32(q) * mok_e8m0_to_f32(code); }

/* MX block: power-of-two scale by RCEIL, codes e4m3(x * 2^-e). Returns the E8M0 code. */
static uint8_t quant_block_mx(const void* x, mok_dtype dt, block b, uint8_t* q) {
    uint8_t code = mx_block_code(x, dt, b);
    int64_t c;
    if (code == 0xff) {
        block_fill(q, b, 0x7f);
        return code;
    }
    for (c = b.c0; c < b.c1; c++) q[b.r0 * b.N + c] = mx_encode(mok_load_f(x, dt, b.r0 * b.N + c), code);
    return code;
}

int mok_quantize_blockwise_1xb(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, uint8_t* q,
                               float* scales) {
    int st = check_args(x, dt, M, N, B, q, scales);
    int64_t m, j, nb = ceil_div(N, B);
    if (st != MOK_OK) return st;
    for (m = 0; m < M; m++) {
        for (j = 0; j < nb; j++) {
            block b = {m, m + 1, j * B, mok_min64(N, (j + 1) * B), N};
            scales[m * nb + j] = quant_block_float(x, dt, b, q);
        }
    }
    return MOK_OK;
}

int mok_quantize_blockwise_bxb(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, uint8_t* q,
                               float* scales) {
    int st = check_args(x, dt, M, N, B, q, scales);
    int64_t i, j, mb = ceil_div(M, B), nb = ceil_div(N, B);
    if (st != MOK_OK) return st;
    for (i = 0; i < mb; i++) {
        for (j = 0; j < nb; j++) {
            block b = {i * B, mok_min64(M, (i + 1) * B), j * B, mok_min64(N, (j + 1) * B), N};
            scales[i * nb + j] = quant_block_float(x, dt, b, q);
        }
    }
    return MOK_OK;
}

int mok_quantize_mx_1xb(const void* x, mok_dtype dt, int64_t M, int64_t N, int64_t B, uint8_t* q, uint8_t* scales) {
    int st = check_args(x, dt, M, N, B, q, scales);
    int64_t m, j, nb = ceil_div(N, B);
    if (st != MOK_OK) return st;
    for (m = 0; m < M; m++) {
        for (j = 0; j < nb; j++) {
            block b = {m, m + 1, j * B, mok_min64(N, (j + 1) * B), N};
            scales[m * nb + j] = quant_block_mx(x, dt, b, q);
        }
    }
    return MOK_OK;
}

int mok_dequantize_blockwise_1xb(const uint8_t* q, const float* scales, int64_t M, int64_t N, int64_t B, float* y) {
    int st = check_deq_args(q, scales, M, N, B, y);
    int64_t m, n, nb = ceil_div(N, B);
    if (st != MOK_OK) return st;
    for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) y[m * N + n] = mok_e4m3_to_f32(q[m * N + n]) * scales[m * nb + n / B];
    return MOK_OK;
}

int mok_dequantize_blockwise_bxb(const uint8_t* q, const float* scales, int64_t M, int64_t N, int64_t B, float* y) {
    int st = check_deq_args(q, scales, M, N, B, y);
    int64_t m, n, nb = ceil_div(N, B);
    if (st != MOK_OK) return st;
    for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) y[m * N + n] = mok_e4m3_to_f32(q[m * N + n]) * scales[(m / B) * nb + n / B];
    return MOK_OK;
}

int mok_dequantize_mx_1xb(const uint8_t* q, const uint8_t* scales, int64_t M, int64_t N, int64_t B, float* y) {
    int st = check_deq_args(q, scales, M, N, B, y);
    int64_t m, n, nb = ceil_div(N, B);
    if (st != MOK_OK) return st;
    for (m = 0; m < M; m++)
        for (n = 0; n < N; n++)
            y[m * N + n] = mx_decode(q[m * N + n], scales[m * nb + n / B]);
    return MOK_OK;
}

/* ---- MXFP8 quantise-dequantise of bf16 (mok_qdq_mxfp8_rows / _cols) ---- */

enum { MX_BLOCK = 32 };

/* The qdq value of v (a bf16 element as float) in a block of scale code `code`, as bf16 bits.
 * mx_decode's value is exactly representable in bf16 for every bf16 v (test_core.c checks all
 * pairs of v and code), so the rounding to bf16 is exact. NaN/Inf blocks: the quiet NaN 0x7fc0. */
static uint16_t mx_qdq(float v, uint8_t code) {
    if (code == 0xff) return 0x7fc0;
    return mok_f32_to_bf16_inl(mx_decode(mx_encode(v, code), code));
}

/* qdq of block b of x into y (same layout), with the block's own code. */
static void qdq_block(const uint16_t* x, block b, uint16_t* y) {
    uint8_t code = mx_block_code(x, MOK_BF16, b);
    int64_t r, c;
    for (r = b.r0; r < b.r1; r++)
        for (c = b.c0; c < b.c1; c++) y[r * b.N + c] = mx_qdq(mok_bf16_to_f32_inl(x[r * b.N + c]), code);
}

int mok_qdq_mxfp8_rows(const uint16_t* x, int64_t M, int64_t N, int64_t r_begin, int64_t r_end, uint16_t* y) {
    int64_t m, j, nb = ceil_div(N, MX_BLOCK);
    if (M < 0 || N < 0 || r_begin < 0 || r_end < r_begin || r_end > M) return MOK_ERR_ARG;
    if (r_end > r_begin && N > 0 && (!x || !y)) return MOK_ERR_ARG;
    for (m = r_begin; m < r_end; m++) {
        for (j = 0; j < nb; j++) {
            block b = {m, m + 1, j * MX_BLOCK, mok_min64(N, (j + 1) * MX_BLOCK), N};
            qdq_block(x, b, y);
        }
    }
    return MOK_OK;
}

int mok_qdq_mxfp8_cols(const uint16_t* x, int64_t M, int64_t N, const int32_t* offsets, int64_t E, int64_t c_begin,
                       int64_t c_end, uint16_t* y) {
    int64_t e, r0, c, nseg, lo, hi;
    if (M < 0 || N < 0 || c_begin < 0 || c_end < c_begin || c_end > N) return MOK_ERR_ARG;
    if (offsets) {
        if (E < 0 || offsets[0] < 0 || offsets[E] > M) return MOK_ERR_ARG;
        for (e = 0; e < E; e++)
            if (offsets[e + 1] < offsets[e]) return MOK_ERR_ARG;
    }
    if (M == 0 || c_end == c_begin) return MOK_OK;
    if (!x || !y) return MOK_ERR_ARG;
    nseg = offsets ? E : 1;
    lo = offsets ? offsets[0] : 0;
    hi = offsets ? offsets[E] : M;
    /* rows outside every segment: +0 */
    for (r0 = 0; r0 < M; r0++)
        if (r0 < lo || r0 >= hi) memset(y + r0 * N + c_begin, 0, (size_t)(c_end - c_begin) * sizeof(uint16_t));
    for (e = 0; e < nseg; e++) {
        const int64_t s0 = offsets ? offsets[e] : 0, s1 = offsets ? offsets[e + 1] : M;
        for (r0 = s0; r0 < s1; r0 += MX_BLOCK) {
            for (c = c_begin; c < c_end; c++) {
                block b = {r0, mok_min64(s1, r0 + MX_BLOCK), c, c + 1, N};
                qdq_block(x, b, y);
            }
        }
    }
    return MOK_OK;
}
