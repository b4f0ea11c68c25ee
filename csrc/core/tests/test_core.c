/* Tests of the mok core library. Prints one line per failure and, last, "N passed, N failed". */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mok_core.h"

static int n_pass, n_fail;

#define GARBAGE 4096.0 /* exact in every dtype */

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            n_pass++;                                                       \
        } else {                                                            \
            n_fail++;                                                       \
            if (n_fail <= 200) {                                            \
                printf("%s:%d: FAIL (%s): ", __FILE__, __LINE__, #cond);    \
                printf(__VA_ARGS__);                                        \
                printf("\n");                                               \
            }                                                               \
        }                                                                   \
    } while (0)

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x1234567887654321ull;

/* splitmix64 */
static uint64_t rng_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unif(void) { return (double)(rng_u64() >> 11) * 0x1p-53; }
static int64_t rng_int(int64_t n) { return (int64_t)(rng_u64() % (uint64_t)n); }
static double rng_sym(void) { return 2.0 * rng_unif() - 1.0; }

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

static size_t dt_size(mok_dtype dt) { return dt == MOK_F64 ? 8 : dt == MOK_F32 ? 4 : 2; }
static const char* dt_name(mok_dtype dt) {
    return dt == MOK_F64 ? "f64" : dt == MOK_F32 ? "f32" : dt == MOK_BF16 ? "bf16" : "f16";
}

/* Element i of a dtype buffer as double (exact). */
static double tl(const void* p, mok_dtype dt, int64_t i) {
    switch (dt) {
    case MOK_F64: return ((const double*)p)[i];
    case MOK_F32: return ((const float*)p)[i];
    case MOK_BF16: return mok_bf16_to_f32(((const uint16_t*)p)[i]);
    default: return mok_f16_to_f32(((const uint16_t*)p)[i]);
    }
}

/* Store v into element i (rounded to dt; float first for the 16-bit types). */
static void ts(void* p, mok_dtype dt, int64_t i, double v) {
    switch (dt) {
    case MOK_F64: ((double*)p)[i] = v; break;
    case MOK_F32: ((float*)p)[i] = (float)v; break;
    case MOK_BF16: ((uint16_t*)p)[i] = mok_f32_to_bf16((float)v); break;
    default: ((uint16_t*)p)[i] = mok_f32_to_f16((float)v); break;
    }
}

/* A new dtype buffer of n random values in [-amp, amp]. */
static void* rand_buf(mok_dtype dt, int64_t n, double amp) {
    void* p = malloc((size_t)(n > 0 ? n : 1) * dt_size(dt));
    int64_t i;
    for (i = 0; i < n; i++) ts(p, dt, i, amp * rng_sym());
    return p;
}

static void fill_garbage(void* p, mok_dtype dt, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) ts(p, dt, i, GARBAGE);
}

/* Weight vector (accumulation type) of n random values. */
static void* rand_w(mok_dtype dt, int64_t n) {
    void* p = malloc((size_t)(n > 0 ? n : 1) * 8);
    int64_t i;
    for (i = 0; i < n; i++) {
        double v = 0.25 + rng_unif();
        if (dt == MOK_F64) ((double*)p)[i] = v;
        else ((float*)p)[i] = (float)v;
    }
    return p;
}

static double wv(const void* w, mok_dtype dt, int64_t i) {
    return dt == MOK_F64 ? ((const double*)w)[i] : (double)((const float*)w)[i];
}

static double tol_of(mok_dtype dt) {
    return dt == MOK_F64 ? 1e-12 : dt == MOK_F32 ? 1e-5 : dt == MOK_BF16 ? 1.6e-2 : 2e-3;
}

static int close_to(double got, double want, double tol) {
    return fabs(got - want) <= tol * (1.0 + fabs(want));
}

/* ---------------------------------------------------------------- scalar conversions */

/* Independent FP8 decode by the format's fields. */
static double ref_fp8(unsigned c, int ebits, int mbits, int ieee_special) {
    int bias = (1 << (ebits - 1)) - 1;
    unsigned ex = (c >> mbits) & ((1u << ebits) - 1u), m = c & ((1u << mbits) - 1u), top = (1u << ebits) - 1u;
    double sgn = (c & 0x80) ? -1.0 : 1.0;
    if (ieee_special && ex == top) return m ? NAN : sgn * INFINITY;
    if (!ieee_special && ex == top && m == (1u << mbits) - 1u) return NAN;
    if (ex == 0) return sgn * ldexp((double)m, 1 - bias - mbits);
    return sgn * ldexp(1.0 + (double)m / (double)(1u << mbits), (int)ex - bias);
}

/* Brute-force FP8 encode: nearest finite magnitude code, ties to the even code, NaN rule. */
static unsigned ref_encode_fp8(float x, int e5m2) {
    unsigned sign = (bits_of(x) >> 24) & 0x80u, c, best = 0, maxc = e5m2 ? 0x7bu : 0x7eu;
    double a = fabs((double)x), bestd = INFINITY;
    if (isnan(x)) return sign | 0x7fu;
    if (a > (e5m2 ? 57344.0 : 448.0)) return sign | maxc; /* saturation */
    for (c = 0; c <= maxc; c++) {
        double v = e5m2 ? ref_fp8(c, 5, 2, 1) : ref_fp8(c, 4, 3, 0);
        double d = fabs(a - v);
        if (d < bestd || (d == bestd && (c & 1u) == 0)) {
            bestd = d;
            best = c;
        }
    }
    return sign | best;
}

static void test_fp8(void) {
    unsigned c;
    int bad_dec = 0, bad_rt = 0, bad_enc4 = 0, bad_enc5 = 0, i;
    for (c = 0; c < 256; c++) {
        double r4 = ref_fp8(c, 4, 3, 0), r5 = ref_fp8(c, 5, 2, 1);
        float d4 = mok_e4m3_to_f32((uint8_t)c), d5 = mok_e5m2_to_f32((uint8_t)c);
        if (isnan(r4) ? !isnan(d4) : ((double)d4 != r4 || !signbit(d4) != !signbit(r4))) bad_dec++;
        if (isnan(r5) ? !isnan(d5) : ((double)d5 != r5 || !signbit(d5) != !signbit(r5))) bad_dec++;
        if (!isnan(d4) && mok_f32_to_e4m3(d4) != c) bad_rt++;
        if (isfinite(d5) && mok_f32_to_e5m2(d5) != c) bad_rt++;
    }
    CHECK(bad_dec == 0, "fp8 decode mismatches: %d", bad_dec);
    CHECK(bad_rt == 0, "fp8 encode(decode(c)) mismatches: %d", bad_rt);
    CHECK(mok_f32_to_e5m2(INFINITY) == 0x7b && mok_f32_to_e5m2(-INFINITY) == 0xfb, "e5m2 inf saturation");
    CHECK(mok_f32_to_e4m3(INFINITY) == 0x7e && mok_f32_to_e4m3(-INFINITY) == 0xfe, "e4m3 inf saturation");
    CHECK(mok_f32_to_e4m3(NAN) == 0x7f && mok_f32_to_e4m3(-NAN) == 0xff, "e4m3 NaN");
    CHECK(mok_f32_to_e5m2(NAN) == 0x7f && mok_f32_to_e5m2(-NAN) == 0xff, "e5m2 NaN");
    CHECK(mok_f32_to_e4m3(464.0f) == 0x7e && mok_f32_to_e4m3(1e30f) == 0x7e, "e4m3 saturation");
    CHECK(mok_f32_to_e4m3(-0.0f) == 0x80 && mok_f32_to_e4m3(0x1p-10f) == 0x00, "e4m3 zero / tie to 0");
    /* every bf16 pattern, then random float bit patterns */
    for (i = 0; i < 65536 + 200000; i++) {
        float x = i < 65536 ? mok_bf16_to_f32((uint16_t)i) : float_of((uint32_t)rng_u64());
        unsigned g4 = mok_f32_to_e4m3(x), g5 = mok_f32_to_e5m2(x);
        unsigned w4 = ref_encode_fp8(x, 0), w5 = ref_encode_fp8(x, 1);
        if (g4 != w4 && ++bad_enc4 <= 5) printf("  e4m3(%a [%08x]) = %02x, want %02x\n", x, bits_of(x), g4, w4);
        if (g5 != w5 && ++bad_enc5 <= 5) printf("  e5m2(%a [%08x]) = %02x, want %02x\n", x, bits_of(x), g5, w5);
    }
    CHECK(bad_enc4 == 0, "e4m3 encode mismatches vs brute force: %d", bad_enc4);
    CHECK(bad_enc5 == 0, "e5m2 encode mismatches vs brute force: %d", bad_enc5);
}

static int is_bf16_nan(uint16_t v) { return (v & 0x7f80) == 0x7f80 && (v & 0x7f) != 0; }
static int is_f16_nan(uint16_t v) { return (v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0; }

static void test_bf16(void) {
    int bad = 0, p;
    for (p = 0; p < 65536; p++) {
        float f = mok_bf16_to_f32((uint16_t)p);
        uint16_t q = mok_f32_to_bf16(f);
        if (bits_of(f) != (uint32_t)p << 16) bad++;
        if (is_bf16_nan((uint16_t)p) ? !(is_bf16_nan(q) && (q & 0x8000) == (p & 0x8000)) : q != p) bad++;
    }
    CHECK(bad == 0, "bf16 round trip mismatches: %d", bad);
    CHECK(mok_f32_to_bf16(float_of(0x3f808000u)) == 0x3f80, "tie to even (down)");
    CHECK(mok_f32_to_bf16(float_of(0x3f818000u)) == 0x3f82, "tie to even (up)");
    CHECK(mok_f32_to_bf16(float_of(0x3f808001u)) == 0x3f81, "above tie");
    CHECK(mok_f32_to_bf16(float_of(0x3f807fffu)) == 0x3f80, "below tie");
    CHECK(mok_f32_to_bf16(FLT_MAX) == 0x7f80 && mok_f32_to_bf16(-FLT_MAX) == 0xff80, "overflow to inf");
    CHECK(mok_f32_to_bf16(float_of(0x7f7f8000u)) == 0x7f80, "tie at max rounds to inf");
    CHECK(mok_f32_to_bf16(float_of(0x7f7e8000u)) == 0x7f7e, "tie below max stays");
    CHECK(mok_f32_to_bf16(INFINITY) == 0x7f80 && mok_f32_to_bf16(-INFINITY) == 0xff80, "inf");
    CHECK(mok_f32_to_bf16(float_of(0x7fc00000u)) == 0x7fc0, "qNaN");
    CHECK(is_bf16_nan(mok_f32_to_bf16(float_of(0x7f800001u))), "low-payload NaN stays NaN");
    CHECK(mok_f32_to_bf16(float_of(0xff800001u)) & 0x8000, "NaN keeps sign");
    CHECK(mok_f32_to_bf16(float_of(0x00008000u)) == 0x0000 && mok_f32_to_bf16(float_of(0x00018000u)) == 0x0002,
          "subnormal ties");
    CHECK(mok_f32_to_bf16(-0.0f) == 0x8000, "-0");
}

/* Independent f16 rounding reference: scale to an integer significand, rint (RNE), scale back. */
static double ref_f16_value(float x) {
    double a = fabs((double)x), q;
    int e;
    if (isnan(x)) return NAN;
    if (a >= 65520.0) return copysign(INFINITY, (double)x);
    if (a == 0.0) return copysign(0.0, (double)x);
    e = (int)floor(log2(a));
    if (ldexp(1.0, e) > a) e--; /* guard log2 rounding */
    if (ldexp(1.0, e + 1) <= a) e++;
    if (e < -14) e = -14;
    q = nearbyint(ldexp(a, 10 - e));
    return copysign(ldexp(q, e - 10), (double)x);
}

static double ref_f16_decode(unsigned v) {
    unsigned ex = (v >> 10) & 31u, m = v & 1023u;
    double s = (v & 0x8000u) ? -1.0 : 1.0;
    if (ex == 31) return m ? NAN : s * INFINITY;
    if (ex == 0) return s * ldexp((double)m, -24);
    return s * ldexp(1.0 + m / 1024.0, (int)ex - 15);
}

static void test_f16(void) {
    int bad_rt = 0, bad_dec = 0, bad_enc = 0, p, i;
    for (p = 0; p < 65536; p++) {
        float f = mok_f16_to_f32((uint16_t)p);
        uint16_t q = mok_f32_to_f16(f);
        double r = ref_f16_decode((unsigned)p);
        if (isnan(r) ? !isnan(f) : ((double)f != r || !signbit(f) != !signbit(r))) bad_dec++;
        if (is_f16_nan((uint16_t)p) ? !(is_f16_nan(q) && (q & 0x8000) == (p & 0x8000)) : q != p) bad_rt++;
    }
    CHECK(bad_dec == 0, "f16 decode mismatches: %d", bad_dec);
    CHECK(bad_rt == 0, "f16 round trip mismatches: %d", bad_rt);
    for (i = 0; i < 65536 + 200000; i++) {
        float x = i < 65536 ? mok_bf16_to_f32((uint16_t)i) : float_of((uint32_t)rng_u64());
        uint16_t h = mok_f32_to_f16(x);
        double got = mok_f16_to_f32(h), want = ref_f16_value(x);
        int ok = isnan(want) ? is_f16_nan(h) && ((h & 0x8000) != 0) == (signbit(x) != 0)
                             : got == want && !signbit(got) == !signbit(want);
        if (!ok && ++bad_enc <= 5) printf("  f16(%a) = %04x, want %a\n", x, h, want);
    }
    CHECK(bad_enc == 0, "f16 encode mismatches: %d", bad_enc);
    CHECK(mok_f32_to_f16(65504.0f) == 0x7bff && mok_f32_to_f16(65519.99f) == 0x7bff, "f16 max");
    CHECK(mok_f32_to_f16(65520.0f) == 0x7c00 && mok_f32_to_f16(-1e10f) == 0xfc00, "f16 overflow to inf");
    CHECK(mok_f32_to_f16(0x1p-24f) == 0x0001 && mok_f32_to_f16(0x1p-25f) == 0x0000, "f16 min subnormal / tie");
    CHECK(mok_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001, "f16 above tie");
    CHECK(mok_f32_to_f16(0x3p-25f) == 0x0002, "f16 subnormal tie to even");
    CHECK(mok_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && mok_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02, "f16 ties");
    CHECK(mok_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400, "f16 subnormal rounds up to normal");
    CHECK(mok_f32_to_f16(INFINITY) == 0x7c00 && is_f16_nan(mok_f32_to_f16(NAN)), "f16 inf / NaN");
    CHECK(mok_f32_to_f16(-0.0f) == 0x8000, "f16 -0");
}

/* smallest e in [-127, 127] with a / 2^e <= 448 (in double); q_mode uses the float q = a / 448 */
static int ref_rceil(float amax, int q_mode) {
    int e;
    double q = (double)(amax / 448.0f);
    for (e = -127; e < 127; e++) {
        if (q_mode ? q <= ldexp(1.0, e) : (double)amax / ldexp(1.0, e) <= 448.0) return e;
    }
    return 127;
}

static void test_e8m0(void) {
    int v, i, bad = 0, bad_q = 0;
    for (v = 0; v < 256; v++) {
        float f = mok_e8m0_to_f32((uint8_t)v);
        if (v == 255 ? !isnan(f) : (double)f != ldexp(1.0, v - 127)) bad++;
    }
    CHECK(bad == 0, "e8m0 decode mismatches: %d", bad);
    bad = 0;
    for (i = 0; i < 300000; i++) {
        float a;
        int k;
        if (i < 260) a = ldexpf(448.0f, i - 140);                          /* exact powers of two */
        else if (i < 520) a = nextafterf(ldexpf(448.0f, i - 400), INFINITY); /* just above */
        else if (i < 780) a = nextafterf(ldexpf(448.0f, i - 660), 0.0f);     /* just below */
        else a = float_of((uint32_t)rng_u64() & 0x7fffffffu);
        if (!isfinite(a)) continue;
        k = mok_e8m0_rceil_from_amax(a) - 127;
        /* the exact rule and the float-q rule agree while q = amax / 448 is a normal float */
        if (a / 448.0f >= FLT_MIN && k != ref_rceil(a, 0)) {
            if (++bad <= 5) printf("  rceil(%a) = %d, want %d\n", a, k, ref_rceil(a, 0));
        }
        if (k != ref_rceil(a, 1)) bad_q++;
    }
    CHECK(bad == 0, "rceil mismatches vs exact brute force: %d", bad);
    CHECK(bad_q == 0, "rceil mismatches vs float-q brute force: %d", bad_q);
    CHECK(mok_e8m0_rceil_from_amax(0.0f) == 0, "amax 0");
    CHECK(mok_e8m0_rceil_from_amax(448.0f) == 127 && mok_e8m0_rceil_from_amax(449.0f) == 128, "448");
    CHECK(mok_e8m0_rceil_from_amax(float_of(1)) == 0, "min subnormal");
    CHECK(mok_e8m0_rceil_from_amax(FLT_MAX) == 127 + 120, "FLT_MAX");
    CHECK(mok_e8m0_rceil_from_amax(INFINITY) == 0xff && mok_e8m0_rceil_from_amax(NAN) == 0xff, "inf/NaN");
    CHECK(mok_e8m0_rceil_from_amax(ldexpf(448.0f, -127)) == 0, "448 * 2^-127");
    CHECK(mok_e8m0_rceil_from_amax(ldexpf(448.0f, -126)) == 1, "448 * 2^-126");
    CHECK(strcmp(mok_status_string(MOK_ERR_EXPERT_ID), "expert id out of range") == 0, "status string");
    CHECK(mok_status_string(-99) != NULL && mok_status_string(MOK_OK) != NULL, "status strings");
}

/* ---------------------------------------------------------------- quantisation */

/* Random [M, N] data with a different magnitude per row; a few exact zeros. */
static void* quant_data(mok_dtype dt, int64_t M, int64_t N) {
    void* p = malloc((size_t)(M * N) * dt_size(dt));
    int64_t m, n;
    for (m = 0; m < M; m++) {
        double amp = ldexp(1.0, (int)rng_int(20) - 10);
        for (n = 0; n < N; n++) ts(p, dt, m * N + n, rng_int(10) == 0 ? 0.0 : amp * rng_sym());
    }
    return p;
}

/* Reference of one float-scaled block [r0, r1) x [c0, c1); returns mismatches. */
static int ref_block_float(const void* x, mok_dtype dt, int64_t N, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                           const uint8_t* q, float scale) {
    float amax = 0.0f, s;
    int64_t r, c;
    int bad = 0, nonfinite = 0;
    for (r = r0; r < r1; r++)
        for (c = c0; c < c1; c++) {
            float v = (float)tl(x, dt, r * N + c);
            if (!isfinite(v)) nonfinite = 1;
            else if (fabsf(v) > amax) amax = fabsf(v);
        }
    if (nonfinite) {
        for (r = r0; r < r1; r++)
            for (c = c0; c < c1; c++) bad += q[r * N + c] != 0x7f;
        return bad + !isnan(scale);
    }
    s = amax == 0.0f ? 1.0f : amax / 448.0f;
    bad += bits_of(s) != bits_of(scale);
    for (r = r0; r < r1; r++)
        for (c = c0; c < c1; c++) bad += q[r * N + c] != mok_f32_to_e4m3((float)tl(x, dt, r * N + c) / s);
    return bad;
}

/* Relative error bound of dequantised normal-range values; returns violations. */
static int deq_errors(const void* x, mok_dtype dt, const float* y, int64_t n, const uint8_t* q) {
    int64_t i;
    int bad = 0;
    for (i = 0; i < n; i++) {
        double v = tl(x, dt, i), d = mok_e4m3_to_f32(q[i]);
        /* x / scale in the normal range (scale = y / d); slack for the float scaling itself */
        if (d != 0.0 && fabs(v) >= 0x1p-6 * fabs(y[i] / d) && fabs(y[i] - v) > 0x1p-4 * (1 + 1e-6) * fabs(v)) {
            if (++bad <= 3) printf("  dequant %s [%d]: x %a y %a code %02x\n", dt_name(dt), (int)i, v, y[i], q[i]);
        }
    }
    return bad;
}

static void test_quant_1xb_bxb(mok_dtype dt) {
    const int64_t M = 70, N = 75, B = 32, nb = 3, mb = 3;
    void* x = quant_data(dt, M, N);
    uint8_t* q = (uint8_t*)malloc((size_t)(M * N));
    float *sc = (float*)malloc(sizeof(float) * (size_t)(M * nb)), *y = (float*)malloc(sizeof(float) * (size_t)(M * N));
    int64_t m, j, i;
    int bad = 0;
    /* a zero block, a NaN block and an Inf block */
    for (j = 0; j < 32; j++) ts(x, dt, 3 * N + j, 0.0);
    ts(x, dt, 4 * N + 40, NAN);
    ts(x, dt, 5 * N + 70, INFINITY);
    CHECK(mok_quantize_blockwise_1xb(x, dt, M, N, B, q, sc) == MOK_OK, "1xb %s", dt_name(dt));
    for (m = 0; m < M; m++)
        for (j = 0; j < nb; j++) bad += ref_block_float(x, dt, N, m, m + 1, j * B, j * B + B < N ? j * B + B : N, q, sc[m * nb + j]);
    CHECK(bad == 0, "1xb %s mismatches: %d", dt_name(dt), bad);
    CHECK(sc[3 * nb] == 1.0f && q[3 * N] == 0 && q[3 * N + 31] == 0, "1xb zero block");
    CHECK(isnan(sc[4 * nb + 1]) && q[4 * N + 32] == 0x7f && q[4 * N + 63] == 0x7f && !isnan(sc[4 * nb]), "1xb NaN");
    CHECK(isnan(sc[5 * nb + 2]) && q[5 * N + 64] == 0x7f && q[5 * N + 74] == 0x7f, "1xb Inf partial block");
    CHECK(mok_dequantize_blockwise_1xb(q, sc, M, N, B, y) == MOK_OK, "deq 1xb");
    for (i = 0; i < M * N; i++)
        if (i / N == 4 || i / N == 5) y[i] = (float)tl(x, dt, i); /* rows with non-finite blocks */
    CHECK(deq_errors(x, dt, y, M * N, q) == 0, "1xb %s dequant error bound", dt_name(dt));

    bad = 0;
    CHECK(mok_quantize_blockwise_bxb(x, dt, M, N, B, q, sc) == MOK_OK, "bxb %s", dt_name(dt));
    for (i = 0; i < mb; i++)
        for (j = 0; j < nb; j++)
            bad += ref_block_float(x, dt, N, i * B, i * B + B < M ? i * B + B : M, j * B, j * B + B < N ? j * B + B : N, q,
                                   sc[i * nb + j]);
    CHECK(bad == 0, "bxb %s mismatches: %d", dt_name(dt), bad);
    CHECK(isnan(sc[1]) && isnan(sc[2]) && !isnan(sc[0]) && !isnan(sc[nb + 1]), "bxb NaN/Inf tiles");
    /* the clean rows 32..69 (tiles 1..2) get the error bound */
    CHECK(mok_dequantize_blockwise_bxb(q, sc, M, N, B, y) == MOK_OK, "deq bxb");
    CHECK(deq_errors((const char*)x + (size_t)(32 * N) * dt_size(dt), dt, y + 32 * N, (M - 32) * N, q + 32 * N) == 0,
          "bxb %s dequant error bound", dt_name(dt));
    CHECK(mok_quantize_blockwise_1xb(x, dt, M, N, 0, q, sc) == MOK_ERR_ARG, "B = 0");
    CHECK(mok_quantize_blockwise_bxb(x, dt, -1, N, B, q, sc) == MOK_ERR_ARG, "M < 0");
    CHECK(mok_quantize_blockwise_1xb(x, (mok_dtype)9, M, N, B, q, sc) == MOK_ERR_DTYPE, "dtype");
    free(x);
    free(q);
    free(sc);
    free(y);
}

static void test_quant_mx(mok_dtype dt) {
    const int64_t M = 20, N = 80, B = 32, nb = 3;
    void* x = quant_data(dt, M, N);
    uint8_t *q = (uint8_t*)malloc((size_t)(M * N)), *sc = (uint8_t*)malloc((size_t)(M * nb));
    float* y = (float*)malloc(sizeof(float) * (size_t)(M * N));
    int64_t m, j, c;
    int bad = 0, over = 0;
    for (j = 0; j < 32; j++) ts(x, dt, 2 * N + j, 0.0);
    ts(x, dt, 3 * N + 33, NAN);
    CHECK(mok_quantize_mx_1xb(x, dt, M, N, B, q, sc) == MOK_OK, "mx %s", dt_name(dt));
    for (m = 0; m < M; m++) {
        for (j = 0; j < nb; j++) {
            int64_t c1 = j * B + B < N ? j * B + B : N;
            float amax = 0.0f;
            int nonfinite = 0;
            uint8_t code;
            for (c = j * B; c < c1; c++) {
                float v = (float)tl(x, dt, m * N + c);
                if (!isfinite(v)) nonfinite = 1;
                else if (fabsf(v) > amax) amax = fabsf(v);
            }
            code = nonfinite ? 0xff : mok_e8m0_rceil_from_amax(amax);
            bad += sc[m * nb + j] != code;
            for (c = j * B; c < c1; c++) {
                float v = (float)tl(x, dt, m * N + c);
                uint8_t want = code == 0xff ? 0x7f : mok_f32_to_e4m3(ldexpf(v, 127 - code));
                bad += q[m * N + c] != want;
                if (code != 0xff && fabs(ldexp(v, 127 - code)) > 448.0) over++;
                if (code != 0xff && fabsf(mok_e4m3_to_f32(q[m * N + c])) > 448.0f) over++;
            }
        }
    }
    CHECK(bad == 0, "mx %s mismatches: %d", dt_name(dt), bad);
    CHECK(over == 0, "mx %s scaled values above 448: %d", dt_name(dt), over);
    CHECK(sc[2 * nb] == 0 && q[2 * N] == 0, "mx zero block");
    CHECK(sc[3 * nb + 1] == 0xff && q[3 * N + 32] == 0x7f && q[3 * N + 63] == 0x7f, "mx NaN block");
    CHECK(mok_dequantize_mx_1xb(q, sc, M, N, B, y) == MOK_OK, "deq mx");
    for (c = 0; c < N; c++) y[3 * N + c] = (float)tl(x, dt, 3 * N + c);
    CHECK(deq_errors(x, dt, y, M * N, q) == 0, "mx %s dequant error bound", dt_name(dt));
    CHECK(isnan(mok_e8m0_to_f32(0xff)), "NaN scale");
    free(x);
    free(q);
    free(sc);
    free(y);
}

/* ---------------------------------------------------------------- MXFP8 quantise-dequantise */

/* The CUDA kernel's integer form of the E8M0 code of a bf16 block amax (csrc/cuda/quant/qdq_mxfp8.cuh,
 * mx_codes2, one half of its packed word): code = max(0, exponent field - 8 + (mantissa > 0x60)). */
static unsigned qdq_dev_code(unsigned a) {
    int c = (int)((a >> 7) & 0xffu) - 8 + (int)(((a & 0x7fu) + 0x1fu) >> 7);
    return c < 0 ? 0u : (unsigned)c;
}

/* The claims the qdq rests on, for every bf16 value and every scale:
 * - the dequantised value e4m3(code) * 2^e of a bf16 element is a bf16 value (its low 16 float bits
 *   are 0, Inf included), so bf16 rounding is exact and truncation equals it (the CUDA kernel);
 * - the kernel's integer code form equals the core's RCEIL for every finite bf16 amax;
 * - every E4M3 value is an IEEE half value (the kernel decodes through cvt f16x2.e4m3x2). */
static void test_qdq_mx_exact(void) {
    int not_bf16 = 0, bad_code = 0, bad_half = 0, bad_pow = 0;
    unsigned code, v, a;
    for (code = 0; code < 255; code++) {
        const float up = mok_e8m0_to_f32((uint8_t)code);
        if (code > 0 && bits_of(up) != code << 23) bad_pow++;
        if (code == 0 && bits_of(up) != 0x00400000u) bad_pow++;
        for (v = 0; v < 0x10000u; v++) {
            float x = mok_bf16_to_f32((uint16_t)v), d;
            if (!isfinite(x)) continue;
            d = mok_e4m3_to_f32(mok_f32_to_e4m3(ldexpf(x, 127 - (int)code))) * up;
            if ((bits_of(d) & 0xffffu) != 0 || mok_bf16_to_f32(mok_f32_to_bf16(d)) != d) {
                if (++not_bf16 <= 3) printf("  qdq value not bf16: x %a code %u d %a\n", x, code, d);
            }
        }
    }
    CHECK(not_bf16 == 0, "MXFP8 values of bf16 elements not exact in bf16: %d", not_bf16);
    CHECK(bad_pow == 0, "E8M0 scale bits: %d", bad_pow);
    for (a = 0; a < 0x7f80u; a++) {
        if (qdq_dev_code(a) != mok_e8m0_rceil_from_amax(mok_bf16_to_f32((uint16_t)a))) {
            if (++bad_code <= 3) printf("  code form: amax bits %04x\n", a);
        }
    }
    CHECK(bad_code == 0, "device E8M0 code form vs mok_e8m0_rceil_from_amax: %d", bad_code);
    for (v = 0; v < 0x100u; v++) {
        float f = mok_e4m3_to_f32((uint8_t)v);
        if ((v & 0x7f) != 0x7f && bits_of(mok_f16_to_f32(mok_f32_to_f16(f))) != bits_of(f)) bad_half++;
    }
    CHECK(bad_half == 0, "E4M3 values not exact in f16: %d", bad_half);
}

/* x [M, N] bf16 with rows of very different magnitudes, including the edges of bf16's range. */
static uint16_t* qdq_data(int64_t M, int64_t N) {
    uint16_t* x = (uint16_t*)malloc((size_t)(M * N) * sizeof(uint16_t));
    int64_t m, n;
    for (m = 0; m < M; m++) {
        const int kind = (int)(m % 7);
        double amp = ldexp(1.0, (int)rng_int(40) - 20);
        if (kind == 1) amp = 0x1.fep127 * (0.5 + 0.5 * rng_unif()); /* near bf16's largest: Inf values */
        if (kind == 2) amp = 0x1p-128;                               /* bf16 subnormals */
        for (n = 0; n < N; n++) {
            double v = rng_int(9) == 0 ? 0.0 : amp * rng_sym();
            x[m * N + n] = mok_f32_to_bf16((float)v);
            if (kind == 3 && rng_int(5) == 0) x[m * N + n] = 0x8000; /* -0 */
        }
    }
    return x;
}

/* Mismatches of y (bf16 bits) against the float dequantisation want: equal bits, or both NaN. */
static int qdq_mismatch(uint16_t y, float want) {
    if (isnan(want)) return !(((y & 0x7f80) == 0x7f80) && (y & 0x7f));
    return ((uint32_t)y << 16) != bits_of(want);
}

/* Reference: rows of y against mok_quantize_mx_1xb + mok_dequantize_mx_1xb of x. */
static int qdq_rows_errors(const uint16_t* x, int64_t M, int64_t N, const uint16_t* y) {
    const int64_t nb = (N + 31) / 32;
    uint8_t *q = (uint8_t*)malloc((size_t)(M * N + 1)), *sc = (uint8_t*)malloc((size_t)(M * nb + 1));
    float* d = (float*)malloc(sizeof(float) * (size_t)(M * N + 1));
    int64_t i;
    int bad = 0;
    CHECK(mok_quantize_mx_1xb(x, MOK_BF16, M, N, 32, q, sc) == MOK_OK && mok_dequantize_mx_1xb(q, sc, M, N, 32, d) == MOK_OK,
          "qdq reference rows");
    for (i = 0; i < M * N; i++) bad += qdq_mismatch(y[i], d[i]);
    free(q);
    free(sc);
    free(d);
    return bad;
}

/* Reference: each segment of y against the quantisation of the segment's transpose; rows outside
 * [offsets[0], offsets[E]) must be +0. */
static int qdq_cols_errors(const uint16_t* x, int64_t M, int64_t N, const int32_t* off, int64_t E, const uint16_t* y) {
    int64_t e, r, c, lo = off ? off[0] : 0, hi = off ? off[E] : M;
    int bad = 0;
    for (r = 0; r < M; r++)
        if (r < lo || r >= hi)
            for (c = 0; c < N; c++) bad += y[r * N + c] != 0;
    for (e = 0; e < (off ? E : 1); e++) {
        const int64_t s0 = off ? off[e] : 0, n = (off ? off[e + 1] : M) - s0;
        uint16_t *xt = (uint16_t*)malloc((size_t)(N * n + 1) * sizeof(uint16_t)), *yt;
        for (r = 0; r < n; r++)
            for (c = 0; c < N; c++) xt[c * n + r] = x[(s0 + r) * N + c];
        yt = (uint16_t*)malloc((size_t)(N * n + 1) * sizeof(uint16_t));
        for (r = 0; r < n; r++)
            for (c = 0; c < N; c++) yt[c * n + r] = y[(s0 + r) * N + c];
        bad += qdq_rows_errors(xt, N, n, yt);
        free(xt);
        free(yt);
    }
    return bad;
}

static void test_qdq_mx(void) {
    const int64_t M = 110, N = 75;
    /* ragged segments: rows 0-2 and 100-109 outside, an empty expert, one row, partial blocks */
    int32_t off[6] = {3, 3, 40, 41, 77, 100};
    uint16_t* x = qdq_data(M, N);
    uint16_t* y = (uint16_t*)malloc((size_t)(M * N) * sizeof(uint16_t));
    int64_t i;
    x[5 * N + 40] = 0x7fc0;      /* NaN: row block 1 of row 5; column 40's block of rows 3-34 */
    x[50 * N + 3] = 0xff80;      /* -Inf */
    x[60 * N + 70] = 0x7f80;     /* +Inf in the partial last row block */
    for (i = 0; i < N; i++) x[20 * N + i] = 0; /* zero row blocks */

    for (i = 0; i < M * N; i++) y[i] = 0x7777;
    CHECK(mok_qdq_mxfp8_rows(x, M, N, 0, 50, y) == MOK_OK && mok_qdq_mxfp8_rows(x, M, N, 50, M, y) == MOK_OK,
          "qdq rows");
    CHECK(qdq_rows_errors(x, M, N, y) == 0, "qdq rows vs quantize + dequantize: %d", qdq_rows_errors(x, M, N, y));
    CHECK(y[5 * N + 40] == 0x7fc0 && y[5 * N + 63] == 0x7fc0 && y[5 * N + 64] != 0x7fc0, "qdq rows NaN block");
    CHECK(y[20 * N] == 0 && y[60 * N + 64] == 0x7fc0 && y[60 * N + 63] != 0x7fc0, "qdq rows zero / Inf blocks");

    for (i = 0; i < M * N; i++) y[i] = 0x7777;
    CHECK(mok_qdq_mxfp8_cols(x, M, N, off, 5, 0, 30, y) == MOK_OK && mok_qdq_mxfp8_cols(x, M, N, off, 5, 30, N, y) == MOK_OK,
          "qdq cols");
    CHECK(qdq_cols_errors(x, M, N, off, 5, y) == 0, "qdq cols vs quantize + dequantize of the segments: %d",
          qdq_cols_errors(x, M, N, off, 5, y));
    CHECK(y[3 * N + 40] == 0x7fc0 && y[34 * N + 40] == 0x7fc0 && y[35 * N + 40] != 0x7fc0 && y[39 * N + 40] != 0x7fc0,
          "qdq cols NaN block (rows 3-34 of the segment [3, 40))");
    CHECK(y[41 * N + 3] == 0x7fc0 && y[72 * N + 3] == 0x7fc0 && y[73 * N + 3] != 0x7fc0 && y[40 * N + 3] != 0x7fc0,
          "qdq cols -Inf block (rows 41-72 of the segment [41, 77))");
    CHECK(y[0] == 0 && y[2 * N + 5] == 0 && y[100 * N + 7] == 0 && y[M * N - 1] == 0, "qdq cols outside rows are +0");

    for (i = 0; i < M * N; i++) y[i] = 0x7777;
    CHECK(mok_qdq_mxfp8_cols(x, M, N, NULL, 0, 0, N, y) == MOK_OK, "qdq cols, one segment");
    CHECK(qdq_cols_errors(x, M, N, NULL, 0, y) == 0, "qdq cols, one segment: %d", qdq_cols_errors(x, M, N, NULL, 0, y));

    /* arguments */
    CHECK(mok_qdq_mxfp8_rows(x, M, N, 0, M + 1, y) == MOK_ERR_ARG, "rows r_end > M");
    CHECK(mok_qdq_mxfp8_rows(x, -1, N, 0, 0, y) == MOK_ERR_ARG, "rows M < 0");
    CHECK(mok_qdq_mxfp8_rows(NULL, M, N, 0, 1, y) == MOK_ERR_ARG, "rows x NULL");
    CHECK(mok_qdq_mxfp8_rows(NULL, 0, N, 0, 0, NULL) == MOK_OK, "rows M = 0");
    off[2] = 2;
    CHECK(mok_qdq_mxfp8_cols(x, M, N, off, 5, 0, N, y) == MOK_ERR_ARG, "cols decreasing offsets");
    off[2] = 40;
    off[5] = (int32_t)M + 1;
    CHECK(mok_qdq_mxfp8_cols(x, M, N, off, 5, 0, N, y) == MOK_ERR_ARG, "cols offsets[E] > M");
    off[5] = 100;
    off[0] = -1;
    CHECK(mok_qdq_mxfp8_cols(x, M, N, off, 5, 0, N, y) == MOK_ERR_ARG, "cols offsets[0] < 0");
    off[0] = 3;
    CHECK(mok_qdq_mxfp8_cols(x, M, N, off, 5, 0, N + 1, y) == MOK_ERR_ARG, "cols c_end > N");
    CHECK(mok_qdq_mxfp8_cols(NULL, M, N, off, 5, 0, 1, y) == MOK_ERR_ARG, "cols x NULL");
    CHECK(mok_qdq_mxfp8_cols(NULL, 0, N, NULL, 0, 0, N, NULL) == MOK_OK, "cols M = 0");
    free(x);
    free(y);
}

/* ---------------------------------------------------------------- routing */

static void ref_softmax(const double* l, int64_t E, double* s) {
    double m = l[0], sum = 0.0;
    int64_t e;
    for (e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
    for (e = 0; e < E; e++) sum += (s[e] = exp(l[e] - m));
    for (e = 0; e < E; e++) s[e] /= sum;
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Brute-force grouped top-k on choice scores c (double). */
static void ref_select(const double* c, int64_t E, int64_t K, int64_t n_group, int64_t topk_group, int32_t* idx) {
    int allowed[64], gkeep[64], k, g, e, j;
    double gs[64];
    int64_t size = n_group > 1 ? E / n_group : E;
    for (e = 0; e < E; e++) allowed[e] = 1;
    if (n_group > 1) {
        for (g = 0; g < n_group; g++) {
            double b1 = -INFINITY, b2 = -INFINITY;
            for (j = 0; j < size; j++) {
                double v = c[g * size + j];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) b2 = v;
            }
            gs[g] = size > 1 ? b1 + b2 : b1;
            gkeep[g] = 0;
        }
        for (k = 0; k < topk_group; k++) {
            int best = -1;
            for (g = 0; g < n_group; g++)
                if (!gkeep[g] && (best < 0 || gs[g] > gs[best])) best = g;
            gkeep[best] = 1;
        }
        for (e = 0; e < E; e++) allowed[e] = gkeep[e / size];
    }
    for (k = 0; k < K; k++) {
        int best = -1;
        for (e = 0; e < E; e++)
            if (allowed[e] && (best < 0 || c[e] > c[best])) best = e;
        allowed[best] = 0;
        idx[k] = best;
    }
}

static void test_route_hand(void) {
    float l[4] = {1, 2, 3, 4}, b[4] = {10, 0, 0, 0}, w[4], zero[4] = {0, 0, 0, 0}, sg[4] = {0, 1, -1, 2};
    double ld[4] = {1, 2, 3, 4}, s[4], wd[4];
    int32_t idx[4];
    ref_softmax(ld, 4, s);
    CHECK(mok_route_topk(l, NULL, MOK_F32, 1, 4, 2, MOK_SCORE_SOFTMAX, 0, 0, 0, 1.0, idx, w) == MOK_OK, "softmax");
    CHECK(idx[0] == 3 && idx[1] == 2, "softmax idx %d %d", idx[0], idx[1]);
    CHECK(close_to(w[0], s[3], 1e-6) && close_to(w[1], s[2], 1e-6), "softmax w %g %g", w[0], w[1]);
    CHECK(mok_route_topk(ld, NULL, MOK_F64, 1, 4, 2, MOK_SCORE_SOFTMAX, 1, 1, 0, 1.0, idx, wd) == MOK_OK, "f64");
    CHECK(idx[0] == 3 && idx[1] == 2 && wd[0] == s[3] && wd[1] == s[2], "softmax f64 exact");
    mok_route_topk(l, b, MOK_F32, 1, 4, 2, MOK_SCORE_SOFTMAX, 0, 0, 0, 1.0, idx, w);
    CHECK(idx[0] == 0 && idx[1] == 3, "bias selects %d %d", idx[0], idx[1]);
    CHECK(close_to(w[0], s[0], 1e-6) && close_to(w[1], s[3], 1e-6), "bias does not weight %g", w[0]);
    mok_route_topk(zero, NULL, MOK_F32, 1, 4, 3, MOK_SCORE_SIGMOID, 0, 0, 0, 1.0, idx, w);
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && w[0] == 0.5f, "ties by lower id");
    mok_route_topk(sg, NULL, MOK_F32, 1, 4, 2, MOK_SCORE_SIGMOID, 0, 0, 0, 1.0, idx, w);
    CHECK(idx[0] == 3 && idx[1] == 1 && close_to(w[0], sigm(2), 1e-6) && close_to(w[1], sigm(1), 1e-6), "sigmoid");
    mok_route_topk(sg, NULL, MOK_F32, 1, 4, 2, MOK_SCORE_SIGMOID, 0, 0, 1, 2.5, idx, w);
    CHECK(close_to(w[0], 2.5 * sigm(2) / (sigm(2) + sigm(1)), 1e-6) && close_to(w[0] + w[1], 2.5, 1e-6),
          "renormalise + scaling %g %g", w[0], w[1]);
    mok_route_topk(sg, NULL, MOK_F32, 1, 4, 1, MOK_SCORE_SIGMOID, 0, 0, 0, 3.0, idx, w);
    CHECK(idx[0] == 3 && close_to(w[0], 3.0 * sigm(2), 1e-6), "K = 1 scaling");
    mok_route_topk(sg, NULL, MOK_F32, 1, 4, 4, MOK_SCORE_SIGMOID, 0, 0, 1, 1.0, idx, w);
    CHECK(idx[0] == 3 && idx[1] == 1 && idx[2] == 0 && idx[3] == 2, "K = E order");
    CHECK(close_to(w[0] + w[1] + w[2] + w[3], 1.0, 1e-6), "K = E renormalised");
    CHECK(mok_route_topk(sg, NULL, MOK_F32, 1, 4, 5, MOK_SCORE_SIGMOID, 0, 0, 0, 1.0, idx, w) == MOK_ERR_ARG, "K > E");
    CHECK(mok_route_topk(sg, NULL, MOK_F32, 1, 4, 0, MOK_SCORE_SIGMOID, 0, 0, 0, 1.0, idx, w) == MOK_ERR_ARG, "K = 0");
    CHECK(mok_route_topk(sg, NULL, MOK_F32, 1, 4, 2, MOK_SCORE_SIGMOID, 3, 1, 0, 1.0, idx, w) == MOK_ERR_ARG,
          "E %% n_group");
    CHECK(mok_route_topk(sg, NULL, MOK_F32, 1, 4, 3, MOK_SCORE_SIGMOID, 2, 1, 0, 1.0, idx, w) == MOK_ERR_ARG,
          "K > topk_group * group size");
    CHECK(mok_route_topk(sg, NULL, MOK_BF16, 1, 4, 2, MOK_SCORE_SIGMOID, 0, 0, 0, 1.0, idx, w) == MOK_ERR_DTYPE,
          "dtype");
}

/* Random logits against the brute-force grouped selection, both dtypes. */
static void test_route_grouped(void) {
    enum { T = 60, E = 16 };
    double l[T * E], bias[E], s[E], c[E], w[T * 4];
    float lf[T * E], bf[E], wf[T * 4];
    int32_t idx[T * 4], idxf[T * 4], ref[4], ref_ungrouped[4];
    int t, e, k, bad = 0, badf = 0, badw = 0, differs = 0, func;
    for (e = 0; e < E; e++) bf[e] = (float)(bias[e] = 0.05 * rng_sym());
    for (e = 0; e < T * E; e++) lf[e] = (float)(l[e] = 2.0 * rng_sym());
    for (e = 0; e < T * E; e++) l[e] = lf[e];
    for (e = 0; e < E; e++) bias[e] = bf[e];
    for (func = 0; func < 2; func++) {
        CHECK(mok_route_topk(l, bias, MOK_F64, T, E, 4, func, 4, 2, 1, 1.0, idx, w) == MOK_OK, "grouped f64");
        CHECK(mok_route_topk(lf, bf, MOK_F32, T, E, 4, func, 4, 2, 1, 1.0, idxf, wf) == MOK_OK, "grouped f32");
        for (t = 0; t < T; t++) {
            double sum = 0.0;
            if (func == MOK_SCORE_SOFTMAX) ref_softmax(l + t * E, E, s);
            else
                for (e = 0; e < E; e++) s[e] = sigm(l[t * E + e]);
            for (e = 0; e < E; e++) c[e] = s[e] + bias[e];
            ref_select(c, E, 4, 4, 2, ref);
            ref_select(c, E, 4, 1, 1, ref_ungrouped);
            for (k = 0; k < 4; k++) {
                bad += idx[t * 4 + k] != ref[k];
                badf += idxf[t * 4 + k] != ref[k];
                differs += ref[k] != ref_ungrouped[k];
                sum += s[ref[k]];
            }
            for (k = 0; k < 4; k++) {
                badw += !close_to(w[t * 4 + k], s[ref[k]] / sum, 1e-12);
                badw += !close_to(wf[t * 4 + k], s[ref[k]] / sum, 1e-5);
            }
        }
    }
    CHECK(bad == 0 && badf == 0, "grouped selection mismatches f64 %d f32 %d", bad, badf);
    CHECK(badw == 0, "grouped weights mismatches %d", badw);
    CHECK(differs > 0, "grouping never changed the selection");
}

static double route_loss(const double* l, const int32_t* want, const double* g, int64_t T, int64_t E, int64_t K,
                         int func, int renorm, double scaling, int* changed) {
    int32_t idx[64];
    double w[64], L = 0.0;
    int64_t i;
    mok_route_topk(l, NULL, MOK_F64, T, E, K, func, 0, 0, renorm, scaling, idx, w);
    for (i = 0; i < T * K; i++) {
        *changed |= idx[i] != want[i];
        L += g[i] * w[i];
    }
    return L;
}

static void test_route_backward(void) {
    enum { T = 3, E = 6, K = 3 };
    double l[T * E], g[T * K], w[T * K], gl[T * E], lp[T * E];
    float lf[T * E], gf[T * K], glf[T * E];
    int32_t idx[T * K];
    int func, renorm, i, bad, badf, changed;
    const double h = 1e-6, scaling = 1.7;
    for (i = 0; i < T * E; i++) l[i] = lf[i] = (float)(1.5 * rng_sym());
    for (i = 0; i < T * E; i++) l[i] = lf[i];
    for (i = 0; i < T * K; i++) g[i] = gf[i] = (float)rng_sym();
    for (i = 0; i < T * K; i++) g[i] = gf[i];
    for (func = 0; func < 2; func++) {
        for (renorm = 0; renorm < 2; renorm++) {
            bad = badf = changed = 0;
            mok_route_topk(l, NULL, MOK_F64, T, E, K, func, 0, 0, renorm, scaling, idx, w);
            CHECK(mok_route_topk_backward(g, l, idx, MOK_F64, T, E, K, func, renorm, scaling, gl) == MOK_OK, "bwd");
            CHECK(mok_route_topk_backward(gf, lf, idx, MOK_F32, T, E, K, func, renorm, scaling, glf) == MOK_OK, "bwd");
            for (i = 0; i < T * E; i++) {
                double fp, fm, fd;
                memcpy(lp, l, sizeof lp);
                lp[i] = l[i] + h;
                fp = route_loss(lp, idx, g, T, E, K, func, renorm, scaling, &changed);
                lp[i] = l[i] - h;
                fm = route_loss(lp, idx, g, T, E, K, func, renorm, scaling, &changed);
                fd = (fp - fm) / (2 * h);
                if (fabs(fd - gl[i]) > 1e-6 * (1.0 + fabs(fd))) {
                    if (++bad <= 3) printf("  func %d renorm %d i %d: fd %.10g grad %.10g\n", func, renorm, i, fd, gl[i]);
                }
                badf += !close_to(glf[i], gl[i], 1e-5);
            }
            CHECK(!changed, "selection changed under perturbation");
            CHECK(bad == 0, "route backward vs finite differences func %d renorm %d: %d", func, renorm, bad);
            CHECK(badf == 0, "route backward f32 vs f64 func %d renorm %d: %d", func, renorm, badf);
        }
    }
    idx[0] = E;
    CHECK(mok_route_topk_backward(g, l, idx, MOK_F64, T, E, K, 0, 0, 1.0, gl) == MOK_ERR_EXPERT_ID, "bad id");
}

/* ---------------------------------------------------------------- plan */

typedef struct {
    int64_t T, K, E, tile, cap;
    int32_t *idx, *counts, *offsets, *row_of, *src_of_row, skipped;
} plan_t;

static void plan_free(plan_t* p) {
    free(p->idx);
    free(p->counts);
    free(p->offsets);
    free(p->row_of);
    free(p->src_of_row);
}

/* Allocate a plan for the given ids (copied); ids == NULL draws random ids in [0, E). */
static plan_t plan_alloc(const int32_t* ids, int64_t T, int64_t K, int64_t E, int64_t tile) {
    plan_t p;
    int64_t i;
    p.T = T;
    p.K = K;
    p.E = E;
    p.tile = tile;
    p.cap = mok_plan_capacity(T, K, E, tile);
    p.idx = (int32_t*)malloc(sizeof(int32_t) * (size_t)(T * K + 1));
    p.counts = (int32_t*)malloc(sizeof(int32_t) * (size_t)(E + 1));
    p.offsets = (int32_t*)malloc(sizeof(int32_t) * (size_t)(E + 1));
    p.row_of = (int32_t*)malloc(sizeof(int32_t) * (size_t)(T * K + 1));
    p.src_of_row = (int32_t*)malloc(sizeof(int32_t) * (size_t)(p.cap + 1));
    for (i = 0; i < T * K; i++) p.idx[i] = ids ? ids[i] : (int32_t)rng_int(E);
    p.skipped = -7;
    return p;
}

static int plan_run(plan_t* p, int skip_invalid) {
    return mok_plan_build(p->idx, p->T, p->K, p->E, p->tile, p->cap, skip_invalid, p->counts, p->offsets, p->row_of,
                          p->src_of_row, &p->skipped);
}

/* Every documented property of a built plan; returns the number of violations. */
static int plan_violations(const plan_t* p) {
    int64_t e, i, r, pairs = p->T * p->K, skipped = 0;
    int bad = 0;
    if (p->offsets[0] != 0) bad++;
    for (e = 0; e < p->E; e++) {
        int64_t cnt = 0;
        for (i = 0; i < pairs; i++) cnt += p->idx[i] == e;
        bad += p->counts[e] != cnt;
        bad += p->offsets[e + 1] - p->offsets[e] != round_up(cnt, p->tile);
        /* rows hold the pairs in increasing t * K + k, then padding */
        for (r = p->offsets[e]; r < p->offsets[e + 1]; r++) {
            int64_t s = p->src_of_row[r];
            if (r < p->offsets[e] + cnt)
                bad += s < 0 || s >= pairs || p->idx[s] != e || (r > p->offsets[e] && s <= p->src_of_row[r - 1]);
            else bad += s != -1;
        }
    }
    bad += p->offsets[p->E] > p->cap;
    for (r = p->offsets[p->E]; r < p->cap; r++) bad += p->src_of_row[r] != -1;
    for (i = 0; i < pairs; i++) {
        int32_t x = p->idx[i], row = p->row_of[i];
        if (x < 0 || x >= p->E) {
            skipped++;
            bad += row != -1;
            continue;
        }
        bad += row < p->offsets[x] || row >= p->offsets[x] + p->counts[x] || row >= p->cap || p->src_of_row[row] != i;
    }
    for (r = 0; r < p->cap; r++)
        if (p->src_of_row[r] >= 0) bad += p->src_of_row[r] >= pairs || p->row_of[p->src_of_row[r]] != r;
    bad += p->skipped != skipped;
    return bad;
}

static void test_plan(void) {
    static const int64_t Ts[] = {0, 1, 7, 300}, Ks[] = {1, 2, 8}, Es[] = {1, 5, 17}, tiles[] = {1, 4, 128};
    int a, b, c, d, rep;
    int32_t ids[64];
    plan_t p;
    for (a = 0; a < 4; a++)
        for (b = 0; b < 3; b++)
            for (c = 0; c < 3; c++)
                for (d = 0; d < 3; d++)
                    for (rep = 0; rep < 2; rep++) {
                        p = plan_alloc(NULL, Ts[a], Ks[b], Es[c], tiles[d]);
                        CHECK(plan_run(&p, 0) == MOK_OK, "plan T %d K %d E %d tile %d", (int)Ts[a], (int)Ks[b],
                              (int)Es[c], (int)tiles[d]);
                        CHECK(plan_violations(&p) == 0, "plan T %d K %d E %d tile %d: %d", (int)Ts[a], (int)Ks[b],
                              (int)Es[c], (int)tiles[d], plan_violations(&p));
                        plan_free(&p);
                    }
    CHECK(mok_plan_capacity(0, 4, 8, 128) == 0 && mok_plan_capacity(3, 2, 8, 1) == 6, "capacity");
    CHECK(mok_plan_capacity(3, 2, 8, 4) == 24 && mok_plan_capacity(10, 2, 3, 4) == 32, "capacity tiles");
    /* worst case: one pair per expert fills the capacity exactly */
    for (a = 0; a < 12; a++) ids[a] = a;
    p = plan_alloc(ids, 6, 2, 12, 4);
    CHECK(plan_run(&p, 0) == MOK_OK && plan_violations(&p) == 0 && p.offsets[12] == p.cap, "worst case capacity");
    plan_free(&p);
    /* all tokens to one expert; experts without tokens */
    for (a = 0; a < 40; a++) ids[a] = 2;
    p = plan_alloc(ids, 40, 1, 5, 8);
    CHECK(plan_run(&p, 0) == MOK_OK && plan_violations(&p) == 0, "one expert");
    CHECK(p.counts[2] == 40 && p.counts[0] == 0 && p.offsets[2] == 0 && p.offsets[3] == 40 && p.offsets[5] == 40,
          "one expert offsets");
    plan_free(&p);
    /* invalid ids */
    for (a = 0; a < 12; a++) ids[a] = a % 4;
    ids[3] = -1;
    ids[7] = 4;
    p = plan_alloc(ids, 6, 2, 4, 4);
    CHECK(plan_run(&p, 0) == MOK_ERR_EXPERT_ID, "invalid id rejected");
    CHECK(plan_run(&p, 1) == MOK_OK && p.skipped == 2 && plan_violations(&p) == 0, "invalid ids skipped: %d",
          (int)p.skipped);
    CHECK(p.row_of[3] == -1 && p.row_of[7] == -1 && p.counts[3] == 1, "skipped rows");
    p.cap--;
    CHECK(plan_run(&p, 1) == MOK_ERR_CAPACITY, "capacity too small");
    p.cap++;
    CHECK(mok_plan_build(p.idx, -1, 2, 4, 4, p.cap, 0, p.counts, p.offsets, p.row_of, p.src_of_row, NULL) == MOK_ERR_ARG,
          "T < 0");
    CHECK(mok_plan_build(p.idx, 6, 2, 4, 0, p.cap, 0, p.counts, p.offsets, p.row_of, p.src_of_row, NULL) == MOK_ERR_ARG,
          "tile 0");
    CHECK(mok_plan_build(p.idx, 6, 2, 4, 4, p.cap, 0, p.counts, NULL, p.row_of, p.src_of_row, NULL) == MOK_ERR_ARG,
          "NULL offsets");
    CHECK(mok_plan_build(NULL, 6, 2, 4, 4, p.cap, 0, p.counts, p.offsets, p.row_of, p.src_of_row, NULL) == MOK_ERR_ARG,
          "NULL ids");
    CHECK(mok_plan_build(NULL, 0, 2, 4, 4, 0, 0, p.counts, p.offsets, NULL, NULL, NULL) == MOK_OK && p.offsets[4] == 0,
          "T = 0 with NULL pair arrays");
    plan_free(&p);
}

/* ---------------------------------------------------------------- rows, swiglu */

/* A random plan with some skipped pairs and one expert (1) without tokens. */
static plan_t rows_plan(int64_t T, int64_t K, int64_t E, int64_t tile) {
    plan_t p = plan_alloc(NULL, T, K, E, tile);
    int64_t i;
    for (i = 0; i < T * K; i++) {
        if (p.idx[i] == 1) p.idx[i] = 0;
        if (rng_int(15) == 0) p.idx[i] = -1;
    }
    plan_run(&p, 1);
    return p;
}

static void test_rows(mok_dtype dt) {
    const int64_t T = 13, K = 3, E = 5, H = 300;
    plan_t p = rows_plan(T, K, E, 4);
    int64_t R = p.cap, r, h, t, k;
    void *x = rand_buf(dt, T * H, 2.0), *out = malloc((size_t)(R * H) * dt_size(dt)), *w = rand_w(dt, T * K);
    void *y = malloc((size_t)(T * H) * dt_size(dt)), *dy = rand_buf(dt, T * H, 1.0), *dw = malloc(8 * (size_t)(T * K));
    double tol = tol_of(dt);
    int bad = 0, badz = 0, badu = 0, pass;
    for (pass = 0; pass < 2; pass++) {
        const void* ww = pass ? w : NULL;
        fill_garbage(out, dt, R * H);
        CHECK(mok_gather_rows(x, dt, T, H, K, p.src_of_row, ww, 2, R, out) == MOK_OK, "gather %s", dt_name(dt));
        CHECK(mok_gather_rows(x, dt, T, H, K, p.src_of_row, ww, 0, 2, out) == MOK_OK, "gather %s", dt_name(dt));
        for (r = 0; r < R; r++) {
            int64_t s = p.src_of_row[r];
            for (h = 0; h < H; h++) {
                double want = s < 0 ? 0.0 : (ww ? wv(w, dt, s) : 1.0) * tl(x, dt, s / K * H + h);
                if (s < 0) badz += tl(out, dt, r * H + h) != 0.0;
                else if (dt == MOK_F64 || !ww) bad += tl(out, dt, r * H + h) != want;
                else bad += !close_to(tl(out, dt, r * H + h), want, tol);
            }
        }
    }
    CHECK(bad == 0 && badz == 0, "gather %s mismatches %d zero rows %d", dt_name(dt), bad, badz);
    fill_garbage(out, dt, R * H);
    mok_gather_rows(x, dt, T, H, K, p.src_of_row, w, 4, 8, out);
    for (r = 0; r < R; r++)
        if (r < 4 || r >= 8) badu += tl(out, dt, r * H) != tl(out, dt, 0) || tl(out, dt, 0) == 0.0;
    CHECK(badu == 0, "gather wrote outside its row range");
    CHECK(mok_gather_rows(x, dt, T, H, K, p.src_of_row, w, 3, 2, out) == MOK_ERR_ARG, "gather bad range");

    /* combine and its weight gradient on the gathered rows (out = rows) */
    mok_gather_rows(x, dt, T, H, K, p.src_of_row, NULL, 0, R, out);
    bad = 0;
    for (pass = 0; pass < 2; pass++) {
        const void* ww = pass ? w : NULL;
        fill_garbage(y, dt, T * H);
        CHECK(mok_combine(out, dt, R, H, p.row_of, ww, K, 0, T, y) == MOK_OK, "combine %s", dt_name(dt));
        for (t = 0; t < T; t++)
            for (h = 0; h < H; h++) {
                double acc = 0.0;
                for (k = 0; k < K; k++) {
                    int32_t row = p.row_of[t * K + k];
                    if (row >= 0) acc += (ww ? wv(w, dt, t * K + k) : 1.0) * tl(out, dt, row * H + h);
                }
                bad += dt == MOK_F64 ? tl(y, dt, t * H + h) != acc : !close_to(tl(y, dt, t * H + h), acc, tol);
            }
    }
    CHECK(bad == 0, "combine %s mismatches %d", dt_name(dt), bad);
    bad = 0;
    CHECK(mok_combine_weight_grad(dy, out, dt, H, p.row_of, K, 0, T, dw) == MOK_OK, "combine wgrad");
    for (t = 0; t < T; t++)
        for (k = 0; k < K; k++) {
            int32_t row = p.row_of[t * K + k];
            double acc = 0.0;
            for (h = 0; row >= 0 && h < H; h++) acc += tl(dy, dt, t * H + h) * tl(out, dt, row * H + h);
            if (row < 0) bad += wv(dw, dt, t * K + k) != 0.0;
            else bad += dt == MOK_F64 ? wv(dw, dt, t * K + k) != acc
                                      : !close_to(wv(dw, dt, t * K + k), acc, 1e-5 * sqrt((double)H));
        }
    CHECK(bad == 0, "combine weight grad %s mismatches %d", dt_name(dt), bad);
    {
        int32_t bad_row[3] = {0, (int32_t)R, 1};
        CHECK(mok_combine(out, dt, R, H, bad_row, w, 3, 0, 1, y) == MOK_ERR_ARG, "combine row >= R");
    }
    free(x);
    free(out);
    free(w);
    free(y);
    free(dy);
    free(dw);
    plan_free(&p);
}

static void ref_swiglu(const double* g, const double* u, double* a, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) a[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
}

/* Row-scaled SwiGLU backward: a padding row, a row whose chunk straddles CH, the bad-index error. */
static void test_swiglu_scaled(mok_dtype dt) {
    enum { R = 5, I = 300, NP = 7 };
    const int32_t src[R] = {3, -1, 0, 6, 2};
    void *h = rand_buf(dt, R * 2 * I, 4.0), *dz = rand_buf(dt, R * I, 1.0), *w = rand_w(dt, NP);
    void *dh = malloc((size_t)(R * 2 * I) * dt_size(dt)), *z = malloc((size_t)(R * I) * dt_size(dt));
    void* act = malloc((size_t)I * dt_size(dt));
    double ds[R], tol = dt == MOK_F64 ? 1e-13 : tol_of(dt);
    int64_t r, i;
    int bad = 0;
    CHECK(mok_swiglu_scaled_backward(h, dz, dt, I, src, w, NP, 0, R, dh, z, ds) == MOK_OK, "scaled swiglu %s",
          dt_name(dt));
    for (r = 0; r < R; r++) {
        const double sc = src[r] < 0 ? 0.0 : wv(w, dt, src[r]);
        double dot = 0, mag = 0, got_ds = dt == MOK_F64 ? ds[r] : (double)((float*)ds)[r];
        for (i = 0; i < I; i++) { /* the forward's act, rounded to dt */
            double g = tl(h, dt, r * 2 * I + i), u = tl(h, dt, r * 2 * I + I + i);
            ts(act, dt, i, g / (1.0 + exp(-g)) * u);
        }
        for (i = 0; i < I; i++) {
            double g = tl(h, dt, r * 2 * I + i), u = tl(h, dt, r * 2 * I + I + i), a = tl(act, dt, i);
            double d = tl(dz, dt, r * I + i), da = sc * d, sg = 1.0 / (1.0 + exp(-g));
            dot += d * a;
            mag += fabs(d * a);
            bad += !close_to(tl(z, dt, r * I + i), sc * a, tol);
            bad += !close_to(tl(dh, dt, r * 2 * I + i), da * u * sg * (1.0 + g * (1.0 - sg)), tol);
            bad += !close_to(tl(dh, dt, r * 2 * I + I + i), da * g * sg, tol);
        }
        bad += fabs(got_ds - dot) > tol * (1.0 + mag);
        if (src[r] < 0) bad += tl(z, dt, r * I) != 0.0 || tl(dh, dt, r * 2 * I) != 0.0;
    }
    CHECK(bad == 0, "scaled swiglu %s mismatches %d", dt_name(dt), bad);
    CHECK(mok_swiglu_scaled_backward(h, dz, dt, I, src, w, 6, 0, R, dh, z, ds) == MOK_ERR_ARG,
          "scaled swiglu: src_of_row >= n_pairs");
    free(h);
    free(dz);
    free(w);
    free(dh);
    free(z);
    free(act);
}

static void test_swiglu(mok_dtype dt) {
    enum { R = 5, I = 300 };
    void *h = rand_buf(dt, R * 2 * I, 4.0), *da = rand_buf(dt, R * I, 1.0);
    void *act = malloc((size_t)(R * I) * dt_size(dt)), *dh = malloc((size_t)(R * 2 * I) * dt_size(dt));
    double g[I], u[I], a[I], tol = tol_of(dt);
    int64_t r, i;
    int bad = 0, badb = 0;
    fill_garbage(act, dt, R * I);
    CHECK(mok_swiglu_forward(h, dt, I, 1, R, act) == MOK_OK, "swiglu fwd %s", dt_name(dt));
    CHECK(tl(act, dt, 0) == GARBAGE, "swiglu wrote row 0");
    CHECK(mok_swiglu_backward(h, da, dt, I, 0, R, dh) == MOK_OK, "swiglu bwd %s", dt_name(dt));
    for (r = 1; r < R; r++) {
        for (i = 0; i < I; i++) {
            g[i] = tl(h, dt, r * 2 * I + i);
            u[i] = tl(h, dt, r * 2 * I + I + i);
        }
        ref_swiglu(g, u, a, I);
        for (i = 0; i < I; i++) {
            double d = tl(da, dt, r * I + i), s = 1.0 / (1.0 + exp(-g[i]));
            double dg = d * u[i] * s * (1.0 + g[i] * (1.0 - s)), du = d * g[i] * s;
            bad += !close_to(tl(act, dt, r * I + i), a[i], dt == MOK_F64 ? 1e-15 : tol);
            badb += !close_to(tl(dh, dt, r * 2 * I + i), dg, dt == MOK_F64 ? 1e-14 : tol);
            badb += !close_to(tl(dh, dt, r * 2 * I + I + i), du, dt == MOK_F64 ? 1e-14 : tol);
        }
    }
    CHECK(bad == 0, "swiglu fwd %s mismatches %d", dt_name(dt), bad);
    CHECK(badb == 0, "swiglu bwd %s mismatches %d", dt_name(dt), badb);
    if (dt == MOK_F64) { /* backward against central differences of sum(d_act * act) */
        const double eps = 1e-6;
        double* hd = (double*)h;
        int bad_fd = 0;
        for (i = 0; i < 2 * I; i += 7) {
            double keep = hd[i], lp = 0, lm = 0, ap[I];
            int64_t j;
            hd[i] = keep + eps;
            mok_swiglu_forward(h, dt, I, 0, 1, ap);
            for (j = 0; j < I; j++) lp += ((double*)da)[j] * ap[j];
            hd[i] = keep - eps;
            mok_swiglu_forward(h, dt, I, 0, 1, ap);
            for (j = 0; j < I; j++) lm += ((double*)da)[j] * ap[j];
            hd[i] = keep;
            bad_fd += !close_to(((double*)dh)[i], (lp - lm) / (2 * eps), 1e-6);
        }
        CHECK(bad_fd == 0, "swiglu backward vs finite differences: %d", bad_fd);
    }
    CHECK(mok_swiglu_forward(h, dt, -1, 0, R, act) == MOK_ERR_ARG, "swiglu I < 0");
    free(h);
    free(da);
    free(act);
    free(dh);
}

/* ---------------------------------------------------------------- grouped GEMM */

/* Naive reference in the accumulation type, same k order; written straight to dt. */
static void ref_gemm(const void* a, const int32_t* ag, int64_t div, const void* b, mok_dtype dt, const int32_t* off,
                     int64_t E, int64_t N, int64_t Kd, int trans, int64_t R, void* out) {
    int64_t r, n, k, e;
    for (r = 0; r < R; r++) {
        int64_t src = ag ? (ag[r] < 0 ? -1 : ag[r] / div) : r;
        for (e = 0; e < E && !(r >= off[e] && r < off[e + 1]); e++) {
        }
        for (n = 0; n < N; n++) {
            double sd = 0.0;
            float sf = 0.0f;
            for (k = 0; e < E && src >= 0 && k < Kd; k++) {
                double av = tl(a, dt, src * Kd + k);
                double bv = tl(b, dt, trans ? (e * N + n) * Kd + k : (e * Kd + k) * N + n);
                if (dt == MOK_F64) sd += av * bv;
                else {
                    float p = (float)av * (float)bv;
                    sf += p;
                }
            }
            ts(out, dt, r * N + n, dt == MOK_F64 ? sd : (double)sf);
        }
    }
}

static void ref_wgrad(const void* a, const void* b, const int32_t* bg, int64_t div, mok_dtype dt, const int32_t* off,
                      int64_t M, int64_t N, int64_t E, void* out) {
    int64_t e, m, n, r;
    for (e = 0; e < E; e++)
        for (m = 0; m < M; m++)
            for (n = 0; n < N; n++) {
                double sd = 0.0;
                float sf = 0.0f;
                for (r = off[e]; r < off[e + 1]; r++) {
                    int64_t src = bg ? (bg[r] < 0 ? -1 : bg[r] / div) : r;
                    double av = tl(a, dt, r * M + m), bv = src < 0 ? 0.0 : tl(b, dt, src * N + n);
                    if (dt == MOK_F64) sd += av * bv;
                    else {
                        float p = (float)av * (float)bv;
                        sf += p;
                    }
                }
                ts(out, dt, (e * M + m) * N + n, dt == MOK_F64 ? sd : (double)sf);
            }
}

/* Double-precision check of a result against the exact math (inputs as stored). */
static int gemm_vs_double(const void* got, const void* a, const int32_t* ag, int64_t div, const void* b, mok_dtype dt,
                          const int32_t* off, int64_t E, int64_t N, int64_t Kd, int trans, int64_t R) {
    int64_t r, n, k, e;
    int bad = 0;
    for (r = 0; r < R; r++) {
        int64_t src = ag ? (ag[r] < 0 ? -1 : ag[r] / div) : r;
        for (e = 0; e < E && !(r >= off[e] && r < off[e + 1]); e++) {
        }
        for (n = 0; n < N; n++) {
            double s = 0.0, mag = 0.0;
            for (k = 0; e < E && src >= 0 && k < Kd; k++) {
                double p = tl(a, dt, src * Kd + k) * tl(b, dt, trans ? (e * N + n) * Kd + k : (e * Kd + k) * N + n);
                s += p;
                mag += fabs(p);
            }
            bad += fabs(tl(got, dt, r * N + n) - s) > tol_of(dt) * (1.0 + mag);
        }
    }
    return bad;
}

static void test_gemm(mok_dtype dt) {
    const int64_t T = 37, K = 2, E = 4, Kd = 70, N = 45;
    plan_t p = rows_plan(T, K, E, 4);
    int64_t R = p.cap, trans, gather;
    size_t sz = dt_size(dt);
    void *x = rand_buf(dt, T * Kd, 1.0), *rows = rand_buf(dt, R * Kd, 1.0), *b = rand_buf(dt, E * N * Kd, 1.0);
    void *out = malloc((size_t)(R * N) * sz), *ref = malloc((size_t)(R * N) * sz);
    void *dout = rand_buf(dt, R * N, 1.0), *wg = malloc((size_t)(E * Kd * N) * sz), *wref = malloc((size_t)(E * Kd * N) * sz);
    for (trans = 0; trans < 2; trans++) {
        for (gather = 0; gather < 2; gather++) {
            const void* a = gather ? x : rows;
            const int32_t* ag = gather ? p.src_of_row : NULL;
            int64_t r, diff = 0, outside = 0;
            fill_garbage(out, dt, R * N);
            CHECK(mok_grouped_gemm(a, ag, K, b, dt, p.offsets, E, N, Kd, (int)trans, 9, R, out) == MOK_OK, "gemm");
            CHECK(mok_grouped_gemm(a, ag, K, b, dt, p.offsets, E, N, Kd, (int)trans, 0, 9, out) == MOK_OK, "gemm");
            ref_gemm(a, ag, K, b, dt, p.offsets, E, N, Kd, (int)trans, R, ref);
            for (r = 0; r < R * N; r++) diff += memcmp((char*)out + r * sz, (char*)ref + r * sz, sz) != 0;
            for (r = p.offsets[E] * N; r < R * N; r++) outside += tl(out, dt, r) != 0.0;
            CHECK(diff == 0, "gemm %s trans %d gather %d: %d elements differ from the naive loop", dt_name(dt),
                  (int)trans, (int)gather, (int)diff);
            CHECK(outside == 0, "gemm rows past offsets[E] not zero");
            CHECK(gemm_vs_double(out, a, ag, K, b, dt, p.offsets, E, N, Kd, (int)trans, R) == 0,
                  "gemm %s vs double", dt_name(dt));
            /* a sub-range leaves other rows alone */
            fill_garbage(out, dt, R * N);
            mok_grouped_gemm(a, ag, K, b, dt, p.offsets, E, N, Kd, (int)trans, 5, 23, out);
            diff = 0;
            for (r = 0; r < R * N; r++) {
                if (r >= 5 * N && r < 23 * N) diff += memcmp((char*)out + r * sz, (char*)ref + r * sz, sz) != 0;
                else diff += tl(out, dt, r) != GARBAGE;
            }
            CHECK(diff == 0, "gemm sub-range %s", dt_name(dt));
        }
    }
    for (gather = 0; gather < 2; gather++) {
        /* wgrad: d_out^T [N x R] times B [R x Kd] -> [E, N, Kd] */
        const void* bb = gather ? x : rows;
        const int32_t* bg = gather ? p.src_of_row : NULL;
        int64_t i, diff = 0, nz = 0;
        fill_garbage(wg, dt, E * Kd * N);
        CHECK(mok_grouped_gemm_wgrad(dout, bb, bg, K, dt, p.offsets, N, Kd, 0, E, wg) == MOK_OK, "wgrad");
        ref_wgrad(dout, bb, bg, K, dt, p.offsets, N, Kd, E, wref);
        for (i = 0; i < E * Kd * N; i++) diff += memcmp((char*)wg + i * sz, (char*)wref + i * sz, sz) != 0;
        for (i = N * Kd; i < 2 * N * Kd; i++) nz += tl(wg, dt, i) != 0.0; /* expert 1 has no rows */
        CHECK(p.counts[1] == 0 && nz == 0, "wgrad of an empty expert is not zero");
        CHECK(diff == 0, "wgrad %s gather %d: %d elements differ", dt_name(dt), (int)gather, (int)diff);
        if (dt != MOK_BF16) { /* against double */
            int64_t e, m, n, r;
            int bad = 0;
            for (e = 0; e < E; e++)
                for (m = 0; m < N; m++)
                    for (n = 0; n < Kd; n++) {
                        double s = 0.0, mag = 0.0;
                        for (r = p.offsets[e]; r < p.offsets[e + 1]; r++) {
                            int64_t src = bg ? (bg[r] < 0 ? -1 : bg[r] / K) : r;
                            double v = src < 0 ? 0.0 : tl(dout, dt, r * N + m) * tl(bb, dt, src * Kd + n);
                            s += v;
                            mag += fabs(v);
                        }
                        bad += fabs(tl(wg, dt, (e * N + m) * Kd + n) - s) > tol_of(dt) * (1.0 + mag);
                    }
            CHECK(bad == 0, "wgrad %s vs double: %d", dt_name(dt), bad);
        }
    }
    {
        int32_t dec[3] = {0, 5, 3};
        CHECK(mok_grouped_gemm(x, NULL, 1, b, dt, dec, 2, N, Kd, 1, 0, 5, out) == MOK_ERR_ARG, "decreasing offsets");
        CHECK(mok_grouped_gemm(x, NULL, 1, b, dt, p.offsets, -1, N, Kd, 1, 0, 5, out) == MOK_ERR_ARG, "E < 0");
        CHECK(mok_grouped_gemm(x, p.src_of_row, 0, b, dt, p.offsets, E, N, Kd, 1, 0, 5, out) == MOK_ERR_ARG, "div 0");
        CHECK(mok_grouped_gemm_wgrad(dout, x, NULL, 1, (mok_dtype)7, p.offsets, N, Kd, 0, E, wg) == MOK_ERR_DTYPE,
              "wgrad dtype");
    }
    free(x);
    free(rows);
    free(b);
    free(out);
    free(ref);
    free(dout);
    free(wg);
    free(wref);
    plan_free(&p);
}

/* ---------------------------------------------------------------- FP8 blockwise grouped GEMM */

/* A random E4M3 code that is not NaN. */
static uint8_t rand_e4m3(void) {
    uint8_t c;
    do c = (uint8_t)(rng_u64() & 0xffu);
    while ((c & 0x7fu) == 0x7fu);
    return c;
}

/* The formula of mok_core.h, one element at a time. */
static void ref_gemm_fp8(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, const int32_t* off,
                         int64_t E, int64_t N, int64_t K, int64_t R, uint16_t* out) {
    const int64_t nkb = (K + 127) / 128, nnb = (N + 127) / 128;
    int64_t r, n, kb, k, e;
    for (r = 0; r < R; r++) {
        for (e = 0; e < E && !(r >= off[e] && r < off[e + 1]); e++) {
        }
        for (n = 0; n < N; n++) {
            double acc = 0.0;
            for (kb = 0; e < E && kb < nkb; kb++) {
                double s = 0.0;
                for (k = kb * 128; k < K && k < kb * 128 + 128; k++)
                    s += (double)mok_e4m3_to_f32(a[r * K + k]) * (double)mok_e4m3_to_f32(b[(e * N + n) * K + k]);
                acc += s * ((double)sa[r * nkb + kb] * (double)sb[(e * nnb + n / 128) * nkb + kb]);
            }
            out[r * N + n] = mok_f32_to_bf16((float)acc);
        }
    }
}

static void test_gemm_fp8_hand(void) {
    /* R = 4, E = 2, N = 2, K = 256 (two K blocks, one N tile): rows 0-1 expert 0, row 2 expert 1,
     * row 3 outside every expert. */
    enum { R = 4, E = 2, N = 2, K = 256 };
    static uint8_t a[R * K], b[E * N * K];
    float sa[R * 2] = {0.25f, 4.0f, 0.5f, 1.0f, 1.005859375f, 3.0f, 7.0f, 7.0f};
    float sb[E * 1 * 2] = {2.0f, 0.125f, 1.0f, 0.5f};
    int32_t off[E + 1] = {0, 2, 3};
    uint16_t out[R * N];
    int i;
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
#define A_(r, k) a[(r) * K + (k)]
#define B_(e, n, k) b[((e) * N + (n)) * K + (k)]
    A_(0, 0) = mok_f32_to_e4m3(1.0f);
    A_(0, 1) = mok_f32_to_e4m3(2.0f);
    A_(0, 128) = mok_f32_to_e4m3(0.5f);
    B_(0, 0, 0) = mok_f32_to_e4m3(3.0f);
    B_(0, 0, 1) = mok_f32_to_e4m3(-1.0f);
    B_(0, 0, 128) = mok_f32_to_e4m3(6.0f);
    B_(0, 1, 1) = mok_f32_to_e4m3(0.5f);
    A_(1, 5) = mok_f32_to_e4m3(-448.0f);
    B_(0, 0, 5) = mok_f32_to_e4m3(0.25f);
    A_(2, 0) = mok_f32_to_e4m3(1.0f);
    A_(2, 130) = mok_f32_to_e4m3(1.5f);
    B_(1, 0, 0) = mok_f32_to_e4m3(1.0f);
    B_(1, 1, 130) = mok_f32_to_e4m3(-2.0f);
    for (i = 0; i < K; i++) A_(3, i) = mok_f32_to_e4m3(1.0f); /* outside: must not show */
    for (i = 0; i < K; i++) B_(1, 0, i) = i == 0 ? B_(1, 0, i) : mok_f32_to_e4m3(0.0f);
#undef A_
#undef B_
    for (i = 0; i < R * N; i++) out[i] = 0x7777;
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, E, N, K, 0, R, out) == MOK_OK, "fp8 gemm hand");
    /* out[0,0] = 0.25*2*(1*3 + 2*-1) + 4*0.125*(0.5*6) = 2; out[0,1] = 0.25*2*(2*0.5) = 0.5 */
    CHECK(out[0] == mok_f32_to_bf16(2.0f) && out[1] == mok_f32_to_bf16(0.5f), "fp8 hand row 0: %04x %04x", out[0],
          out[1]);
    /* out[1,0] = 0.5*2*(-448*0.25) = -112 */
    CHECK(out[2] == mok_f32_to_bf16(-112.0f) && out[3] == 0, "fp8 hand row 1: %04x %04x", out[2], out[3]);
    /* out[2,0] = 1.005859375*1*(1*1) rounds to bf16 1.0078125 (0x3f81); out[2,1] = 3*0.5*(1.5*-2) = -4.5 */
    CHECK(out[4] == 0x3f81 && out[5] == mok_f32_to_bf16(-4.5f), "fp8 hand row 2: %04x %04x", out[4], out[5]);
    CHECK(out[6] == 0 && out[7] == 0, "fp8 hand row 3 (outside the experts) not +0: %04x %04x", out[6], out[7]);
    /* A NaN code reaches its row only. */
    a[2 * K + 7] = 0x7f;
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, E, N, K, 0, R, out) == MOK_OK, "fp8 gemm NaN");
    CHECK(is_bf16_nan(out[4]) && is_bf16_nan(out[5]) && out[0] == mok_f32_to_bf16(2.0f), "fp8 NaN propagation");
}

static void test_gemm_fp8_random(void) {
    /* Partial K and N blocks (the core allows them), an empty expert, rows past offsets[E]. */
    static const int64_t shapes[][2] = {{45, 200}, {256, 384}, {130, 128}, {7, 0}};
    int si;
    for (si = 0; si < 4; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1], E = 4, R = 41;
        const int64_t nkb = (K + 127) / 128, nnb = (N + 127) / 128;
        int32_t off[5] = {3, 12, 12, 30, 37}; /* rows 0-2 and 37-40 outside; expert 1 empty */
        uint8_t* a = malloc((size_t)(R * K + 1));
        uint8_t* b = malloc((size_t)(E * N * K + 1));
        float* sa = malloc((size_t)(R * nkb + 1) * sizeof(float));
        float* sb = malloc((size_t)(E * nnb * nkb + 1) * sizeof(float));
        uint16_t* out = malloc((size_t)(R * N) * sizeof(uint16_t));
        uint16_t* ref = malloc((size_t)(R * N) * sizeof(uint16_t));
        int64_t i, diff = 0, outside = 0;
        for (i = 0; i < R * K; i++) a[i] = rand_e4m3();
        for (i = 0; i < E * N * K; i++) b[i] = rand_e4m3();
        for (i = 0; i < R * nkb; i++) sa[i] = (float)ldexp(0.5 + rng_unif(), (int)rng_int(20) - 10);
        for (i = 0; i < E * nnb * nkb; i++) sb[i] = (float)ldexp(0.5 + rng_unif(), (int)rng_int(20) - 10);
        ref_gemm_fp8(a, sa, b, sb, off, E, N, K, R, ref);
        for (i = 0; i < R * N; i++) out[i] = 0x7777;
        CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, E, N, K, 20, R, out) == MOK_OK, "fp8 gemm");
        CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, E, N, K, 0, 20, out) == MOK_OK, "fp8 gemm");
        for (i = 0; i < R * N; i++) diff += out[i] != ref[i];
        for (i = 0; i < R * N; i++) outside += (i < off[0] * N || i >= off[E] * N) && out[i] != 0;
        CHECK(diff == 0, "fp8 gemm N %d K %d: %d elements differ from the formula", (int)N, (int)K, (int)diff);
        CHECK(outside == 0, "fp8 gemm N %d K %d: rows outside the experts not +0", (int)N, (int)K);
        if (K == 0) {
            int64_t nz = 0;
            for (i = 0; i < R * N; i++) nz += out[i] != 0;
            CHECK(nz == 0, "fp8 gemm K = 0: rows not zero");
        }
        /* a sub-range leaves the other rows alone */
        for (i = 0; i < R * N; i++) out[i] = 0x7777;
        mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, E, N, K, 10, 33, out);
        diff = 0;
        for (i = 0; i < R * N; i++) diff += (i >= 10 * N && i < 33 * N) ? out[i] != ref[i] : out[i] != 0x7777;
        CHECK(diff == 0, "fp8 gemm sub-range N %d K %d", (int)N, (int)K);
        /* ref (= out, checked above) against exact math on the decoded operands: only the final bf16
         * rounding (<= 2^-8 relative, plus double rounding noise) separates them */
        if (K > 0) {
            int64_t r, n, k, e, bad = 0;
            for (e = 0; e < E; e++)
                for (r = off[e]; r < off[e + 1]; r++)
                    for (n = 0; n < N; n++) {
                        double s = 0.0, mag = 0.0;
                        for (k = 0; k < K; k++) {
                            double p = (double)mok_e4m3_to_f32(a[r * K + k]) * sa[r * nkb + k / 128] *
                                       (double)mok_e4m3_to_f32(b[(e * N + n) * K + k]) *
                                       sb[(e * nnb + n / 128) * nkb + k / 128];
                            s += p;
                            mag += fabs(p);
                        }
                        bad += fabs(mok_bf16_to_f32(ref[r * N + n]) - s) > 0x1p-8 * fabs(s) + 1e-12 * mag;
                    }
            CHECK(bad == 0, "fp8 gemm N %d K %d vs double: %d elements", (int)N, (int)K, (int)bad);
        }
        free(a);
        free(b);
        free(sa);
        free(sb);
        free(out);
        free(ref);
    }
}

static void test_gemm_fp8_args(void) {
    uint8_t a[128] = {0}, b[128] = {0};
    float sa[1] = {1.0f}, sb[1] = {1.0f};
    uint16_t out[4];
    int32_t off[2] = {0, 1}, dec[3] = {0, 1, 0}, neg[2] = {-1, 1};
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, 1, 1, 128, 0, 1, out) == MOK_OK, "fp8 args ok");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, -1, 1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 E < 0");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, 1, -1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 N < 0");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, 1, 1, -128, 0, 1, out) == MOK_ERR_ARG, "fp8 K < 0");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, 1, 1, 128, 1, 0, out) == MOK_ERR_ARG, "fp8 r_end < r_begin");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, 1, 1, 128, -1, 1, out) == MOK_ERR_ARG, "fp8 r_begin < 0");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, NULL, 1, 1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 no offsets");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, dec, 2, 1, 128, 0, 1, out) == MOK_ERR_ARG,
          "fp8 decreasing offsets");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, neg, 1, 1, 128, 0, 1, out) == MOK_ERR_ARG,
          "fp8 negative offset");
    CHECK(mok_grouped_gemm_fp8_blockwise(NULL, sa, b, sb, off, 1, 1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 no a");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, NULL, b, sb, off, 1, 1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 no sa");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, NULL, sb, off, 1, 1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 no b");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, NULL, off, 1, 1, 128, 0, 1, out) == MOK_ERR_ARG, "fp8 no sb");
    CHECK(mok_grouped_gemm_fp8_blockwise(a, sa, b, sb, off, 1, 1, 128, 0, 1, NULL) == MOK_ERR_ARG, "fp8 no out");
    /* nothing to read: K == 0 needs no operands, no rows or N == 0 need no output */
    out[0] = 0x7777;
    CHECK(mok_grouped_gemm_fp8_blockwise(NULL, NULL, NULL, NULL, off, 1, 1, 0, 0, 1, out) == MOK_OK && out[0] == 0,
          "fp8 K = 0");
    CHECK(mok_grouped_gemm_fp8_blockwise(NULL, NULL, NULL, NULL, off, 1, 1, 128, 0, 0, NULL) == MOK_OK, "fp8 R = 0");
    CHECK(mok_grouped_gemm_fp8_blockwise(NULL, NULL, NULL, NULL, off, 1, 0, 128, 0, 1, NULL) == MOK_OK, "fp8 N = 0");
    /* E == 0: every row is outside */
    out[0] = out[1] = 0x7777;
    CHECK(mok_grouped_gemm_fp8_blockwise(NULL, NULL, NULL, NULL, off, 0, 1, 0, 0, 2, out) == MOK_OK && out[0] == 0 &&
              out[1] == 0,
          "fp8 E = 0");
}

/* ---------------------------------------------------------------- FP8 blockwise weight gradient */

/* The formula of mok_core.h, one element at a time: per expert, per 128-row block, the expert's rows
 * of the block (scales MN-major: [block, m] and [block, n]). */
static void ref_wgrad_fp8(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, const int32_t* off,
                          int64_t E, int64_t R, int64_t M, int64_t N, uint16_t* out) {
    const int64_t nrb = (R + 127) / 128;
    int64_t e, m, n, kb, r;
    for (e = 0; e < E; e++)
        for (m = 0; m < M; m++)
            for (n = 0; n < N; n++) {
                double acc = 0.0;
                for (kb = 0; kb < nrb; kb++) {
                    double s = 0.0;
                    int any = 0;
                    for (r = kb * 128; r < R && r < kb * 128 + 128; r++) {
                        if (r < off[e] || r >= off[e + 1]) continue;
                        s += (double)mok_e4m3_to_f32(a[m * R + r]) * (double)mok_e4m3_to_f32(b[n * R + r]);
                        any = 1;
                    }
                    if (any) acc += s * ((double)sa[kb * M + m] * (double)sb[kb * N + n]);
                }
                out[(e * M + m) * N + n] = mok_f32_to_bf16((float)acc);
            }
}

static void test_wgrad_fp8_hand(void) {
    /* R = 200 (two scale blocks, the second partial), E = 3, M = 2, N = 1. First offsets: expert 0
     * rows [0, 100), expert 1 rows [100, 150) (across the block boundary), expert 2 empty, rows
     * 150-199 outside. Then expert 0 ends at 130 (its rows 128-129 use block 1's scales). */
    enum { R = 200, E = 3, M = 2, N = 1 };
    static uint8_t a[M * R], b[N * R];
    /* MN-major scales [block, m]: m0 has 0.5 (block 0) and 4 (block 1), m1 2 and 0.25 */
    float sa[2 * M] = {0.5f, 2.0f, 4.0f, 0.25f}, sb[2 * N] = {3.0f, 0.125f};
    int32_t off[E + 1] = {0, 100, 150, 150}, off2[E + 1] = {0, 130, 199, 199};
    uint16_t out[E * M * N];
    int i;
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    a[0 * R + 1] = mok_f32_to_e4m3(2.0f);
    b[1] = mok_f32_to_e4m3(1.5f); /* expert 0, block 0: m0 2*1.5*0.5*3 = 4.5; m1 a=0 */
    a[1 * R + 99] = mok_f32_to_e4m3(-1.0f);
    b[99] = mok_f32_to_e4m3(4.0f); /* expert 0, block 0: m1 -1*4*2*3 = -24 */
    a[0 * R + 120] = mok_f32_to_e4m3(1.0f);
    b[120] = mok_f32_to_e4m3(1.0f); /* expert 1, block 0: m0 1*0.5*3 = 1.5 */
    a[0 * R + 129] = mok_f32_to_e4m3(8.0f);
    b[129] = mok_f32_to_e4m3(2.0f); /* expert 1, block 1: m0 16*4*0.125 = 8 */
    a[1 * R + 140] = mok_f32_to_e4m3(448.0f);
    b[140] = mok_f32_to_e4m3(-0.5f); /* expert 1, block 1: m1 -224*0.25*0.125 = -7 */
    a[0 * R + 199] = mok_f32_to_e4m3(1.0f); /* past offsets[E] = 150: must not show */
    b[199] = mok_f32_to_e4m3(1.0f);
    for (i = 0; i < E * M * N; i++) out[i] = 0x7777;
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, E, R, M, N, 0, E, out) == MOK_OK, "wgrad hand");
    CHECK(out[0] == mok_f32_to_bf16(4.5f) && out[1] == mok_f32_to_bf16(-24.0f), "wgrad hand e0: %04x %04x", out[0],
          out[1]);
    CHECK(out[2] == mok_f32_to_bf16(9.5f) && out[3] == mok_f32_to_bf16(-7.0f), "wgrad hand e1: %04x %04x", out[2],
          out[3]);
    CHECK(out[4] == 0 && out[5] == 0, "wgrad hand e2 (empty) not +0: %04x %04x", out[4], out[5]);
    /* expert 0 now owns rows 0-129: block 1's rows 128-129 with block 1's scales; expert 1 rows
     * 130-198 (row 199 is past offsets[E]) */
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off2, E, R, M, N, 0, E, out) == MOK_OK, "wgrad hand 2");
    CHECK(out[0] == mok_f32_to_bf16(4.5f + 1.5f + 8.0f) && out[1] == mok_f32_to_bf16(-24.0f),
          "wgrad hand straddling e0: %04x %04x", out[0], out[1]);
    CHECK(out[2] == 0 && out[3] == mok_f32_to_bf16(-7.0f), "wgrad hand straddling e1: %04x %04x", out[2], out[3]);
    /* A NaN code reaches its m row only, of its expert only. */
    a[1 * R + 140] = 0x7f;
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, E, R, M, N, 0, E, out) == MOK_OK, "wgrad NaN");
    CHECK(is_bf16_nan(out[3]) && !is_bf16_nan(out[2]) && !is_bf16_nan(out[1]) && out[5] == 0, "wgrad NaN propagation");
}

static void test_wgrad_fp8_random(void) {
    /* (M, N, R, offsets kind): partial tiles in M and N, R not a multiple of 128, empty experts,
     * one expert with every row, unaligned offsets (blocks straddling experts), 128-aligned ones. */
    static const int64_t shapes[][4] = {{45, 70, 300, 0}, {128, 256, 384, 1}, {17, 33, 200, 2},
                                        {130, 5, 129, 3}, {3, 40, 0, 4},      {20, 64, 256, 5}};
    int si;
    for (si = 0; si < 6; si++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], R = shapes[si][2], kind = shapes[si][3], E = 5;
        const int64_t nrb = (R + 127) / 128;
        int32_t off[6];
        uint8_t* a = malloc((size_t)(M * R + 1));
        uint8_t* b = malloc((size_t)(N * R + 1));
        float* sa = malloc((size_t)(M * nrb + 1) * sizeof(float));
        float* sb = malloc((size_t)(N * nrb + 1) * sizeof(float));
        uint16_t* out = malloc((size_t)(E * M * N) * sizeof(uint16_t));
        uint16_t* ref = malloc((size_t)(E * M * N) * sizeof(uint16_t));
        int64_t i, e, diff = 0;
        if (kind == 0) { /* unaligned, expert 2 empty, rows before offsets[0] and past offsets[E] */
            const int32_t o[6] = {3, 90, 170, 170, 260, 291};
            memcpy(off, o, sizeof o);
        } else if (kind == 1) { /* 128-aligned (the CUDA kernel's plans), expert 1 empty */
            const int32_t o[6] = {0, 128, 128, 256, 256, 384};
            memcpy(off, o, sizeof o);
        } else if (kind == 2) { /* one expert (3) with every row */
            const int32_t o[6] = {0, 0, 0, 0, 200, 200};
            memcpy(off, o, sizeof o);
        } else if (kind == 3) { /* every expert inside block 0 or straddling 127/128 */
            const int32_t o[6] = {0, 1, 2, 127, 128, 129};
            memcpy(off, o, sizeof o);
        } else if (kind == 4) { /* R = 0: every gradient is zero */
            memset(off, 0, sizeof off);
        } else { /* tile-1 plan-like: ragged counts */
            const int32_t o[6] = {0, 37, 38, 38, 200, 256};
            memcpy(off, o, sizeof o);
        }
        for (i = 0; i < M * R; i++) a[i] = rand_e4m3();
        for (i = 0; i < N * R; i++) b[i] = rand_e4m3();
        for (i = 0; i < M * nrb; i++) sa[i] = (float)ldexp(0.5 + rng_unif(), (int)rng_int(20) - 10);
        for (i = 0; i < N * nrb; i++) sb[i] = (float)ldexp(0.5 + rng_unif(), (int)rng_int(20) - 10);
        ref_wgrad_fp8(a, sa, b, sb, off, E, R, M, N, ref);
        for (i = 0; i < E * M * N; i++) out[i] = 0x7777;
        /* two calls over expert ranges, as the op's parallel_for does */
        CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, E, R, M, N, 2, E, out) == MOK_OK, "wgrad");
        CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, E, R, M, N, 0, 2, out) == MOK_OK, "wgrad");
        for (i = 0; i < E * M * N; i++) diff += out[i] != ref[i];
        CHECK(diff == 0, "wgrad M %d N %d R %d kind %d: %d elements differ from the formula", (int)M, (int)N, (int)R,
              (int)kind, (int)diff);
        for (e = 0; e < E; e++) {
            int64_t nz = 0;
            if (off[e + 1] > off[e]) continue;
            for (i = 0; i < M * N; i++) nz += out[e * M * N + i] != 0;
            CHECK(nz == 0, "wgrad M %d N %d R %d: empty expert %d not +0", (int)M, (int)N, (int)R, (int)e);
        }
        /* a sub-range leaves the other experts alone */
        for (i = 0; i < E * M * N; i++) out[i] = 0x7777;
        mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, E, R, M, N, 1, 3, out);
        diff = 0;
        for (i = 0; i < E * M * N; i++)
            diff += (i >= 1 * M * N && i < 3 * M * N) ? out[i] != ref[i] : out[i] != 0x7777;
        CHECK(diff == 0, "wgrad sub-range M %d N %d R %d", (int)M, (int)N, (int)R);
        /* b's scales in 128-column blocks: the same as per column with each block's scale repeated */
        {
            const int64_t nnb = (N + 127) / 128;
            float* sbt = malloc((size_t)(nnb * nrb + 1) * sizeof(float));
            int64_t kb, n;
            for (i = 0; i < nnb * nrb; i++) sbt[i] = (float)ldexp(0.5 + rng_unif(), (int)rng_int(20) - 10);
            for (kb = 0; kb < nrb; kb++)
                for (n = 0; n < N; n++) sb[kb * N + n] = sbt[kb * nnb + n / 128];
            ref_wgrad_fp8(a, sa, b, sb, off, E, R, M, N, ref);
            for (i = 0; i < E * M * N; i++) out[i] = 0x7777;
            CHECK(mok_grouped_gemm_fp8_wgrad_blockwise_nb(a, sa, b, sbt, 128, off, E, R, M, N, 0, E, out) == MOK_OK,
                  "wgrad nb 128");
            diff = 0;
            for (i = 0; i < E * M * N; i++) diff += out[i] != ref[i];
            CHECK(diff == 0, "wgrad nb 128 M %d N %d R %d kind %d: %d elements differ", (int)M, (int)N, (int)R,
                  (int)kind, (int)diff);
            CHECK(mok_grouped_gemm_fp8_wgrad_blockwise_nb(a, sa, b, sbt, 64, off, E, R, M, N, 0, E, out) ==
                      MOK_ERR_ARG, "wgrad nb 64 rejected");
            free(sbt);
        }
        /* the formula (= out) against exact math on the decoded operands, summed over the expert's rows
         * in any order: only the final bf16 rounding (<= 2^-8 relative, plus double noise) separates them */
        {
            int64_t m, n, r, bad = 0;
            for (e = 0; e < E; e++)
                for (m = 0; m < M; m++)
                    for (n = 0; n < N; n++) {
                        double s = 0.0, mag = 0.0;
                        for (r = off[e]; r < off[e + 1]; r++) {
                            double p = (double)mok_e4m3_to_f32(a[m * R + r]) * sa[(r / 128) * M + m] *
                                       (double)mok_e4m3_to_f32(b[n * R + r]) * sb[(r / 128) * N + n];
                            s += p;
                            mag += fabs(p);
                        }
                        bad += fabs(mok_bf16_to_f32(ref[(e * M + m) * N + n]) - s) > 0x1p-8 * fabs(s) + 1e-12 * mag;
                    }
            CHECK(bad == 0, "wgrad M %d N %d R %d vs double: %d elements", (int)M, (int)N, (int)R, (int)bad);
        }
        free(a);
        free(b);
        free(sa);
        free(sb);
        free(out);
        free(ref);
    }
}

static void test_wgrad_fp8_args(void) {
    uint8_t a[128] = {0}, b[128] = {0};
    float sa[1] = {1.0f}, sb[1] = {1.0f};
    uint16_t out[4];
    int32_t off[2] = {0, 1}, dec[3] = {0, 1, 0}, neg[2] = {-1, 1}, past[2] = {0, 2};
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, 1, 1, 0, 1, out) == MOK_OK, "wgrad args ok");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, -1, 1, 1, 1, 0, 0, out) == MOK_ERR_ARG,
          "wgrad E < 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, -1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad R < 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, -1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad M < 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, 1, -1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad N < 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, 1, 1, -1, 1, out) == MOK_ERR_ARG,
          "wgrad e_begin < 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, 1, 1, 1, 0, out) == MOK_ERR_ARG,
          "wgrad e_end < e_begin");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, 1, 1, 0, 2, out) == MOK_ERR_ARG,
          "wgrad e_end > E");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, NULL, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad no offsets");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, dec, 2, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad decreasing offsets");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, neg, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad negative offset");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, past, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad offsets[E] > R");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(NULL, sa, b, sb, off, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad no a");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, NULL, b, sb, off, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad no sa");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, NULL, sb, off, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad no b");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, NULL, off, 1, 1, 1, 1, 0, 1, out) == MOK_ERR_ARG,
          "wgrad no sb");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(a, sa, b, sb, off, 1, 1, 1, 1, 0, 1, NULL) == MOK_ERR_ARG,
          "wgrad no out");
    /* nothing to read: R == 0 needs no operands (the gradient is zero); no experts, M == 0 or N == 0
     * need no output */
    out[0] = out[1] = 0x7777;
    off[1] = 0;
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(NULL, NULL, NULL, NULL, off, 1, 0, 2, 1, 0, 1, out) == MOK_OK &&
              out[0] == 0 && out[1] == 0,
          "wgrad R = 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(NULL, NULL, NULL, NULL, off, 0, 0, 1, 1, 0, 0, NULL) == MOK_OK,
          "wgrad E = 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(NULL, NULL, NULL, NULL, off, 1, 0, 0, 1, 0, 1, NULL) == MOK_OK,
          "wgrad M = 0");
    CHECK(mok_grouped_gemm_fp8_wgrad_blockwise(NULL, NULL, NULL, NULL, off, 1, 0, 1, 0, 0, 1, NULL) == MOK_OK,
          "wgrad N = 0");
}

int main(void) {
    static const mok_dtype dts[] = {MOK_F64, MOK_F32, MOK_BF16, MOK_F16};
    int i;
    setvbuf(stdout, NULL, _IOLBF, 0); /* failure lines survive a crash */
    test_fp8();
    test_bf16();
    test_f16();
    test_e8m0();
    for (i = 0; i < 4; i++) {
        test_quant_1xb_bxb(dts[i]);
        test_quant_mx(dts[i]);
    }
    test_qdq_mx_exact();
    test_qdq_mx();
    test_route_hand();
    test_route_grouped();
    test_route_backward();
    test_plan();
    for (i = 0; i < 4; i++) {
        test_rows(dts[i]);
        test_swiglu(dts[i]);
        test_swiglu_scaled(dts[i]);
        test_gemm(dts[i]);
    }
    test_gemm_fp8_hand();
    test_gemm_fp8_random();
    test_gemm_fp8_args();
    test_wgrad_fp8_hand();
    test_wgrad_fp8_random();
    test_wgrad_fp8_args();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
