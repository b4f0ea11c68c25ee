/* Scalar conversions: bf16, f16, FP8 E4M3 / E5M2, E8M0 scales, and status names. */
#include <math.h>

#include "internal.h"

const char* mok_status_string(int status) {
    switch (status) {
    case MOK_OK: return "ok";
    case MOK_ERR_ARG: return "invalid argument";
    case MOK_ERR_EXPERT_ID: return "expert id out of range";
    case MOK_ERR_CAPACITY: return "plan capacity too small";
    case MOK_ERR_DTYPE: return "unsupported dtype";
    default: return "unknown status";
    }
}

uint16_t mok_f32_to_bf16(float x) { return mok_f32_to_bf16_inl(x); }
float mok_bf16_to_f32(uint16_t v) { return mok_bf16_to_f32_inl(v); }
uint16_t mok_f32_to_f16(float x) { return mok_f32_to_f16_inl(x); }
float mok_f16_to_f32(uint16_t v) { return mok_f16_to_f32_inl(v); }

/* Shared FP8 encoder (RNE, saturating). mbits: mantissa bits; emax: exponent of the largest
 * finite value; maxcode: its magnitude code. Works on the float bits so every tie is exact. */
static uint8_t f32_to_fp8(float x, int mbits, int bias, int emax, uint32_t maxcode) {
    uint32_t u = mok_bits_of(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu, code;
    int e = (int)(a >> 23) - 127, emin = 1 - bias;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (a >= (uint32_t)(emax + 1 + 127) << 23) return (uint8_t)(sign | maxcode); /* incl. Inf */
    if (e >= emin) {
        /* Normal: rebias the exponent field, then round off the extra mantissa bits; a carry out
         * of the mantissa correctly bumps the exponent. */
        code = mok_rne_shift(a - ((uint32_t)(127 - bias) << 23), 23 - mbits);
    } else {
        int s = 23 - mbits + (emin - e); /* shift to units of the smallest subnormal */
        if (s > 24) return (uint8_t)sign; /* below half the smallest subnormal */
        code = mok_rne_shift((a & 0x7fffffu) | 0x800000u, s);
    }
    if (code > maxcode) code = maxcode; /* rounded up past the largest finite value */
    return (uint8_t)(sign | code);
}

/* Magnitude of a finite FP8 code from its fields. */
static float fp8_magnitude(uint8_t v, int mbits, int bias) {
    int ex = (v & 0x7f) >> mbits, man = v & ((1 << mbits) - 1);
    if (ex == 0) return ldexpf((float)man, 1 - bias - mbits);
    return ldexpf((float)((1 << mbits) + man), ex - bias - mbits);
}

static float with_sign(uint8_t v, float mag) { return (v & 0x80) ? -mag : mag; }

uint8_t mok_f32_to_e4m3(float x) { return f32_to_fp8(x, 3, 7, 8, 0x7eu); }

float mok_e4m3_to_f32(uint8_t v) {
    if ((v & 0x7f) == 0x7f) return with_sign(v, NAN);
    return with_sign(v, fp8_magnitude(v, 3, 7));
}

uint8_t mok_f32_to_e5m2(float x) { return f32_to_fp8(x, 2, 15, 15, 0x7bu); }

float mok_e5m2_to_f32(uint8_t v) {
    if ((v & 0x7c) == 0x7c) return with_sign(v, (v & 0x03) ? NAN : INFINITY);
    return with_sign(v, fp8_magnitude(v, 2, 15));
}

float mok_e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return NAN;
    return ldexpf(1.0f, (int)v - 127);
}

/* Index of the highest set bit of a nonzero value. */
static int top_bit(uint32_t m) {
    int i = 0;
    while (m >>= 1) i++;
    return i;
}

/* ceil(log2(q)) read off the bits of q = amax / 448.0f: the floor from the exponent field (or the
 * top mantissa bit for a subnormal q), plus one unless q is an exact power of two. */
uint8_t mok_e8m0_rceil_from_amax(float amax) {
    uint32_t b, f, m;
    int e;
    if (isnan(amax) || isinf(amax)) return 0xff;
    b = mok_bits_of(fabsf(amax) / 448.0f);
    if (b == 0) return 0; /* amax == 0 (or q underflowed to 0): e = -127 */
    f = b >> 23;
    m = b & 0x7fffffu;
    if (f != 0) e = (int)f - 127 + (m != 0);
    else e = top_bit(m) - 149 + ((m & (m - 1u)) != 0);
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}
