/*
 * Top-k routing and its backward.
 *
 * One code path serves float and double: values are held in double and, for MOK_F32, every result
 * is rounded to float right after each operation (rnd) and exp is expf. For +, -, *, / a double
 * result rounded to float equals the float operation (53 >= 2 * 24 + 2 bits), so the MOK_F32 path
 * is exactly float arithmetic in the documented order.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

static double rnd(double v, int single) { return single ? (double)(float)v : v; }
static double ex(double v, int single) { return single ? (double)expf((float)v) : exp(v); }

static double ld(const void* p, int single, int64_t i) {
    return single ? (double)((const float*)p)[i] : ((const double*)p)[i];
}

static void st(void* p, int single, int64_t i, double v) {
    if (single) ((float*)p)[i] = (float)v;
    else ((double*)p)[i] = v;
}

/* Scores s[0, E) of one row of logits: max-subtracted softmax (sum in increasing e) or sigmoid. */
static void token_scores(const void* logits, int single, int64_t row, int64_t E, int func, double* s) {
    int64_t e;
    double m, sum = 0.0;
    if (func == MOK_SCORE_SIGMOID) {
        for (e = 0; e < E; e++) s[e] = rnd(1.0 / rnd(1.0 + ex(-ld(logits, single, row + e), single), single), single);
        return;
    }
    m = ld(logits, single, row);
    for (e = 1; e < E; e++)
        if (ld(logits, single, row + e) > m) m = ld(logits, single, row + e);
    for (e = 0; e < E; e++) {
        s[e] = ex(rnd(ld(logits, single, row + e) - m, single), single);
        sum = rnd(sum + s[e], single);
    }
    for (e = 0; e < E; e++) s[e] = rnd(s[e] / sum, single);
}

/* Does a value a, at a higher index, rank before b? Higher first; NaN below every number (-Inf included), so
 * that the earlier NaN (lower index) stays first among NaNs: the CUDA kernel's total order (route_topk.cuh),
 * whose answer does not depend on the order of the comparisons. */
static int ranks_before(double a, double b) { return isnan(b) ? !isnan(a) : !isnan(a) && a > b; }

/* The allowed entry of v[0, n) that ranks first (ranks_before; lowest index on ties); -1 if none. */
static int64_t argmax_allowed(const double* v, const unsigned char* allowed, int64_t n) {
    int64_t i, best = -1;
    for (i = 0; i < n; i++)
        if (allowed[i] && (best < 0 || ranks_before(v[i], v[best]))) best = i;
    return best;
}

/* Group-limited routing: keep only the experts of the topk_group best groups, a group's score
 * being the sum of its top min(2, size) choice scores. gscore/gmask are n_group scratch. */
static void restrict_groups(const double* c, int64_t E, int64_t n_group, int64_t topk_group, int single,
                            unsigned char* allowed, double* gscore, unsigned char* gmask) {
    int64_t g, e, gs = E / n_group;
    for (g = 0; g < n_group; g++) {
        unsigned char* a = allowed + g * gs;
        int64_t i1 = argmax_allowed(c + g * gs, a, gs), i2;
        a[i1] = 0; /* temporarily hide the best to find the second */
        i2 = gs > 1 ? argmax_allowed(c + g * gs, a, gs) : -1;
        a[i1] = 1;
        gscore[g] = i2 < 0 ? c[g * gs + i1] : rnd(c[g * gs + i1] + c[g * gs + i2], single);
        gmask[g] = 1;
    }
    for (g = 0; g < topk_group; g++) gmask[argmax_allowed(gscore, gmask, n_group)] = 0; /* 0 = kept */
    for (e = 0; e < E; e++) allowed[e] = (unsigned char)!gmask[e / gs];
}

int mok_route_topk(const void* logits, const void* bias, mok_dtype dt, int64_t T, int64_t E, int64_t K,
                   int score_func, int64_t n_group, int64_t topk_group, int renormalize, double scaling,
                   int32_t* topk_idx, void* topk_w) {
    int single = dt == MOK_F32, grouped = n_group > 1;
    int64_t t, e, k, n_scratch;
    double *s, *c, *gscore, eps = rnd(1e-20, single), sc = rnd(scaling, single);
    unsigned char *allowed, *gmask;
    if (dt != MOK_F32 && dt != MOK_F64) return MOK_ERR_DTYPE;
    if (T < 0 || E < 1 || K < 1 || K > E || n_group < 0) return MOK_ERR_ARG;
    if (score_func != MOK_SCORE_SOFTMAX && score_func != MOK_SCORE_SIGMOID) return MOK_ERR_ARG;
    if (grouped && (E % n_group != 0 || topk_group < 1 || topk_group > n_group || K > topk_group * (E / n_group)))
        return MOK_ERR_ARG;
    if (T > 0 && (!logits || !topk_idx || !topk_w)) return MOK_ERR_ARG;
    n_scratch = grouped ? n_group : 0;
    s = (double*)malloc(sizeof(double) * (size_t)(2 * E + n_scratch));
    allowed = (unsigned char*)malloc((size_t)(E + n_scratch));
    if (!s || !allowed) {
        free(s);
        free(allowed);
        return MOK_ERR_ARG; /* scratch allocation failed */
    }
    c = s + E;
    gscore = c + E;
    gmask = allowed + E;
    for (t = 0; t < T; t++) {
        double sum = 0.0;
        token_scores(logits, single, t * E, E, score_func, s);
        for (e = 0; e < E; e++) {
            c[e] = bias ? rnd(s[e] + ld(bias, single, e), single) : s[e];
            allowed[e] = 1;
        }
        if (grouped) restrict_groups(c, E, n_group, topk_group, single, allowed, gscore, gmask);
        for (k = 0; k < K; k++) {
            int64_t best = argmax_allowed(c, allowed, E);
            allowed[best] = 0;
            topk_idx[t * K + k] = (int32_t)best;
            sum = rnd(sum + s[best], single);
        }
        sum = rnd(sum + eps, single);
        for (k = 0; k < K; k++) {
            double w = s[topk_idx[t * K + k]];
            if (renormalize) w = rnd(w / sum, single);
            st(topk_w, single, t * K + k, rnd(w * sc, single));
        }
    }
    free(s);
    free(allowed);
    return MOK_OK;
}

/* d logits of one token given ds (d loss / d score) and the scores s. */
static void scores_backward(const double* s, const double* ds, int64_t E, int func, int single, void* out,
                            int64_t row) {
    int64_t e;
    double dot = 0.0;
    if (func == MOK_SCORE_SIGMOID) {
        for (e = 0; e < E; e++) st(out, single, row + e, rnd(rnd(ds[e] * s[e], single) * rnd(1.0 - s[e], single), single));
        return;
    }
    for (e = 0; e < E; e++) dot = rnd(dot + rnd(s[e] * ds[e], single), single);
    for (e = 0; e < E; e++) st(out, single, row + e, rnd(s[e] * rnd(ds[e] - dot, single), single));
}

int mok_route_topk_backward(const void* grad_w, const void* logits, const int32_t* topk_idx, mok_dtype dt, int64_t T,
                            int64_t E, int64_t K, int score_func, int renormalize, double scaling,
                            void* grad_logits) {
    int single = dt == MOK_F32;
    int64_t t, e, k;
    double *s, *ds, eps = rnd(1e-20, single), sc = rnd(scaling, single);
    if (dt != MOK_F32 && dt != MOK_F64) return MOK_ERR_DTYPE;
    if (T < 0 || E < 1 || K < 1 || K > E) return MOK_ERR_ARG;
    if (score_func != MOK_SCORE_SOFTMAX && score_func != MOK_SCORE_SIGMOID) return MOK_ERR_ARG;
    if (T > 0 && (!grad_w || !logits || !topk_idx || !grad_logits)) return MOK_ERR_ARG;
    for (t = 0; t < T * K; t++)
        if (topk_idx[t] < 0 || topk_idx[t] >= E) return MOK_ERR_EXPERT_ID;
    s = (double*)malloc(sizeof(double) * (size_t)(2 * E));
    if (!s) return MOK_ERR_ARG; /* scratch allocation failed */
    ds = s + E;
    for (t = 0; t < T; t++) {
        const int32_t* idx = topk_idx + t * K;
        double S = 0.0, gs = 0.0;
        token_scores(logits, single, t * E, E, score_func, s);
        for (k = 0; k < K; k++) {
            S = rnd(S + s[idx[k]], single);
            gs = rnd(gs + rnd(ld(grad_w, single, t * K + k) * s[idx[k]], single), single);
        }
        S = rnd(S + eps, single);
        for (e = 0; e < E; e++) ds[e] = 0.0;
        for (k = 0; k < K; k++) {
            double g = ld(grad_w, single, t * K + k), d;
            if (renormalize) d = rnd(sc * rnd(rnd(g / S, single) - rnd(gs / rnd(S * S, single), single), single), single);
            else d = rnd(sc * g, single);
            ds[idx[k]] = rnd(ds[idx[k]] + d, single);
        }
        scores_backward(s, ds, E, score_func, single, grad_logits, t * E);
    }
    free(s);
    return MOK_OK;
}
