/*
 * Grouped GEMMs over the plan's row space, on converted tiles.
 *
 * Each output element has one accumulator that receives the products in increasing k (or r)
 * order, across all k-tiles, and is rounded once to dt at the end. The micro-kernel vectorises
 * across output columns (one independent accumulator per column), never across k, so the
 * summation order is the documented one whatever the compiler does.
 */
#include "internal.h"

enum { MB = 16, NB = 32, KB = 64 };

typedef union {
    float f[MB * KB];
    double d[MB * KB];
} a_tile; /* MB x KB (NT/NN, row-major) or KB x MB (wgrad) */

typedef union {
    float f[KB * NB];
    double d[KB * NB];
} b_tile; /* KB x NB, k-major so a k step reads NB contiguous columns */

typedef union {
    float f[MB * NB];
    double d[MB * NB];
} c_tile;

/* acc[i][:] += sum_k a[i * ais + k * aks] * bt[k][:] for i < mi, k < kn, k increasing. */
static void kern_f(float* acc, const float* a, int64_t ais, int64_t aks, const float* bt, int64_t mi, int64_t kn) {
    int64_t i, k;
    int j;
    for (i = 0; i < mi; i++) {
        float s[NB];
        memcpy(s, acc + i * NB, sizeof s);
        for (k = 0; k < kn; k++) {
            float av = a[i * ais + k * aks];
            const float* br = bt + k * NB;
            for (j = 0; j < NB; j++) s[j] += av * br[j];
        }
        memcpy(acc + i * NB, s, sizeof s);
    }
}

static void kern_d(double* acc, const double* a, int64_t ais, int64_t aks, const double* bt, int64_t mi,
                   int64_t kn) {
    int64_t i, k;
    int j;
    for (i = 0; i < mi; i++) {
        double s[NB];
        memcpy(s, acc + i * NB, sizeof s);
        for (k = 0; k < kn; k++) {
            double av = a[i * ais + k * aks];
            const double* br = bt + k * NB;
            for (j = 0; j < NB; j++) s[j] += av * br[j];
        }
        memcpy(acc + i * NB, s, sizeof s);
    }
}

static void kern(mok_dtype dt, c_tile* acc, const a_tile* a, int64_t ais, int64_t aks, const b_tile* bt, int64_t mi,
                 int64_t kn) {
    if (dt == MOK_F64) kern_d(acc->d, a->d, ais, aks, bt->d, mi, kn);
    else kern_f(acc->f, a->f, ais, aks, bt->f, mi, kn);
}

/* Pointer to element i of an accumulation-type buffer. */
static void* acc_at(void* buf, mok_dtype dt, int64_t i) { return (char*)buf + (size_t)i * mok_acc_size(dt); }

/* Source row of GEMM row r under the gather rule; -1 means a row of zeros. */
static int64_t src_row(const int32_t* gather, int64_t div, int64_t r) {
    if (!gather) return r;
    return gather[r] < 0 ? -1 : gather[r] / div;
}

/* n values of a row (src < 0: zeros) converted into dst. */
static void load_run(void* dst, const void* x, mok_dtype dt, int64_t src, int64_t ld, int64_t off, int64_t n) {
    if (src < 0) memset(dst, 0, (size_t)n * mok_acc_size(dt));
    else mok_to_acc(dst, x, dt, src * ld + off, n);
}

static void store_tile(const c_tile* acc, mok_dtype dt, int64_t mi, int64_t nj, void* out, int64_t ld, int64_t o) {
    int64_t i;
    for (i = 0; i < mi; i++)
        mok_from_acc(out, dt, o + i * ld, (const char*)acc + (size_t)(i * NB) * mok_acc_size(dt), nj);
}

typedef struct {
    const void* a;
    const int32_t* gather;
    int64_t div;
    const void* b;
    mok_dtype dt;
    int64_t N, Kd;
    int trans_b;
} gemm_args;

/* B tile for expert e: bt[k][j] = B_e[k0 + k, n0 + j], zero for j >= nj. */
static void load_b_tile(const gemm_args* g, int64_t e, int64_t n0, int64_t nj, int64_t k0, int64_t kn, b_tile* bt) {
    int64_t k, j;
    memset(bt, 0, sizeof *bt);
    if (!g->trans_b) { /* b [E, Kd, N]: rows of k are contiguous in n */
        for (k = 0; k < kn; k++) mok_to_acc(acc_at(bt, g->dt, k * NB), g->b, g->dt, (e * g->Kd + k0 + k) * g->N + n0, nj);
        return;
    }
    for (j = 0; j < nj; j++) { /* b [E, N, Kd]: convert a run of k, then transpose it in */
        a_tile run;
        mok_to_acc(&run, g->b, g->dt, (e * g->N + n0 + j) * g->Kd + k0, kn);
        if (g->dt == MOK_F64)
            for (k = 0; k < kn; k++) bt->d[k * NB + j] = run.d[k];
        else
            for (k = 0; k < kn; k++) bt->f[k * NB + j] = run.f[k];
    }
}

/* Rows [r0, r0 + mi) of expert e, all N columns. */
static void gemm_rows(const gemm_args* g, int64_t e, int64_t r0, int64_t mi, void* out) {
    int64_t n0, k0, i;
    for (n0 = 0; n0 < g->N; n0 += NB) {
        int64_t nj = mok_min64(NB, g->N - n0);
        c_tile acc;
        memset(&acc, 0, sizeof acc);
        for (k0 = 0; k0 < g->Kd; k0 += KB) {
            int64_t kn = mok_min64(KB, g->Kd - k0);
            a_tile at;
            b_tile bt;
            for (i = 0; i < mi; i++)
                load_run(acc_at(&at, g->dt, i * KB), g->a, g->dt, src_row(g->gather, g->div, r0 + i), g->Kd, k0, kn);
            load_b_tile(g, e, n0, nj, k0, kn, &bt);
            kern(g->dt, &acc, &at, KB, 1, &bt, mi, kn);
        }
        store_tile(&acc, g->dt, mi, nj, out, g->N, r0 * g->N + n0);
    }
}

/* offsets[lo..hi] must be non-negative and non-decreasing. */
static int offsets_ok(const int32_t* offsets, int64_t lo, int64_t hi) {
    int64_t e;
    if (offsets[lo] < 0) return 0;
    for (e = lo; e < hi; e++)
        if (offsets[e + 1] < offsets[e]) return 0;
    return 1;
}

int mok_grouped_gemm(const void* a, const int32_t* a_gather, int64_t a_gather_div, const void* b, mok_dtype dt,
                     const int32_t* offsets, int64_t E, int64_t N, int64_t Kd, int trans_b, int64_t r_begin,
                     int64_t r_end, void* out) {
    gemm_args g = {a, a_gather, a_gather_div, b, dt, N, Kd, trans_b};
    int64_t e, r;
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (E < 0 || N < 0 || Kd < 0 || r_begin < 0 || r_end < r_begin || !offsets) return MOK_ERR_ARG;
    if (a_gather && a_gather_div < 1) return MOK_ERR_ARG;
    if (!offsets_ok(offsets, 0, E)) return MOK_ERR_ARG;
    if (r_end > r_begin && N > 0 && (!out || (Kd > 0 && (!a || !b)))) return MOK_ERR_ARG;
    if (N == 0) return MOK_OK;
    /* Rows outside every expert (before offsets[0] or at/after offsets[E]) are zero. */
    for (r = r_begin; r < r_end; r++)
        if (r < offsets[0] || r >= offsets[E]) mok_zero_elems(out, dt, r * N, N);
    for (e = 0; e < E; e++) {
        int64_t lo = mok_max64(offsets[e], r_begin), hi = mok_min64(offsets[e + 1], r_end), r0;
        for (r0 = lo; r0 < hi; r0 += MB) gemm_rows(&g, e, r0, mok_min64(MB, hi - r0), out);
    }
    return MOK_OK;
}

/* out[e, m0 + i, n0 + j] over the rows of expert e: a ragged contraction in increasing r. */
static void wgrad_tile(const gemm_args* g, int64_t M, int64_t lo, int64_t hi, int64_t m0, int64_t mi, int64_t n0,
                       int64_t nj, c_tile* acc) {
    int64_t r0, rr;
    memset(acc, 0, sizeof *acc);
    for (r0 = lo; r0 < hi; r0 += KB) {
        int64_t kn = mok_min64(KB, hi - r0);
        a_tile at; /* at[rr][i] = a[r0 + rr, m0 + i] */
        b_tile bt; /* bt[rr][j] = B[r0 + rr, n0 + j] */
        memset(&bt, 0, sizeof bt);
        for (rr = 0; rr < kn; rr++) {
            mok_to_acc(acc_at(&at, g->dt, rr * MB), g->a, g->dt, (r0 + rr) * M + m0, mi);
            load_run(acc_at(&bt, g->dt, rr * NB), g->b, g->dt, src_row(g->gather, g->div, r0 + rr), g->N, n0, nj);
        }
        kern(g->dt, acc, &at, 1, MB, &bt, mi, kn);
    }
}

int mok_grouped_gemm_wgrad(const void* a, const void* b, const int32_t* b_gather, int64_t b_gather_div, mok_dtype dt,
                           const int32_t* offsets, int64_t M, int64_t N, int64_t e_begin, int64_t e_end, void* out) {
    gemm_args g = {a, b_gather, b_gather_div, b, dt, N, 0, 0};
    int64_t e, m0, n0;
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (M < 0 || N < 0 || e_begin < 0 || e_end < e_begin) return MOK_ERR_ARG;
    if (e_end == e_begin || M == 0 || N == 0) return MOK_OK;
    if (!offsets || !out || (b_gather && b_gather_div < 1)) return MOK_ERR_ARG;
    if (!offsets_ok(offsets, e_begin, e_end)) return MOK_ERR_ARG;
    if (offsets[e_end] > offsets[e_begin] && (!a || !b)) return MOK_ERR_ARG;
    for (e = e_begin; e < e_end; e++) {
        for (m0 = 0; m0 < M; m0 += MB) {
            int64_t mi = mok_min64(MB, M - m0);
            for (n0 = 0; n0 < N; n0 += NB) {
                int64_t nj = mok_min64(NB, N - n0);
                c_tile acc;
                wgrad_tile(&g, M, offsets[e], offsets[e + 1], m0, mi, n0, nj, &acc);
                store_tile(&acc, dt, mi, nj, out, N, (e * M + m0) * N + n0);
            }
        }
    }
    return MOK_OK;
}
