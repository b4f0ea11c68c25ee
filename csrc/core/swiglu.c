/* SwiGLU on [gate | up] rows, forward and backward, in the accumulation type. */
#include <math.h>

#include "internal.h"

enum { CH = 256 };

typedef union {
    float f[CH];
    double d[CH];
} accbuf;

static int check_args(const void* a, const void* b, mok_dtype dt, int64_t I, int64_t r_begin, int64_t r_end,
                      const void* out) {
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (I < 0 || r_begin < 0 || r_end < r_begin) return MOK_ERR_ARG;
    if (r_end > r_begin && I > 0 && (!a || !b || !out)) return MOK_ERR_ARG;
    return MOK_OK;
}

/* act = silu(g) * u, silu(g) = g / (1 + exp(-g)); g, u overwritten: g <- act. */
static void fwd_chunk(accbuf* g, const accbuf* u, int64_t n, int dbl) {
    int64_t i;
    if (dbl)
        for (i = 0; i < n; i++) g->d[i] = g->d[i] / (1.0 + exp(-g->d[i])) * u->d[i];
    else
        for (i = 0; i < n; i++) g->f[i] = g->f[i] / (1.0f + expf(-g->f[i])) * u->f[i];
}

int mok_swiglu_forward(const void* h, mok_dtype dt, int64_t I, int64_t r_begin, int64_t r_end, void* act) {
    int64_t r, i0;
    int st = check_args(h, h, dt, I, r_begin, r_end, act);
    if (st != MOK_OK) return st;
    for (r = r_begin; r < r_end; r++) {
        for (i0 = 0; i0 < I; i0 += CH) {
            int64_t n = mok_min64(CH, I - i0);
            accbuf g, u;
            mok_to_acc(&g, h, dt, r * 2 * I + i0, n);
            mok_to_acc(&u, h, dt, r * 2 * I + I + i0, n);
            fwd_chunk(&g, &u, n, dt == MOK_F64);
            mok_from_acc(act, dt, r * I + i0, &g, n);
        }
    }
    return MOK_OK;
}

/* d_gate = d_act * up * sig * (1 + g * (1 - sig)), d_up = d_act * silu(g), left to right.
 * In: g, u, da. Out: g <- d_gate, u <- d_up. */
static void bwd_chunk(accbuf* g, accbuf* u, const accbuf* da, int64_t n, int dbl) {
    int64_t i;
    if (dbl) {
        for (i = 0; i < n; i++) {
            double x = g->d[i], e = 1.0 + exp(-x), sig = 1.0 / e;
            g->d[i] = da->d[i] * u->d[i] * sig * (1.0 + x * (1.0 - sig));
            u->d[i] = da->d[i] * (x / e);
        }
    } else {
        for (i = 0; i < n; i++) {
            float x = g->f[i], e = 1.0f + expf(-x), sig = 1.0f / e;
            g->f[i] = da->f[i] * u->f[i] * sig * (1.0f + x * (1.0f - sig));
            u->f[i] = da->f[i] * (x / e);
        }
    }
}

int mok_swiglu_backward(const void* h, const void* d_act, mok_dtype dt, int64_t I, int64_t r_begin, int64_t r_end,
                        void* d_h) {
    int64_t r, i0;
    int st = check_args(h, d_act, dt, I, r_begin, r_end, d_h);
    if (st != MOK_OK) return st;
    for (r = r_begin; r < r_end; r++) {
        for (i0 = 0; i0 < I; i0 += CH) {
            int64_t n = mok_min64(CH, I - i0);
            accbuf g, u, da;
            mok_to_acc(&g, h, dt, r * 2 * I + i0, n);
            mok_to_acc(&u, h, dt, r * 2 * I + I + i0, n);
            mok_to_acc(&da, d_act, dt, r * I + i0, n);
            bwd_chunk(&g, &u, &da, n, dt == MOK_F64);
            mok_from_acc(d_h, dt, r * 2 * I + i0, &g, n);
            mok_from_acc(d_h, dt, r * 2 * I + I + i0, &u, n);
        }
    }
    return MOK_OK;
}

/* The row scale s = w[src] (accumulation type), 0 for a padding row (src < 0). */
static double row_scale(const void* w, mok_dtype dt, int64_t src) {
    if (src < 0) return 0.0;
    return dt == MOK_F64 ? ((const double*)w)[src] : (double)((const float*)w)[src];
}

int mok_swiglu_scaled_backward(const void* h, const void* d_z, mok_dtype dt, int64_t I, const int32_t* src_of_row,
                               const void* w, int64_t n_pairs, int64_t r_begin, int64_t r_end, void* d_h, void* z,
                               void* d_s) {
    int64_t r, i0, i;
    const int dbl = dt == MOK_F64;
    int st = check_args(h, d_z, dt, I, r_begin, r_end, d_h);
    if (st != MOK_OK) return st;
    if (n_pairs < 0) return MOK_ERR_ARG;
    if (r_end > r_begin && (!src_of_row || !d_s || (I > 0 && !z))) return MOK_ERR_ARG;
    for (r = r_begin; r < r_end; r++)
        if (src_of_row[r] >= n_pairs) return MOK_ERR_ARG;
    if (r_end > r_begin && n_pairs > 0 && !w) return MOK_ERR_ARG;
    for (r = r_begin; r < r_end; r++) {
        const double s = row_scale(w, dt, src_of_row[r]);
        double dot_d = 0.0;
        float dot_f = 0.0f;
        for (i0 = 0; i0 < I; i0 += CH) {
            int64_t n = mok_min64(CH, I - i0);
            accbuf g, u, dz, act;
            mok_to_acc(&g, h, dt, r * 2 * I + i0, n);
            mok_to_acc(&u, h, dt, r * 2 * I + I + i0, n);
            mok_to_acc(&dz, d_z, dt, r * I + i0, n);
            /* ---- act as the forward stored it: SwiGLU rounded to dt (z's buffer as scratch) ---- */
            memcpy(&act, &g, (size_t)n * mok_acc_size(dt));
            fwd_chunk(&act, &u, n, dbl);
            mok_from_acc(z, dt, r * I + i0, &act, n);
            mok_to_acc(&act, z, dt, r * I + i0, n);
            /* ---- d_s += dz . act (increasing j); z = s * act; the incoming d_act = s * dz ---- */
            if (dbl) {
                for (i = 0; i < n; i++) {
                    dot_d += dz.d[i] * act.d[i];
                    act.d[i] *= s;
                    dz.d[i] *= s;
                }
            } else {
                for (i = 0; i < n; i++) {
                    dot_f += dz.f[i] * act.f[i];
                    act.f[i] *= (float)s;
                    dz.f[i] *= (float)s;
                }
            }
            mok_from_acc(z, dt, r * I + i0, &act, n);
            bwd_chunk(&g, &u, &dz, n, dbl);
            mok_from_acc(d_h, dt, r * 2 * I + i0, &g, n);
            mok_from_acc(d_h, dt, r * 2 * I + I + i0, &u, n);
        }
        if (dbl) ((double*)d_s)[r] = dot_d;
        else ((float*)d_s)[r] = dot_f;
    }
    return MOK_OK;
}
