/*
 * FP8 quantisation of bf16 [M, N] tensors at the memory's speed: the kernels behind
 * mok_quantize_fp8_cuda (1x128, 128x128, MXFP8 1x32) and mok_quantize_fp8_rowcol_cuda (row-wise
 * and column-wise copies from one read of x), bit-exact with the C core (csrc/core/quantize.c).
 *
 * Why the layout is what it is (the first version ran at 0.33-0.49x of the copy bandwidth):
 * - One CTA per 128 x 128 tile, 256 threads. Thread t owns an 8 x 8 block: rows 8g .. 8g + 7 with
 *   g = t / 16, columns 8p .. 8p + 7 with p = t % 16. Its 8 rows are 8 independent 16-byte loads,
 *   all issued before any is used (128 B in flight per thread, several CTAs per SM), and each load
 *   instruction of a warp reads two 256-byte row segments. No 64-bit division anywhere: one 32-bit
 *   division per CTA finds its tile.
 * - The block stays packed as bf16 words (32 registers). Magnitudes are compared as integers, two
 *   at a time (max.u16x2 on the bits with the sign cleared): for non-negative floats integer order
 *   is value order, and NaN/Inf are the patterns >= 0x7F80, so one max gives both amax and the
 *   "bad block" flag. Row amaxes of two rows share a word, which halves the shuffles.
 * - Row-wise blocks (128 or 32 columns) are 16 or 4 lanes of one half-warp: an xor-shuffle
 *   reduction, codes from registers, 8-byte stores (a warp writes two 128-byte row segments).
 * - A block's scale costs about 25 instructions (amax / 448, its reciprocal, the checks) and all
 *   16 (or 4) threads of a block need it: each computes one and gets the rest by shuffles (rows)
 *   or from shared memory (columns), instead of every thread computing all of its 8.
 * - Column-wise (rowcol only): a column block (128 or 32 rows) spans 16 or 4 threads of different
 *   warps, so each thread's column maxima go through shared memory (4 KiB) once; the codes of the
 *   transposed tile are written to shared memory (16 KiB) and leave as 16-byte stores, a warp
 *   writing four 128-byte rows of qt.
 * - Division-free encoding (common/fp8.cuh: proved by exhaustion over bf16 inputs).
 * Rows past M and columns past N read as 0 (which leaves every amax unchanged) and are never
 * stored. Rows with N % 8 != 0 or unaligned pointers take element-wise loads and byte stores.
 */
#ifndef MOK_CUDA_QUANT_QUANTIZE_BF16_TILE_CUH
#define MOK_CUDA_QUANT_QUANTIZE_BF16_TILE_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "../common/dtype.cuh"
#include "../common/fp8.cuh"
#include "gathered_block.cuh"

namespace mok_qtile {

enum {
    kTile = 128,                    /* rows and columns of a CTA's tile */
    kThreads = 256,
    kPieces = kTile / 8,            /* 16-byte pieces (8 bf16) across a tile row: 16 */
    kChunks = kThreads / kPieces,   /* 8-row chunks down the tile: 16 */
};
static_assert(kChunks * 8 == kTile, "256 threads cover a 128 x 128 tile as 16 x 16 blocks of 8 x 8");

/* Everything a tile kernel needs; filled once on the host by tile_args_of. */
struct tile_args {
    const __nv_bfloat16* x; /* [M, N] */
    int64_t M, N;
    uint8_t* q;             /* [M, N] codes */
    void* scales;           /* row-wise scales: fp32 or E8M0 by recipe */
    uint8_t* qt;            /* [N, M] codes of x^T (rowcol only) */
    void* scales_t;         /* their scales (rowcol only) */
    int nbn;                /* tiles along N */
    int vec;                /* rows of x load as 16 B and rows of q store as 8 B (N % 8 == 0, aligned) */
    int vec_t;              /* rows of qt store as 16 B (M % 16 == 0, aligned) */
    int scales_t_mn;        /* scales_t MN-major, [ceil(M / B), N] (the FP8 weight gradient's operand
                             * layout), instead of [N, ceil(M / B)] (quantize(x^T)'s); per-tile kernels only */
    int col_tile;           /* blockwise only: the column-wise copy in 128 x 128 blocks (one scale per tile,
                             * scales_t [ceil(N / 128), ceil(M / 128)], MN-major [ceil(M / 128), ceil(N / 128)]:
                             * quantize(x^T, "blockwise_128x128")); per-tile kernels only */
    /* gathered rows (kernels built with kGather only; quant/gathered_block.cuh): row m of the tile grid is
     * row gather.src[m] / top_k of x, times gather.w[src[m]] when set, a zero row for padding */
    mok_gathered::rows_of_plan gather;
    int col_band;           /* kGather kernels: the tiles walk in bands of col_band (>= 1) tile columns, each
                             * band down all of M before the next (tile_thread_banded); nbn: row-major */
    int64_t batch_rows;     /* quantize_tile128_rowcol_bf16_kernel only (expert weights [E, N, K] as [E * N, K]):
                             * qt per batch of batch_rows rows (a multiple of 128), [M / batch_rows, N, batch_rows],
                             * and scales_t [M / batch_rows, ceil(N / 128), batch_rows / 128] */
    const __nv_bfloat16* x_up; /* the same kernel on a (gate, up) pair: x [E, batch_rows / 2, N] is the gate, x_up
                             * the up half; expert e's rows are x[e] then x_up[e] (a multiple of 128 each) */
};

static inline tile_args tile_args_of(const __nv_bfloat16* x, int64_t M, int64_t N, uint8_t* q, void* scales,
                                     uint8_t* qt, void* scales_t) {
    tile_args a;
    a.x = x;
    a.M = M;
    a.N = N;
    a.q = q;
    a.scales = scales;
    a.qt = qt;
    a.scales_t = scales_t;
    a.nbn = (int)((N + kTile - 1) / kTile);
    a.vec = N % 8 == 0 && ((uintptr_t)x & 15u) == 0 && ((uintptr_t)q & 7u) == 0;
    a.vec_t = qt != 0 && M % 16 == 0 && ((uintptr_t)qt & 15u) == 0;
    a.scales_t_mn = 0;
    a.col_tile = 0;
    a.gather.src = nullptr;
    a.gather.w = nullptr;
    a.gather.src_limit = 0;
    a.gather.top_k = 1;
    a.col_band = a.nbn;
    a.batch_rows = M;
    a.x_up = nullptr;
    return a;
}

/* Number of CTAs (tiles) of a launch. */
static inline int64_t tile_count(int64_t M, int64_t N) { return ((M + kTile - 1) / kTile) * ((N + kTile - 1) / kTile); }

/* The thread's place: tile (tm, tn), chunk g, piece p, its first row r0 and first column c, and
 * how many of its 8 rows and 8 columns exist (0 .. 8). */
struct tile_thread {
    int g, p, tm, tn, rows, cols;
    int64_t m0, n0, r0, c;
};

__device__ __forceinline__ tile_thread tile_thread_at(const tile_args& a, int tm, int tn) {
    tile_thread t;
    t.p = (int)threadIdx.x % kPieces;
    t.g = (int)threadIdx.x / kPieces;
    t.tm = tm;
    t.tn = tn;
    t.m0 = (int64_t)t.tm * kTile;
    t.n0 = (int64_t)t.tn * kTile;
    t.r0 = t.m0 + 8 * t.g;
    t.c = t.n0 + 8 * t.p;
    t.rows = (int)(a.M - t.r0 < 0 ? 0 : (a.M - t.r0 > 8 ? 8 : a.M - t.r0));
    t.cols = (int)(a.N - t.c < 0 ? 0 : (a.N - t.c > 8 ? 8 : a.N - t.c));
    return t;
}

/* The CTA's tile in a launch of one CTA per tile, row-major over the tiles. */
__device__ __forceinline__ tile_thread tile_thread_of(const tile_args& a) {
    const int tm = (int)blockIdx.x / a.nbn;
    return tile_thread_at(a, tm, (int)blockIdx.x - tm * a.nbn);
}

/* Tile idx (the CTA's, blockIdx.x, for tile_thread_banded) when the launch walks bands of a.col_band tile
 * columns (the last band may be narrower), each band row-major down all of M. Why: a gathered row tile reads 128 token rows of x spread over all
 * of T, and each token is read by top_k row tiles far apart in M; row-major over the whole grid, a
 * token's rows come back long after the L2 has dropped them. Inside one band only T x 128 col_band
 * columns of x are read, which the L2 holds, so x leaves DRAM about once (the row-major walk already
 * caught most repeats: v51 measured 3-8% on the rowcol passes, 14-19% on MXFP8's qdq gathers). */
__device__ __forceinline__ tile_thread tile_thread_banded_at(const tile_args& a, int idx) {
    const int nbm = (int)((a.M + kTile - 1) / kTile), band_tiles = nbm * a.col_band;
    const int band = idx / band_tiles, in_band = idx - band * band_tiles;
    const int first = band * a.col_band, width = a.nbn - first < a.col_band ? a.nbn - first : a.col_band;
    const int tm = in_band / width;
    return tile_thread_at(a, tm, first + (in_band - tm * width));
}
__device__ __forceinline__ tile_thread tile_thread_banded(const tile_args& a) {
    return tile_thread_banded_at(a, (int)blockIdx.x);
}

/* ---- packed bf16 helpers ---- */

__device__ __forceinline__ uint32_t vmax2(uint32_t a, uint32_t b) { return __vmaxu2(a, b); }
__device__ __forceinline__ float lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

/* Row i of the thread's block as 8 floats. */
__device__ __forceinline__ void row_floats(const uint32_t (&w)[8][4], int i, float (&v)[8]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = lo_f(w[i][k]);
        v[2 * k + 1] = hi_f(w[i][k]);
    }
}

/* ---- load: the thread's 8 x 8 block, w[i][k] = bf16 columns 2k (low half) and 2k + 1 of row i ---- */

template <bool kGather = false>
__device__ __forceinline__ void load_block(const tile_args& a, const tile_thread& t, uint32_t (&w)[8][4]) {
    if constexpr (kGather) {
        /* NOTE: apart from the plain path below on purpose: sharing the row arithmetic changed the plain
         * kernels' SASS, which are measured as they are (v45). */
        mok_gathered::load_block(a.gather, reinterpret_cast<const uint16_t*>(a.x), a.N, t.r0, t.rows, t.c, t.cols,
                                 a.vec, w);
        return;
    }
    const int rows = t.cols > 0 ? t.rows : 0;
    if (a.vec) {
        /* NOTE: eight independent loads, no use in between: they are all in flight at once. */
        const __nv_bfloat16* src = a.x + t.r0 * a.N + t.c;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (i < rows) u = __ldg(reinterpret_cast<const uint4*>(src));
            src += a.N;
            w[i][0] = u.x;
            w[i][1] = u.y;
            w[i][2] = u.z;
            w[i][3] = u.w;
        }
        return;
    }
    const uint16_t* src = reinterpret_cast<const uint16_t*>(a.x) + t.r0 * a.N + t.c;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t lo = i < rows && 2 * k < t.cols ? src[2 * k] : 0u;
            const uint32_t hi = i < rows && 2 * k + 1 < t.cols ? src[2 * k + 1] : 0u;
            w[i][k] = lo | (hi << 16);
        }
        src += a.N;
    }
}

/* Magnitude maxima of the block as bf16 bits: rm[j] holds row 2j (low half) and row 2j + 1 (high
 * half); cm[k] holds columns 2k (low) and 2k + 1 (high). */
__device__ __forceinline__ void block_maxima(const uint32_t (&w)[8][4], uint32_t (&rm)[4], uint32_t (&cm)[4]) {
    uint32_t row[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) cm[k] = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        row[i] = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t m = w[i][k] & 0x7FFF7FFFu;
            row[i] = vmax2(row[i], m);
            cm[k] = vmax2(cm[k], m);
        }
    }
    /* NOTE: byte_perm 0x5410 pairs the low halves of (row 2j, row 2j + 1), 0x7632 the high ones. */
#pragma unroll
    for (int j = 0; j < 4; ++j)
        rm[j] = vmax2(__byte_perm(row[2 * j], row[2 * j + 1], 0x5410), __byte_perm(row[2 * j], row[2 * j + 1], 0x7632));
}

/* ---- a block's scale and the encoding of 8 of its values ---- */

struct block_scale {
    float s, r;    /* fp32 scale and RN(1 / s) (blockwise); 2^-e (mx) in r */
    uint32_t e8;   /* E8M0 code (mx) */
    bool bad;      /* NaN or Inf in the block: NaN scale, every code 0x7F */
    bool fast;     /* blockwise: the division-free quotient applies */
};

/* amax_bits: the block's largest magnitude as bf16 bits (>= 0x7F80: NaN or Inf present). */
template <bool kMx>
__device__ __forceinline__ block_scale block_scale_of(uint32_t amax_bits) {
    block_scale b;
    const float amax = __uint_as_float(amax_bits << 16);
    b.bad = amax_bits >= 0x7F80u;
    b.fast = amax_bits == 0 || amax_bits >= MOK_QUOT_FAST_MIN_BF16;
    if (kMx) {
        b.e8 = b.bad ? 0xFFu : mok_dev_e8m0_rceil_of_q(mok_dev_div448(amax));
        b.s = 0.f;
        b.r = b.bad ? 0.f : mok_dev_e8m0_inverse(b.e8);
    } else {
        b.e8 = 0;
        b.s = b.bad ? __int_as_float(0x7FC00000) : (amax_bits == 0 ? 1.f : mok_dev_div448(amax));
        b.r = b.bad ? 0.f : __frcp_rn(b.s);
    }
    return b;
}

/* The same record from values computed by another lane (fp32 s, r; or the E8M0 code). */
template <bool kMx>
__device__ __forceinline__ block_scale block_scale_from(uint32_t amax_bits, float s, float r, uint32_t e8) {
    block_scale b;
    b.bad = amax_bits >= 0x7F80u;
    b.fast = amax_bits == 0 || amax_bits >= MOK_QUOT_FAST_MIN_BF16;
    b.e8 = e8;
    b.s = s;
    b.r = kMx ? (b.bad ? 0.f : mok_dev_e8m0_inverse(e8)) : r;
    return b;
}

/* Row i's amax bits from the row-pair words (i may be known only at run time). */
__device__ __forceinline__ uint32_t row_bits(const uint32_t (&rm)[4], int i) {
    const uint32_t w01 = (i & 2) ? rm[1] : rm[0], w23 = (i & 2) ? rm[3] : rm[2];
    return ((i & 4 ? w23 : w01) >> (16 * (i & 1))) & 0xFFFFu;
}

/* The codes of 8 values of one block, value j in byte j. */
template <bool kMx>
__device__ __forceinline__ uint2 encode8(const float (&v)[8], const block_scale& b) {
    if (b.bad) return make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
    uint32_t h[4];
    if (kMx) {
#pragma unroll
        for (int j = 0; j < 4; ++j) h[j] = mok_dev_e4m3x2(__fmul_rn(v[2 * j], b.r), __fmul_rn(v[2 * j + 1], b.r));
    } else if (b.fast) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            h[j] = mok_dev_e4m3x2(mok_dev_quot_by_scale(v[2 * j], b.s, b.r),
                                  mok_dev_quot_by_scale(v[2 * j + 1], b.s, b.r));
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) h[j] = mok_dev_e4m3x2(__fdiv_rn(v[2 * j], b.s), __fdiv_rn(v[2 * j + 1], b.s));
    }
    return make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
}

/* 8 codes to dst[0 .. n) (n <= 8): one 8-byte store when vec (then n is 8). */
__device__ __forceinline__ void store8(uint8_t* dst, uint2 c, bool vec, int n) {
    if (vec) {
        *reinterpret_cast<uint2*>(dst) = c;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
        if (j < n) dst[j] = (uint8_t)((j < 4 ? c.x : c.y) >> (8 * (j & 3)));
}

/* ---- row-wise: 1xB blocks along N (B = 128 fp32 scales, or B = 32 E8M0 scales) ---- */
template <int B, bool kMx>
__device__ __forceinline__ void quantize_rows(const tile_args& a, const tile_thread& t, const uint32_t (&w)[8][4],
                                              uint32_t (&rm)[4]) {
    enum { kLanes = B / 8 }; /* lanes of one block: 16 or 4, inside one half-warp */
    static_assert(B == 128 || B == 32, "row blocks are 128 or 32 columns");
    /* NOTE: every lane runs the shuffles (rows past M hold zeros), so the full mask is right. */
#pragma unroll
    for (int off = 1; off < kLanes; off *= 2)
#pragma unroll
        for (int j = 0; j < 4; ++j) rm[j] = vmax2(rm[j], __shfl_xor_sync(0xFFFFFFFFu, rm[j], off));

    /* Scales. The lanes of a block hold the same 8 row maxima; rather than each computing all 8
     * scales (about 25 instructions each), lane j computes row j % 8's (1x128) or rows 2j and
     * 2j + 1 (mxfp8, 4 lanes) and the others arrive by shuffles. */
    const int lane = (int)threadIdx.x % 32;
    block_scale own;
    uint32_t e8_lo = 0, e8_hi = 0; /* mxfp8: E8M0 codes of rows 0-3 and 4-7, one byte each */
    if (kMx) {
        const int j = lane % 4;
        uint32_t x = block_scale_of<true>(row_bits(rm, 2 * j)).e8 | (block_scale_of<true>(row_bits(rm, 2 * j + 1)).e8 << 8);
        x <<= 16 * (j & 1);
        x |= __shfl_xor_sync(0xFFFFFFFFu, x, 1); /* lanes 0, 1: rows 0-3; lanes 2, 3: rows 4-7 */
        const uint32_t y = __shfl_xor_sync(0xFFFFFFFFu, x, 2);
        e8_lo = (j & 2) ? y : x;
        e8_hi = (j & 2) ? x : y;
    } else {
        own = block_scale_of<false>(row_bits(rm, lane & 7));
    }
    const bool any = t.cols > 0;
    const int64_t nbs = (a.N + B - 1) / B;                     /* scale columns */
    const bool lead = t.p % kLanes == 0;                       /* the lane that stores the scale */
    uint8_t* dst = a.q + t.r0 * a.N + t.c;
    const int64_t s0 = t.r0 * nbs + (kMx ? (int64_t)t.tn * (kTile / B) + t.p / kLanes : t.tn);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        /* NOTE: the shuffles come before the row test: every lane of the warp must run them. */
        const float s_i = kMx ? 0.f : __shfl_sync(0xFFFFFFFFu, own.s, (lane & 16) | i);
        const float r_i = kMx ? 0.f : __shfl_sync(0xFFFFFFFFu, own.r, (lane & 16) | i);
        if (!any || i >= t.rows) continue;
        const uint32_t e8 = kMx ? ((i < 4 ? e8_lo : e8_hi) >> (8 * (i & 3))) & 0xFFu : 0u;
        const block_scale b = block_scale_from<kMx>(row_bits(rm, i), s_i, r_i, e8);
        float v[8];
        row_floats(w, i, v);
        store8(dst, encode8<kMx>(v, b), a.vec != 0, t.cols);
        if (lead) {
            if (kMx) static_cast<uint8_t*>(a.scales)[s0 + i * nbs] = (uint8_t)b.e8;
            else static_cast<float*>(a.scales)[s0 + i * nbs] = b.s;
        }
        dst += a.N;
    }
}

/* ---- 128 x 128 blocks: the tile's codes in its one scale b (and the scale, by thread 0) ---- */
__device__ __forceinline__ void store_tile128_rows(const tile_args& a, const tile_thread& t, const uint32_t (&w)[8][4],
                                                   const block_scale& b) {
    if (threadIdx.x == 0) static_cast<float*>(a.scales)[(int64_t)t.tm * a.nbn + t.tn] = b.s;
    if (t.cols == 0) return;
    uint8_t* dst = a.q + t.r0 * a.N + t.c;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (i >= t.rows) break;
        float v[8];
        row_floats(w, i, v);
        store8(dst, encode8<false>(v, b), a.vec != 0, t.cols);
        dst += a.N;
    }
}

/* ---- kernels ---- */

/* 1x128 (fp32 scales) or 1x32 (E8M0 scales) blocks along the rows. */
template <int B, bool kMx>
__global__ void __launch_bounds__(kThreads) quantize_rows_bf16_kernel(const tile_args a) {
    const tile_thread t = tile_thread_of(a);
    uint32_t w[8][4], rm[4], cm[4];
    load_block(a, t, w);
    block_maxima(w, rm, cm);
    quantize_rows<B, kMx>(a, t, w, rm);
}

/* 128 x 128 blocks (fp32 scales): the tile is the block. */
static __global__ void __launch_bounds__(kThreads) quantize_tile128_bf16_kernel(const tile_args a) {
    __shared__ uint32_t s_max[kThreads / 32];
    const tile_thread t = tile_thread_of(a);
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32;
    uint32_t w[8][4], rm[4], cm[4];
    load_block(a, t, w);
    block_maxima(w, rm, cm);
    /* tile amax: fold the thread's words, then the warp (integer max), then the 8 warps */
    uint32_t m = vmax2(vmax2(rm[0], rm[1]), vmax2(rm[2], rm[3]));
    m = max(m & 0xFFFFu, m >> 16);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (lane == 0) s_max[warp] = m;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) m = max(m, s_max[i]);
    store_tile128_rows(a, t, w, block_scale_of<false>(m));
}

/* Shared memory of the rowcol kernel (22 KiB for 1x128, 28 KiB for mxfp8).
 * part:    [16 chunks][16 pieces] x 16 B = 4 KiB, each thread's column maxima over its 8 rows.
 * scale:   [column blocks per tile][8][16 pieces] x 16 B, the column blocks' scales; column
 *          8p + c at [.][c][p], so the 16 lanes reading one c touch consecutive records.
 * codes_t: [128 columns of x][16 chunks of 8 rows] x 8 B = 16 KiB, the transposed tile's codes.
 *          NOTE: chunk g of row n sits at slot g ^ (n / 8): the 16 lanes of a half-warp that
 *          write one 8-byte chunk each (same g, pieces p = n / 8 = 0..15) then hit 16 different
 *          bank pairs, while a 16-byte read of slots (2j, 2j + 1) still holds two consecutive
 *          chunks (swapped when n / 8 is odd). */
struct col_scale {
    float s, r;
    uint32_t e8, bits;
};

template <int B>
struct rowcol_smem {
    uint32_t tile_max[kThreads / 32]; /* col_tile: each warp's amax bits */
    uint4 part[kChunks][kPieces];
    col_scale scale[kTile / B][8][kPieces];
    uint2 codes_t[kTile][kChunks];
};

/* Row-wise (1xB along N; kRows) and column-wise (1xB along M, i.e. of x^T; kCols) codes of the
 * tile held in w (each thread its 8 x 8 block, rows past M and columns past N zero). Every thread of
 * the CTA calls it; it may be called again for another tile with the same s (its first barrier
 * comes after every thread has finished reading s the previous time). kStageColScales (EXPERIMENTAL,
 * for quantize_rowcol_strip_bf16_kernel below, v43): the column blocks' scales go to
 * col_scale_stage[kb * 128 + column in the tile] (fp32, or the E8M0 code's bits) instead of
 * scales_t, written there before the function's second barrier. kWeight (quantize_tile128_rowcol_bf16_kernel:
 * blockwise, col_tile, kCols and not kRows): the row-wise codes in 128 x 128 blocks too, i.e. in the tile's
 * one scale, and the transposed copy per batch of a.batch_rows rows (each expert's W^T). */
template <int B, bool kMx, bool kRows, bool kCols, bool kStageColScales = false, bool kWeight = false>
__device__ __forceinline__ void quantize_tile_block(const tile_args& a, const tile_thread& t, const uint32_t (&w)[8][4],
                                                    rowcol_smem<B>& s, float* col_scale_stage = nullptr) {
    enum { kGroup = B / 8, kColBlocks = kTile / B }; /* chunks per column block: 16 or 4; blocks per tile column */
    uint32_t rm[4], cm[4];
    block_maxima(w, rm, cm);
    if (kCols) s.part[t.g][t.p] = make_uint4(cm[0], cm[1], cm[2], cm[3]);
    /* col_tile: the tile's amax (integer max of the bits, as quantize_tile128_bf16_kernel), per warp here */
    const bool col_tile = !kMx && kCols && a.col_tile != 0;
    if (col_tile) {
        uint32_t m = vmax2(vmax2(cm[0], cm[1]), vmax2(cm[2], cm[3]));
        m = max(m & 0xFFFFu, m >> 16);
#pragma unroll
        for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
        if (threadIdx.x % 32 == 0) s.tile_max[threadIdx.x / 32] = m;
    }

    /* row-wise blocks, stored while the other warps catch up with the barrier */
    if (kRows) quantize_rows<B, kMx>(a, t, w, rm);
    if (!kCols) return;
    __syncthreads();

    /* column blocks' scales: one thread per (block, column); u -> piece pp (fastest), column c
     * within the piece, block kb, i.e. column 8 pp + c of the tile and rows kb * B .. + B */
    const int64_t nbs_t = (a.M + B - 1) / B; /* scale columns of qt */
    uint32_t tile_m = 0;
    if (col_tile)
#pragma unroll
        for (int i = 0; i < kThreads / 32; ++i) tile_m = max(tile_m, s.tile_max[i]);
    /* (the same amax as quantize_tile128_bf16_kernel's: the tile's, folded from columns instead of rows) */
    if (kWeight) {
        store_tile128_rows(a, t, w, block_scale_of<false>(tile_m));
        if (a.qt == nullptr) return; /* the codes alone (a pair's, without the dgrad's copy) */
    }
#pragma unroll
    for (int u = (int)threadIdx.x; u < kTile * kColBlocks; u += kThreads) {
        const int pp = u % kPieces, c = (u / kPieces) % 8, kb = u / kTile;
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < kGroup; ++j) m = vmax2(m, reinterpret_cast<const uint32_t*>(&s.part[kb * kGroup + j][pp])[c / 2]);
        m = col_tile ? tile_m : (m >> (16 * (c % 2))) & 0xFFFFu;
        const block_scale b = block_scale_of<kMx>(m);
        col_scale cs;
        cs.s = b.s;
        cs.r = b.r;
        cs.e8 = b.e8;
        cs.bits = m;
        s.scale[kb][c][pp] = cs;
        const int64_t col = t.n0 + 8 * pp + c;
        if (col_tile) { /* one scale for the tile (its first column's thread stores it) */
            if (u == 0) {
                int64_t at = a.scales_t_mn ? (int64_t)t.tm * a.nbn + t.tn : (int64_t)t.tn * nbs_t + t.tm;
                if (kWeight) { /* batch e's [nbn, bt] */
                    const int64_t bt = a.batch_rows / kTile, e = t.tm / bt;
                    at = e * a.nbn * bt + (int64_t)t.tn * bt + (t.tm - e * bt);
                }
                static_cast<float*>(a.scales_t)[at] = b.s;
            }
        } else if (col < a.N && t.m0 + kb * B < a.M) {
            const int64_t block = kMx ? (int64_t)t.tm * kColBlocks + kb : t.tm; /* the column block along M */
            const int64_t at = a.scales_t_mn ? block * a.N + col : col * nbs_t + block;
            if (kStageColScales) col_scale_stage[kb * kTile + 8 * pp + c] = kMx ? __uint_as_float(b.e8) : b.s;
            else if (kMx) static_cast<uint8_t*>(a.scales_t)[at] = (uint8_t)b.e8;
            else static_cast<float*>(a.scales_t)[at] = b.s;
        }
    }
    __syncthreads();

    /* column-wise codes of the thread's 8 columns, into the transposed tile */
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const int k = c / 2, h = c % 2;
        const col_scale cs = s.scale[t.g / kGroup][c][t.p];
        const block_scale b = block_scale_from<kMx>(cs.bits, cs.s, cs.r, cs.e8);
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = h ? hi_f(w[i][k]) : lo_f(w[i][k]);
        s.codes_t[8 * t.p + c][t.g ^ t.p] = encode8<kMx>(v, b);
    }
    __syncthreads();

    /* transposed codes: a warp stores 4 rows of qt x 128 bytes, 16 bytes per lane */
#pragma unroll
    for (int pass = 0; pass < kTile / 32; ++pass) {
        const int n = pass * 32 + (int)threadIdx.x / 8, k = (int)threadIdx.x % 8, f = n / 8;
        uint4 v = *reinterpret_cast<const uint4*>(&s.codes_t[n][2 * (k ^ (f / 2))]);
        if (f & 1) v = make_uint4(v.z, v.w, v.x, v.y);
        const int64_t col = t.n0 + n, m = t.m0 + 16 * k;
        if (col >= a.N || m >= a.M) continue;
        uint8_t* dst = a.qt + col * a.M + m;
        if (kWeight) { /* row m of batch e: [e][col][m - e * batch_rows] */
            const int64_t e = t.m0 / a.batch_rows;
            dst = a.qt + e * a.batch_rows * a.N + col * a.batch_rows + (m - e * a.batch_rows);
        }
        if (a.vec_t) {
            *reinterpret_cast<uint4*>(dst) = v;
        } else {
            const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 16; ++j)
                if (m + j < a.M) dst[j] = (uint8_t)(words[j / 4] >> (8 * (j % 4)));
        }
    }
}

/* Row-wise (1xB along N) and column-wise (1xB along M, i.e. of x^T) from one read of x:
 * (q, scales) = quantize(x), (qt, scales_t) = quantize(x^T contiguous). kGather: of the gathered rows
 * (tile_args::src, w; the gathered tensor gather_rows(x, src, w, top_k) is never written). */
template <int B, bool kMx, bool kGather = false>
__global__ void __launch_bounds__(kThreads) quantize_rowcol_bf16_kernel(const tile_args a) {
    __shared__ rowcol_smem<B> s;
    const tile_thread t = kGather ? tile_thread_banded(a) : tile_thread_of(a);
    uint32_t w[8][4];
    load_block<kGather>(a, t, w);
    quantize_tile_block<B, kMx, true, true>(a, t, w, s);
}

/* Expert weights [E, N, K] viewed as x [E * N, K] (N = a.batch_rows, a multiple of 128), from one read:
 * (q, scales) = quantize(x, "blockwise_128x128") and per expert (qt[e], scales_t[e]) =
 * quantize(x[e]^T, "blockwise_128x128"), i.e. q[e]^T and scales[e]^T (a tile has one scale both ways).
 * The FP8 forward reads q, the FP8 dgrad qt: one pass instead of quantising, then transposing the codes
 * (1 byte less per element read; performance log v66). With a.x_up, of the pair's concatenation
 * cat([x, x_up], 1) without making it (torchtitan's w1, w3). a.qt null: (q, scales) alone. */
static __global__ void __launch_bounds__(kThreads) quantize_tile128_rowcol_bf16_kernel(const tile_args a) {
    __shared__ rowcol_smem<128> s;
    const tile_thread t = tile_thread_of(a);
    uint32_t w[8][4];
    if (a.x_up == nullptr) {
        load_block(a, t, w);
    } else { /* the pair: the tile's rows from the half that holds them (no tile straddles the two) */
        const int64_t half = a.batch_rows / 2, e = t.m0 / a.batch_rows, local = t.m0 - e * a.batch_rows;
        tile_args src = a;
        tile_thread ts = t;
        src.x = local < half ? a.x : a.x_up;
        ts.r0 = e * half + (local < half ? local : local - half) + 8 * t.g;
        load_block(src, ts, w);
    }
    quantize_tile_block<128, false, false, true, false, true>(a, t, w, s);
}

/* Performance log v43, v44 (timed by benchmarks/rowcol_timing.cu; the launcher's rowcol_strip_of says
 * when the library takes it: MXFP8 on large tensors, or MOK_QUANT_ROWCOL_STRIP=4 or 8):
 * the rowcol kernel with one CTA per strip of kStrip tiles down M (tile rows tm0 .. tm0 + kStrip - 1
 * of one tile column tn, one after another). The strip's column-block scales are staged in shared
 * memory and leave as kStrip * kColBlocks consecutive entries of each scales_t row (32 bytes for 1x128
 * and kStrip 8), where the one-CTA-per-tile kernel writes one 4-byte scale per tile and column into a
 * sector of its own (a fifth of its written sectors; v41). Grid: ceil(nbm / kStrip) * nbn CTAs, tn
 * fastest. kMinBlocks: CTAs per SM asked of ptxas (3: the default kernel's occupancy). */
template <int B, bool kMx, int kStrip, int kMinBlocks = 3>
__global__ void __launch_bounds__(kThreads, kMinBlocks) quantize_rowcol_strip_bf16_kernel(const tile_args a) {
    enum { kColBlocks = kTile / B };
    static_assert(sizeof(rowcol_smem<B>) + kStrip * kColBlocks * kTile * sizeof(float) <= 48 * 1024,
                  "static shared memory is limited to 48 KiB: MXFP8 strips of at most 8 tiles");
    __shared__ rowcol_smem<B> s;
    __shared__ float stage[kStrip][kColBlocks * kTile];
    const int strip = (int)blockIdx.x / a.nbn, tn = (int)blockIdx.x - strip * a.nbn;
    const int nbm = (int)((a.M + kTile - 1) / kTile), tm0 = strip * kStrip;
    const int tiles = nbm - tm0 < kStrip ? nbm - tm0 : kStrip;
    /* NOTE: not unrolled (unrolled, the loop took 126 registers: two CTAs per SM) */
#pragma unroll 1
    for (int i = 0; i < tiles; ++i) {
        const tile_thread t = tile_thread_at(a, tm0 + i, tn);
        uint32_t w[8][4];
        load_block(a, t, w);
        quantize_tile_block<B, kMx, true, true, true>(a, t, w, s, stage[i]);
    }
    /* every stage entry was written before a barrier of the last tile's work: column n's entries
     * (tile i, block kb) go to scales_t[(n0 + n) * nbs_t + tm0 * kColBlocks + i * kColBlocks + kb],
     * consecutive lanes on consecutive entries */
    const int per_col = tiles * kColBlocks;
    const int64_t nbs_t = (a.M + B - 1) / B, n0 = (int64_t)tn * kTile;
    for (int u = (int)threadIdx.x; u < kTile * per_col; u += kThreads) {
        const int n = u / per_col, e = u - n * per_col, i = e / kColBlocks, kb = e - i * kColBlocks;
        const int64_t col = n0 + n;
        if (col >= a.N || (int64_t)(tm0 + i) * kTile + kb * B >= a.M) continue;
        const int64_t at = col * nbs_t + (int64_t)tm0 * kColBlocks + e;
        const float v = stage[i][kb * kTile + n];
        if (kMx) static_cast<uint8_t*>(a.scales_t)[at] = (uint8_t)__float_as_uint(v);
        else static_cast<float*>(a.scales_t)[at] = v;
    }
}

/* CTAs of a quantize_rowcol_strip_bf16_kernel launch. */
static inline int64_t strip_count(int64_t M, int64_t N, int strip) {
    const int64_t nbm = (M + kTile - 1) / kTile;
    return (nbm + strip - 1) / strip * ((N + kTile - 1) / kTile);
}

}  // namespace mok_qtile

#endif /* MOK_CUDA_QUANT_QUANTIZE_BF16_TILE_CUH */
