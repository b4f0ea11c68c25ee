/* Block quantisation of [M, N] tensors to FP8 E4M3 (blockwise 1xB / BxB, MXFP8 1xB). */
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

/* MX block: power-of-two scale by RCEIL, codes e4m3(x * 2^-e). Returns the E8M0 code. */
static uint8_t quant_block_mx(const void* x, mok_dtype dt, block b, uint8_t* q) {
    int bad, e;
    float amax = block_amax(x, dt, b, &bad);
    uint8_t code = bad ? 0xff : mok_e8m0_rceil_from_amax(amax);
    int64_t c;
    if (code == 0xff) {
        block_fill(q, b, 0x7f);
        return code;
    }
    e = (int)code - 127;
    for (c = b.c0; c < b.c1; c++) q[b.r0 * b.N + c] = mok_f32_to_e4m3(ldexpf(mok_load_f(x, dt, b.r0 * b.N + c), -e));
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
            y[m * N + n] = mok_e4m3_to_f32(q[m * N + n]) * mok_e8m0_to_f32(scales[m * nb + n / B]);
    return MOK_OK;
}
