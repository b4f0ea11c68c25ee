/*
 * Private helpers shared by the mok core sources: bit casts, the bf16/f16 conversions as inline
 * functions (so the hot loops inline them), and conversions of runs of elements between a dtype and
 * its accumulation type (float, or double for MOK_F64).
 *
 * Rounding note: every product and sum is rounded separately (no fused multiply-add). Build with
 * -ffp-contract=off (already the default in ISO mode, e.g. -std=c11) so the compiler cannot fuse
 * a * b + c; the Makefile passes it explicitly.
 */
#ifndef MOK_INTERNAL_H
#define MOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mok_core.h"

static inline uint32_t mok_bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float mok_float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline int mok_dtype_ok(mok_dtype dt) {
    return dt == MOK_F32 || dt == MOK_F64 || dt == MOK_BF16 || dt == MOK_F16;
}

static inline size_t mok_dtype_size(mok_dtype dt) {
    return dt == MOK_F64 ? 8 : dt == MOK_F32 ? 4 : 2;
}

static inline size_t mok_acc_size(mok_dtype dt) {
    return dt == MOK_F64 ? sizeof(double) : sizeof(float);
}

static inline int64_t mok_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mok_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* bf16 RNE by adding 0x7fff plus the LSB of the kept half; overflow carries into Inf naturally.
 * NaN is truncated with the quiet bit forced so a payload in the low half cannot turn it into Inf. */
static inline uint16_t mok_f32_to_bf16_inl(float x) {
    uint32_t u = mok_bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mok_bf16_to_f32_inl(uint16_t v) { return mok_float_of((uint32_t)v << 16); }

/* Right shift by s (1..31) with round-to-nearest-even on the dropped bits. */
static inline uint32_t mok_rne_shift(uint32_t m, int s) {
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

static inline uint16_t mok_f32_to_f16_inl(float x) {
    uint32_t u = mok_bits_of(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds past 65504: Inf */
    if (a >= 0x38800000u) {                                   /* normal half (>= 2^-14) */
        uint32_t r = a - (112u << 23);                        /* rebias 127 -> 15 */
        return (uint16_t)(sign | mok_rne_shift(r, 13));        /* carry may reach the exponent */
    }
    {
        int e = (int)(a >> 23);        /* biased float exponent, < 113 here */
        int s = 126 - e;               /* shift to units of 2^-24 */
        if (s > 24) return sign;       /* below half of the smallest subnormal (float subnormals too) */
        return (uint16_t)(sign | mok_rne_shift((a & 0x7fffffu) | 0x800000u, s));
    }
}

static inline float mok_f16_to_f32_inl(uint16_t v) {
    uint32_t sign = ((uint32_t)v & 0x8000u) << 16, ex = ((uint32_t)v >> 10) & 0x1fu, man = v & 0x3ffu;
    if (ex == 0x1f) return mok_float_of(sign | 0x7f800000u | (man << 13));
    if (ex == 0) return mok_float_of(sign | mok_bits_of((float)man * 0x1p-24f)); /* exact */
    return mok_float_of(sign | ((ex + 112u) << 23) | (man << 13));
}

/* Element i of a tensor as float (MOK_F64 is rounded to float). */
static inline float mok_load_f(const void* p, mok_dtype dt, int64_t i) {
    switch (dt) {
    case MOK_BF16: return mok_bf16_to_f32_inl(((const uint16_t*)p)[i]);
    case MOK_F16: return mok_f16_to_f32_inl(((const uint16_t*)p)[i]);
    case MOK_F64: return (float)((const double*)p)[i];
    default: return ((const float*)p)[i];
    }
}

/* n elements src[off, off + n) of dtype dt converted into the accumulation-type buffer dst. */
static inline void mok_to_acc(void* dst, const void* src, mok_dtype dt, int64_t off, int64_t n) {
    int64_t i;
    float* d = (float*)dst;
    switch (dt) {
    case MOK_F64: memcpy(dst, (const double*)src + off, (size_t)n * sizeof(double)); break;
    case MOK_F32: memcpy(dst, (const float*)src + off, (size_t)n * sizeof(float)); break;
    case MOK_BF16:
        for (i = 0; i < n; i++) d[i] = mok_bf16_to_f32_inl(((const uint16_t*)src)[off + i]);
        break;
    case MOK_F16:
        for (i = 0; i < n; i++) d[i] = mok_f16_to_f32_inl(((const uint16_t*)src)[off + i]);
        break;
    }
}

/* n accumulation-type values from src rounded once into dst[off, off + n) of dtype dt. */
static inline void mok_from_acc(void* dst, mok_dtype dt, int64_t off, const void* src, int64_t n) {
    int64_t i;
    const float* s = (const float*)src;
    switch (dt) {
    case MOK_F64: memcpy((double*)dst + off, src, (size_t)n * sizeof(double)); break;
    case MOK_F32: memcpy((float*)dst + off, src, (size_t)n * sizeof(float)); break;
    case MOK_BF16:
        for (i = 0; i < n; i++) ((uint16_t*)dst)[off + i] = mok_f32_to_bf16_inl(s[i]);
        break;
    case MOK_F16:
        for (i = 0; i < n; i++) ((uint16_t*)dst)[off + i] = mok_f32_to_f16_inl(s[i]);
        break;
    }
}

/* Zero n elements of dtype dt at dst[off] (all-zero bits are +0 in every dtype). */
static inline void mok_zero_elems(void* dst, mok_dtype dt, int64_t off, int64_t n) {
    size_t sz = mok_dtype_size(dt);
    memset((char*)dst + (size_t)off * sz, 0, (size_t)n * sz);
}

#endif /* MOK_INTERNAL_H */
