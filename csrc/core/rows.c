/* Row movement: gather (dispatch), weighted fixed-order combine, and the combine weight gradient.
 * Rows are processed in chunks of CH elements converted to the accumulation type. */
#include "internal.h"

enum { CH = 256 };

typedef union {
    float f[CH];
    double d[CH];
} accbuf;

/* The weight w[i] (accumulation type) or 1 when w is NULL, as double (exact for float). */
static double weight(const void* w, mok_dtype dt, int64_t i) {
    if (!w) return 1.0;
    return dt == MOK_F64 ? ((const double*)w)[i] : (double)((const float*)w)[i];
}

/* out[oo, oo + H) = w * x[xo, xo + H), the product rounded once to dt. */
static void scale_row(const void* x, int64_t xo, mok_dtype dt, int64_t H, double w, void* out, int64_t oo) {
    accbuf b;
    int64_t h0, i;
    for (h0 = 0; h0 < H; h0 += CH) {
        int64_t n = mok_min64(CH, H - h0);
        mok_to_acc(&b, x, dt, xo + h0, n);
        if (dt == MOK_F64)
            for (i = 0; i < n; i++) b.d[i] *= w;
        else
            for (i = 0; i < n; i++) b.f[i] *= (float)w;
        mok_from_acc(out, dt, oo + h0, &b, n);
    }
}

int mok_gather_rows(const void* x, mok_dtype dt, int64_t T, int64_t H, int64_t K, const int32_t* src_of_row,
                    const void* w, int64_t r_begin, int64_t r_end, void* out) {
    int64_t r;
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (T < 0 || H < 0 || K < 1 || r_begin < 0 || r_end < r_begin) return MOK_ERR_ARG;
    if (r_end > r_begin && (!src_of_row || !out || (T > 0 && H > 0 && !x))) return MOK_ERR_ARG;
    for (r = r_begin; r < r_end; r++)
        if (src_of_row[r] >= T * K) return MOK_ERR_ARG;
    for (r = r_begin; r < r_end; r++) {
        int64_t src = src_of_row[r];
        if (src < 0) mok_zero_elems(out, dt, r * H, H);
        else if (!w)
            memcpy((char*)out + (size_t)(r * H) * mok_dtype_size(dt),
                   (const char*)x + (size_t)(src / K * H) * mok_dtype_size(dt), (size_t)H * mok_dtype_size(dt));
        else scale_row(x, src / K * H, dt, H, weight(w, dt, src), out, r * H);
    }
    return MOK_OK;
}

/* acc[0, n) += w * v[0, n) in the accumulation type (product rounded, then the sum). */
static void axpy_acc(accbuf* acc, const accbuf* v, int64_t n, mok_dtype dt, const void* w, int64_t wi) {
    int64_t i;
    if (dt == MOK_F64) {
        double a = weight(w, dt, wi);
        for (i = 0; i < n; i++) acc->d[i] += w ? a * v->d[i] : v->d[i];
    } else {
        float a = (float)weight(w, dt, wi);
        for (i = 0; i < n; i++) acc->f[i] += w ? a * v->f[i] : v->f[i];
    }
}

int mok_combine(const void* rows, mok_dtype dt, int64_t R, int64_t H, const int32_t* row_of, const void* w,
                int64_t K, int64_t t_begin, int64_t t_end, void* y) {
    int64_t t, k, h0;
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (R < 0 || H < 0 || K < 0 || t_begin < 0 || t_end < t_begin) return MOK_ERR_ARG;
    if (t_end > t_begin && (!y || (K > 0 && !row_of))) return MOK_ERR_ARG;
    for (t = t_begin * K; t < t_end * K; t++)
        if (row_of[t] >= R || (row_of[t] >= 0 && H > 0 && !rows)) return MOK_ERR_ARG;
    for (t = t_begin; t < t_end; t++) {
        for (h0 = 0; h0 < H; h0 += CH) {
            int64_t n = mok_min64(CH, H - h0);
            accbuf acc, v;
            memset(&acc, 0, sizeof acc);
            for (k = 0; k < K; k++) {
                int64_t row = row_of[t * K + k];
                if (row < 0) continue;
                mok_to_acc(&v, rows, dt, row * H + h0, n);
                axpy_acc(&acc, &v, n, dt, w, t * K + k);
            }
            mok_from_acc(y, dt, t * H + h0, &acc, n);
        }
    }
    return MOK_OK;
}

/* sum_h a[ao + h] * b[bo + h] over h in increasing order, in the accumulation type. */
static double dot_rows(const void* a, int64_t ao, const void* b, int64_t bo, mok_dtype dt, int64_t H) {
    accbuf x, z;
    double sd = 0.0;
    float sf = 0.0f;
    int64_t h0, i;
    for (h0 = 0; h0 < H; h0 += CH) {
        int64_t n = mok_min64(CH, H - h0);
        mok_to_acc(&x, a, dt, ao + h0, n);
        mok_to_acc(&z, b, dt, bo + h0, n);
        if (dt == MOK_F64)
            for (i = 0; i < n; i++) sd += x.d[i] * z.d[i];
        else
            for (i = 0; i < n; i++) sf += x.f[i] * z.f[i];
    }
    return dt == MOK_F64 ? sd : (double)sf;
}

int mok_combine_weight_grad(const void* dy, const void* rows, mok_dtype dt, int64_t H, const int32_t* row_of,
                            int64_t K, int64_t t_begin, int64_t t_end, void* d_w) {
    int64_t t, k;
    if (!mok_dtype_ok(dt)) return MOK_ERR_DTYPE;
    if (H < 0 || K < 0 || t_begin < 0 || t_end < t_begin) return MOK_ERR_ARG;
    if (t_end > t_begin && K > 0 && (!row_of || !d_w || (H > 0 && (!dy || !rows)))) return MOK_ERR_ARG;
    for (t = t_begin; t < t_end; t++) {
        for (k = 0; k < K; k++) {
            int64_t row = row_of[t * K + k];
            double v = row < 0 ? 0.0 : dot_rows(dy, t * H, rows, row * H, dt, H);
            if (dt == MOK_F64) ((double*)d_w)[t * K + k] = v;
            else ((float*)d_w)[t * K + k] = (float)v;
        }
    }
    return MOK_OK;
}
