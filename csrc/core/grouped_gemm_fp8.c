/*
 * FP8 blockwise grouped GEMM (E4M3 codes, fp32 scales per 1x128 A block and per 128x128 B tile)
 * over the plan's row space, and its weight-gradient form (a K-grouped GEMM over each expert's rows,
 * both operands column-wise with 1x128 scales along the rows): the CPU ops and the oracles of the
 * sm_90a kernel. The arithmetic is specified in mok_core.h.
 *
 * Work goes in tiles of MB rows x NB columns x one 128-wide K block. Codes are decoded through a
 * 256-entry table built per call (no allocation, no shared state). A block's sum of products is
 * exact in double (see mok_core.h), so the vectorised micro-kernel may run across columns freely;
 * the blocks are then scaled and added in increasing kb order, one accumulator per output element,
 * and rounded once at the end.
 */
#include "internal.h"

enum { FB = 128, MB = 16, NB = 32 }; /* FB: the FP8 scale block; NB divides FB */

typedef struct {
    double lut[256]; /* e4m3 code -> value */
    const uint8_t* a;
    const float* sa;
    const uint8_t* b;
    const float* sb;
    int64_t N, K, nkb, nnb; /* nkb = ceil(K / FB), nnb = ceil(N / FB) */
} fp8_args;

/* acc[i][j] += (sum_k at[i][k] * bt[k][j]) * (row[i] * col[j]) for i < mi, k < kn (exact block
 * sums; each scale product is exact in double). col NULL: 1 for every column (the forward's B scale
 * is one per tile and folded into row). */
static void block_kern(double* acc, const double* at, const double* bt, const double* row, const double* col,
                       int64_t mi, int64_t kn) {
    int64_t i, k;
    int j;
    for (i = 0; i < mi; i++) {
        double s[NB];
        memset(s, 0, sizeof s);
        for (k = 0; k < kn; k++) {
            double av = at[i * FB + k];
            const double* br = bt + k * NB;
            for (j = 0; j < NB; j++) s[j] += av * br[j];
        }
        for (j = 0; j < NB; j++) acc[i * NB + j] += s[j] * (col ? row[i] * col[j] : row[i]);
    }
}

/* Rows [r0, r0 + mi) of expert e, columns [n0, n0 + nj). */
static void fp8_tile(const fp8_args* g, int64_t e, int64_t r0, int64_t mi, int64_t n0, int64_t nj, uint16_t* out) {
    double acc[MB * NB], at[MB * FB], bt[FB * NB], scale[MB];
    int64_t kb, i, j, k;
    memset(acc, 0, sizeof acc);
    for (kb = 0; kb < g->nkb; kb++) {
        const int64_t k0 = kb * FB, kn = mok_min64(FB, g->K - k0);
        const double sbv = (double)g->sb[(e * g->nnb + n0 / FB) * g->nkb + kb];
        for (i = 0; i < mi; i++) {
            const uint8_t* ar = g->a + (r0 + i) * g->K + k0;
            for (k = 0; k < kn; k++) at[i * FB + k] = g->lut[ar[k]];
            scale[i] = (double)g->sa[(r0 + i) * g->nkb + kb] * sbv; /* exact */
        }
        memset(bt, 0, sizeof bt); /* columns j >= nj stay 0 */
        for (j = 0; j < nj; j++) {
            const uint8_t* br = g->b + (e * g->N + n0 + j) * g->K + k0;
            for (k = 0; k < kn; k++) bt[k * NB + j] = g->lut[br[k]];
        }
        block_kern(acc, at, bt, scale, NULL, mi, kn);
    }
    for (i = 0; i < mi; i++)
        for (j = 0; j < nj; j++) out[(r0 + i) * g->N + n0 + j] = mok_f32_to_bf16_inl((float)acc[i * NB + j]);
}

int mok_grouped_gemm_fp8_blockwise(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                                   const int32_t* offsets, int64_t E, int64_t N, int64_t K, int64_t r_begin,
                                   int64_t r_end, uint16_t* out) {
    fp8_args g;
    int64_t e, r, n0, r0;
    int c;
    if (E < 0 || N < 0 || K < 0 || r_begin < 0 || r_end < r_begin || !offsets) return MOK_ERR_ARG;
    if (offsets[0] < 0) return MOK_ERR_ARG;
    for (e = 0; e < E; e++)
        if (offsets[e + 1] < offsets[e]) return MOK_ERR_ARG;
    if (r_end > r_begin && N > 0 && (!out || (K > 0 && (!a || !sa || !b || !sb)))) return MOK_ERR_ARG;
    if (N == 0 || r_end == r_begin) return MOK_OK;
    for (c = 0; c < 256; c++) g.lut[c] = (double)mok_e4m3_to_f32((uint8_t)c);
    g.a = a;
    g.sa = sa;
    g.b = b;
    g.sb = sb;
    g.N = N;
    g.K = K;
    g.nkb = (K + FB - 1) / FB;
    g.nnb = (N + FB - 1) / FB;
    /* Rows outside every expert (before offsets[0] or at/after offsets[E]) are zero. */
    for (r = r_begin; r < r_end; r++)
        if (r < offsets[0] || r >= offsets[E]) memset(out + r * N, 0, (size_t)N * sizeof *out);
    for (e = 0; e < E; e++) {
        const int64_t lo = mok_max64(offsets[e], r_begin), hi = mok_min64(offsets[e + 1], r_end);
        for (r0 = lo; r0 < hi; r0 += MB)
            for (n0 = 0; n0 < N; n0 += NB)
                fp8_tile(&g, e, r0, mok_min64(MB, hi - r0), n0, mok_min64(NB, N - n0), out);
    }
    return MOK_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Weight gradient (K-grouped): out[e] [M, N] = sum over expert e's rows r of A[m, r] * B[n, r], on
 * column-wise copies a [M, R], b [N, R] with one scale per 1x128 block along R for both, stored
 * MN-major: sa [ceil(R / 128), M], sb [ceil(R / 128), N] (a K-block's scales are contiguous). Work goes
 * in tiles of MB x NB outputs of one expert; for each 128-row scale block the expert's rows of it
 * (a block may straddle two experts when the offsets are not 128-aligned) are summed exactly in
 * double, scaled by sa[m, kb] * sb[n, kb] (exact in double) and added, blocks in increasing order.
 * ---------------------------------------------------------------------------------------------- */

typedef struct {
    double lut[256]; /* e4m3 code -> value */
    const uint8_t* a;
    const float* sa;
    const uint8_t* b;
    const float* sb;
    int64_t R, M, N;
    int64_t sb_cols, sb_div; /* sb's row length and columns per scale (1, or 128: 128 x 128 blocks) */
} wgrad_args;

/* out[e] rows [m0, m0 + mi), columns [n0, n0 + nj), over the expert's rows [lo, hi) (hi > lo). */
static void wgrad_tile(const wgrad_args* g, int64_t lo, int64_t hi, int64_t m0, int64_t mi, int64_t n0, int64_t nj,
                       uint16_t* out_e) {
    double acc[MB * NB], at[MB * FB], bt[FB * NB], sa[MB], sb[NB];
    int64_t kb, i, j, k;
    memset(acc, 0, sizeof acc);
    memset(sb, 0, sizeof sb); /* columns j >= nj: scale 0, codes 0 */
    for (kb = lo / FB; kb * FB < hi; kb++) {
        const int64_t r0 = mok_max64(lo, kb * FB), kn = mok_min64(hi, kb * FB + FB) - r0;
        for (i = 0; i < mi; i++) {
            const uint8_t* ar = g->a + (m0 + i) * g->R + r0;
            for (k = 0; k < kn; k++) at[i * FB + k] = g->lut[ar[k]];
            sa[i] = (double)g->sa[kb * g->M + m0 + i];
        }
        memset(bt, 0, sizeof bt);
        for (j = 0; j < nj; j++) {
            const uint8_t* br = g->b + (n0 + j) * g->R + r0;
            for (k = 0; k < kn; k++) bt[k * NB + j] = g->lut[br[k]];
            sb[j] = (double)g->sb[kb * g->sb_cols + (n0 + j) / g->sb_div];
        }
        block_kern(acc, at, bt, sa, sb, mi, kn);
    }
    for (i = 0; i < mi; i++)
        for (j = 0; j < nj; j++) out_e[(m0 + i) * g->N + n0 + j] = mok_f32_to_bf16_inl((float)acc[i * NB + j]);
}

int mok_grouped_gemm_fp8_wgrad_blockwise_nb(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                                            int64_t sb_block_n, const int32_t* offsets, int64_t E, int64_t R, int64_t M,
                                            int64_t N, int64_t e_begin, int64_t e_end, uint16_t* out) {
    wgrad_args g;
    int64_t e, m0, n0;
    int c;
    if (E < 0 || R < 0 || M < 0 || N < 0 || e_begin < 0 || e_end < e_begin || e_end > E || !offsets)
        return MOK_ERR_ARG;
    if (sb_block_n != 1 && sb_block_n != FB) return MOK_ERR_ARG;
    if (offsets[0] < 0 || offsets[E] > R) return MOK_ERR_ARG;
    for (e = 0; e < E; e++)
        if (offsets[e + 1] < offsets[e]) return MOK_ERR_ARG;
    if (e_end == e_begin || M == 0 || N == 0) return MOK_OK;
    if (!out || (R > 0 && (!a || !sa || !b || !sb))) return MOK_ERR_ARG;
    for (c = 0; c < 256; c++) g.lut[c] = (double)mok_e4m3_to_f32((uint8_t)c);
    g.a = a;
    g.sa = sa;
    g.b = b;
    g.sb = sb;
    g.R = R;
    g.M = M;
    g.N = N;
    g.sb_div = sb_block_n;
    g.sb_cols = (N + sb_block_n - 1) / sb_block_n;
    for (e = e_begin; e < e_end; e++) {
        const int64_t lo = offsets[e], hi = offsets[e + 1];
        uint16_t* out_e = out + e * M * N;
        if (hi == lo) { /* no rows: the gradient is zero */
            memset(out_e, 0, (size_t)(M * N) * sizeof *out_e);
            continue;
        }
        for (m0 = 0; m0 < M; m0 += MB)
            for (n0 = 0; n0 < N; n0 += NB)
                wgrad_tile(&g, lo, hi, m0, mok_min64(MB, M - m0), n0, mok_min64(NB, N - n0), out_e);
    }
    return MOK_OK;
}

int mok_grouped_gemm_fp8_wgrad_blockwise(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                                         const int32_t* offsets, int64_t E, int64_t R, int64_t M, int64_t N,
                                         int64_t e_begin, int64_t e_end, uint16_t* out) {
    return mok_grouped_gemm_fp8_wgrad_blockwise_nb(a, sa, b, sb, 1, offsets, E, R, M, N, e_begin, e_end, out);
}
