/*
 * Proof by exhaustion of the division-free forms that the bf16 quantisation kernels use instead
 * of the C core's divisions and ldexpf (csrc/cuda/common/fp8.cuh): for every bf16 input they can
 * meet, the form gives the core's bits. bf16 has 2^16 values, so the pairs (value, block amax)
 * number about 10^9 and are all checked (about 10 s).
 *
 * The forms are written here with the same IEEE operations as on the device (a product, fmaf),
 * each rounded once; the Makefile builds with -ffp-contract=off so nothing is fused behind them.
 *
 *   div448(amax)          = fma(fma(-q0, 448, amax), R, q0), q0 = amax * R, R = RN(1/448)
 *                           equals amax / 448.0f for every bf16 amax >= 0
 *   quot(x, s, r)         = fma(fma(-q0, s, x), r, q0) with the sign of x, q0 = x * r, r = RN(1/s)
 *                           has the E4M3 code of x / s for every bf16 |x| <= amax when
 *                           amax = 0 (s = 1) or amax >= 2^-100 (bf16 bits 0x0D80)
 *   quot_neg(x, s, r)     = fma(-fma(q0, s, -x), r, q0), the device's form (no sign fix-up):
 *                           the same bits as quot for every bf16 |x| <= amax in the same range
 *                           (amax = 0 or amax >= 2^-100; below it the kernels divide)
 *   x * 2^-e              equals ldexpf(x, -e) for every bf16 x and E8M0 code e + 127 in 0..254
 *
 * Prints one line per failed check and "N passed, N failed".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../mok_core.h"

#define RCP_448 0x1.24924ap-9f
#define QUOT_FAST_MIN_BF16 0x0D80u

static int passed, failed;

static void check(int ok, const char* what) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static float bf16(uint32_t b) { return float_of(b << 16); }

static float div448(float amax) {
    float q0 = amax * RCP_448;
    return fmaf(fmaf(-q0, 448.0f, amax), RCP_448, q0);
}

static float quot(float x, float s, float r) {
    float q0 = x * r, q1 = fmaf(fmaf(-q0, s, x), r, q0);
    return float_of(bits_of(q1) | (bits_of(x) & 0x80000000u));
}

static float quot_neg(float x, float s, float r) {
    float q0 = x * r;
    return fmaf(-fmaf(q0, s, -x), r, q0);
}

static void check_div448(void) {
    uint32_t a;
    long bad = 0;
    check(RCP_448 == 1.0f / 448.0f, "RCP_448 is RN(1/448)");
    for (a = 0; a <= 0x7F7Fu; a++) bad += bits_of(div448(bf16(a))) != bits_of(bf16(a) / 448.0f);
    check(bad == 0, "div448(amax) == amax / 448.0f for every bf16 amax");
}

/* Codes of x / s against codes of quot(x, s, 1 / s) for all |x| <= amax, both signs. */
static long quot_code_mismatches(uint32_t a) {
    float amax = bf16(a), s = a == 0 ? 1.0f : amax / 448.0f, r = 1.0f / s;
    uint32_t b;
    long bad = 0;
    for (b = 0; b <= a; b++) {
        float xp = bf16(b), xn = bf16(b | 0x8000u);
        float qp = quot(xp, s, r), qn = quot(xn, s, r);
        /* the codes can only differ where the quotients do */
        if (bits_of(qp) != bits_of(xp / s)) bad += mok_f32_to_e4m3(qp) != mok_f32_to_e4m3(xp / s);
        if (bits_of(qn) != bits_of(xn / s)) bad += mok_f32_to_e4m3(qn) != mok_f32_to_e4m3(xn / s);
    }
    return bad;
}

static void check_quot(void) {
    uint32_t a;
    long bad = quot_code_mismatches(0), below = 0;
    for (a = QUOT_FAST_MIN_BF16; a <= 0x7F7Fu; a++) bad += quot_code_mismatches(a);
    check(bad == 0, "e4m3(quot(x, s, r)) == e4m3(x / s) for amax = 0 and amax >= 2^-100");
    /* The threshold is needed: below it the remainder underflows for some blocks. */
    for (a = 1; a < QUOT_FAST_MIN_BF16 && below == 0; a++) below += quot_code_mismatches(a);
    check(below > 0, "some block below the threshold does need the division");
}

/* quot_neg against quot, bit for bit, for every bf16 amax where the kernels use the fast form (0 and
 * >= 2^-100) and every |x| <= amax. */
static void check_quot_neg(void) {
    uint32_t a, b;
    long bad = 0;
    for (a = 0; a <= 0x7F7Fu; a = a == 0 ? QUOT_FAST_MIN_BF16 : a + 1) {
        float amax = bf16(a), s = a == 0 ? 1.0f : amax / 448.0f, r = 1.0f / s;
        for (b = 0; b <= a; b++) {
            float xp = bf16(b), xn = bf16(b | 0x8000u);
            bad += bits_of(quot_neg(xp, s, r)) != bits_of(quot(xp, s, r));
            bad += bits_of(quot_neg(xn, s, r)) != bits_of(quot(xn, s, r));
        }
    }
    check(bad == 0, "quot_neg(x, s, r) == quot(x, s, r) bit for bit for amax = 0 and amax >= 2^-100");
    check(bits_of(quot_neg(-0.0f, 1.0f, 1.0f)) == 0x80000000u, "quot_neg keeps -0");
}

static void check_mx_scaling(void) {
    uint32_t b;
    int code;
    long bad = 0;
    for (code = 0; code <= 254; code++) {
        int e = code - 127;
        float p = float_of(code == 254 ? 0x00400000u : (uint32_t)(254 - code) << 23);
        bad += p != ldexpf(1.0f, -e);
        for (b = 0; b <= 0xFFFFu; b++) {
            float x = bf16(b);
            if (isnan(x)) continue;
            bad += bits_of(x * p) != bits_of(ldexpf(x, -e));
        }
    }
    check(bad == 0, "x * 2^-e == ldexpf(x, -e) for every bf16 x and E8M0 code 0..254");
}

int main(void) {
    check_div448();
    check_mx_scaling();
    check_quot();
    check_quot_neg();
    printf("fast_forms: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
