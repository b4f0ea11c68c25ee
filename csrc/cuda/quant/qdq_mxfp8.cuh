/*
 * MXFP8 quantise-dequantise ("qdq") of bf16 [M, N] tensors at the memory's speed: the kernel behind
 * mok_qdq_mxfp8_cuda (mok_qdq_cuda.h), bit-exact with the C core's mok_qdq_mxfp8_rows / _cols.
 * Each element becomes e4m3(x * 2^-e) * 2^e, e the RCEIL scale of its 1 x 32 block (row-wise copy)
 * or of its 32 x 1 block (column-wise copy); a block holding NaN or Inf becomes the quiet NaN
 * 0x7FC0. One read of x gives either copy or both.
 *
 * Layout. A warp owns a 32-row x 64-column tile: exactly one column block (32 rows, aligned to 32
 * rows of x) and two row blocks per row. Lane l = 8 rg + cg holds rows 8 rg .. 8 rg + 7 and columns
 * 8 cg .. 8 cg + 7 of the tile as 8 x 4 packed bf16 words (32 registers), loaded with 16-byte
 * loads (a warp's load instruction reads four 128-byte row segments) and stored the same way.
 * - Row blocks are the 4 lanes cg = 0-3 or 4-7 of a row group: amax over the lane's 8 columns,
 *   then two xor-shuffles (1, 2), two rows per word.
 * - Column blocks are the 4 lanes rg = 0-3 of a column group: amax over the lane's 8 rows, then
 *   two xor-shuffles (8, 16), two columns per word.
 * Magnitudes are compared as integers (max.u16x2 on the bits with the sign cleared): for
 * non-negative floats integer order is value order, and NaN/Inf are the patterns >= 0x7F80, so
 * one max gives the amax and the "bad block" flag.
 *
 * Arithmetic (all exact or correctly rounded once, hence the core's bits):
 * - the E8M0 code of a bf16 amax by integer operations (mx_codes2; equal to the core's RCEIL for
 *   every finite bf16 amax, checked exhaustively in csrc/core/tests/test_core.c);
 * - x * 2^-e (one IEEE multiplication by an exact power of two: the core's ldexpf), then the
 *   e4m3x2 conversion instruction (RNE, satfinite: the core's encoder for every non-NaN value);
 * - back with cvt f16x2.e4m3x2 (every E4M3 value is a half) and half -> float, times 2^e (exact
 *   in float: four significant bits; past float's range it is Inf, as the core's product);
 * - float -> bf16 by taking the high half: the value is a bf16 value (checked for every bf16 input
 *   and every scale in test_core.c), so truncation is the core's RNE.
 * Rows past M and columns past N read as 0 (which leaves every amax unchanged) and are not stored.
 * Rows with N % 8 != 0 or pointers not 16-byte aligned take element-wise loads and stores.
 *
 * Cost: per pair of elements and copy, 12 instructions (unpack 2, multiply 2, cvt to e4m3x2,
 * cvt to f16x2, half -> float 2, multiply 2, byte-permute, NaN select), so with the maxima about 13
 * per element for both copies, for 6 bytes moved. At H200's bandwidth an SM must retire about 2.7
 * elements per clock, i.e. about 35 of its 128 lane-instruction issue slots (the two F2FP
 * conversions per pair included): the kernel is bound by DRAM, not by issue, if enough warps are in
 * flight. Registers: about 100 for both copies (2 CTAs, 16 warps per SM, 64 KiB of loads in flight
 * per SM at the start of their tiles), about 60 for one copy (4 CTAs).
 */
#ifndef MOK_CUDA_QUANT_QDQ_MXFP8_CUH
#define MOK_CUDA_QUANT_QDQ_MXFP8_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gathered_block.cuh"
#include "mx_qdq.cuh"
#include "../mok_cuda.h"

namespace mok_qdq {

enum {
    kThreads = 256,
    kWarps = kThreads / 32,
    kTileRows = 32, /* a warp tile: one column block ... */
    kTileCols = 64, /* ... and two row blocks per row */
    kBlock = 32,    /* the MXFP8 block */
};

/* Everything the kernel needs; filled once on the host (qdq_mxfp8.cu). */
struct params {
    const uint16_t* x;      /* [M, N] bf16 bits */
    int64_t M, N;
    uint16_t* rows;         /* [M, N] row-wise copy (when asked for) */
    uint16_t* cols;         /* [M, N] column-wise copy (when asked for) */
    const int32_t* offsets; /* [E + 1] or NULL: one segment [0, M) */
    int64_t E;
    int32_t* error_flag;    /* host-mapped error word or NULL */
    int tiles_n;            /* warp tiles along N */
    int tiles;              /* warp tiles in all */
    int col_band;           /* kGather kernels: the warp tiles walk in bands of col_band (>= 1) tile columns,
                             * each band down all of M before the next (as quantize_bf16_tile.cuh's
                             * tile_thread_banded; v51); tiles_n: row-major */
    /* kernels built with kGather only: row m of the [M, N] input is row gather.src[m] / top_k of x [T, N]
     * (times gather.w[src[m]] when set), a zero row for padding (quant/gathered_block.cuh) */
    mok_gathered::rows_of_plan gather;
};

/* The thread's place: first row r and column c of its 8 x 8 piece, and how many exist (0 .. 8). */
struct piece {
    int64_t r, c;
    int nr, nc;
};

/* ---- load / store of the thread's 8 x 8 piece, w[i][k] = columns 2k (low half), 2k + 1 of row i ---- */

template <bool kVec>
__device__ __forceinline__ void load_piece(const params& p, const piece& t, uint32_t (&w)[8][4]) {
    const int nr = t.nc > 0 ? t.nr : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (kVec) {
            /* NOTE: eight independent loads, no use in between: they are all in flight at once. */
            uint4 u = make_uint4(0u, 0u, 0u, 0u);
            if (i < nr) u = __ldg(reinterpret_cast<const uint4*>(p.x + (t.r + i) * p.N + t.c));
            w[i][0] = u.x;
            w[i][1] = u.y;
            w[i][2] = u.z;
            w[i][3] = u.w;
        } else {
            const uint16_t* src = p.x + (t.r + i) * p.N + t.c;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint32_t lo = i < nr && 2 * k < t.nc ? src[2 * k] : 0u;
                const uint32_t hi = i < nr && 2 * k + 1 < t.nc ? src[2 * k + 1] : 0u;
                w[i][k] = lo | (hi << 16);
            }
        }
    }
}

/* One 16-byte store (st.global.v4.b32, default caching).
 * NOTE: a plain uint4 assignment came out of the front end as four 4-byte stores here, and the
 * __stwb intrinsic as a strong (.STRONG.SM) store; the instruction is written out instead. The CPU
 * emulation (tests/emu/cuda_emu.h) defines its own. */
#ifndef MOK_TESTS_CUDA_EMU_H
__device__ __forceinline__ void st_global_v4(void* dst, const uint32_t (&v)[4]) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}
#endif

/* Row i of the piece (4 words) to row t.r + i of an [M, N] output, if it exists. */
template <bool kVec>
__device__ __forceinline__ void store_row(const params& p, const piece& t, uint16_t* out, int i,
                                          const uint32_t (&v)[4]) {
    if (i >= t.nr || t.nc == 0) return;
    uint16_t* dst = out + (t.r + i) * p.N + t.c;
    if (kVec) {
        st_global_v4(dst, v);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j < t.nc) dst[j] = (uint16_t)(v[j / 2] >> (16 * (j % 2)));
    }
}

/* ---- the kernel ---- */

/* An offset the kernel cannot take: not a multiple of 32, or negative. */
/* A segment boundary the 32-row blocks cannot follow: outside [0, M], or neither a multiple of 32 nor
 * M itself (the last block before M is partial: its rows past M read as 0, as a partial block does). */
__device__ __forceinline__ bool bad_offset(int32_t off, int64_t M) {
    return off < 0 || off > M || (off % kBlock != 0 && off != M);
}

/* kGather: the input's rows are the plan's gathered rows of x (p.gather), read straight from x: the
 * qdq of gather_rows(x, src_of_row, w, top_k) without that tensor written (v48). */
template <bool kRows, bool kCols, bool kVec, bool kGather = false>
__global__ void __launch_bounds__(kThreads) qdq_mxfp8_kernel(const params p) {
    static_assert(kRows || kCols, "at least one copy");
    /* ---- column-wise: segment starts must be 32-row aligned; report a bad plan, write nothing ---- */
    int64_t lo = 0, hi = p.M;
    if (kCols && p.offsets != NULL) {
        bool misaligned = false;
        for (int64_t e = threadIdx.x; e <= p.E; e += kThreads) misaligned |= bad_offset(p.offsets[e], p.M);
        if (__syncthreads_or(misaligned)) {
            if (blockIdx.x == 0 && threadIdx.x == 0 && p.error_flag != NULL) {
                /* NOTE: the plan kernel's protocol: read-OR-write of the host-mapped word, system fence */
                volatile int32_t* flag = p.error_flag;
                *flag = *flag | (int32_t)MOK_DEVICE_ERR_UNALIGNED_PLAN;
                __threadfence_system();
            }
            return;
        }
        lo = p.offsets[0];
        hi = p.offsets[p.E];
    }

    /* ---- the warp's tile and the thread's piece ---- */
    /* NOTE: a warp past the last tile runs on with nothing to load or store (rather than returning),
     * so that every shuffle below visibly has all 32 lanes. */
    const int lane = (int)threadIdx.x % 32;
    int tile = (int)blockIdx.x * kWarps + (int)threadIdx.x / 32;
    const bool live = tile < p.tiles;
    tile = live ? tile : 0;
    int tm, tn;
    if constexpr (kGather) {
        const int band_tiles = (p.tiles / p.tiles_n) * p.col_band;
        const int band = tile / band_tiles, in_band = tile - band * band_tiles, first = band * p.col_band;
        const int width = p.tiles_n - first < p.col_band ? p.tiles_n - first : p.col_band;
        tm = in_band / width;
        tn = first + (in_band - tm * width);
    } else {
        tm = tile / p.tiles_n;
        tn = tile - tm * p.tiles_n;
    }
    const int64_t row0 = (int64_t)tm * kTileRows;
    piece t;
    t.r = row0 + 8 * (lane / 8);
    t.c = (int64_t)tn * kTileCols + 8 * (lane % 8);
    t.nr = !live ? 0 : (int)(p.M - t.r < 0 ? 0 : (p.M - t.r > 8 ? 8 : p.M - t.r));
    t.nc = (int)(p.N - t.c < 0 ? 0 : (p.N - t.c > 8 ? 8 : p.N - t.c));

    uint32_t w[8][4];
    if constexpr (kGather) mok_gathered::load_block(p.gather, p.x, p.N, t.r, t.nr, t.c, t.nc, kVec, w);
    else load_piece<kVec>(p, t, w);

    /* ---- magnitude maxima: row[i] = (even, odd) column maxima of row i; cm[k] = columns 2k, 2k + 1 ---- */
    uint32_t row[8], cm[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        row[i] = 0u;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t m = w[i][k] & 0x7FFF7FFFu;
            if (kRows) row[i] = __vmaxu2(row[i], m);
            if (kCols) cm[k] = __vmaxu2(cm[k], m);
        }
    }

    if (kRows) {
        /* rm[j]: rows 2j (low half) and 2j + 1 (high half), over the row block's 4 lanes */
        uint32_t rm[4], rc[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            /* NOTE: byte_perm 0x5410 pairs the low halves of (row 2j, row 2j + 1), 0x7632 the high ones. */
            rm[j] = __vmaxu2(__byte_perm(row[2 * j], row[2 * j + 1], 0x5410),
                             __byte_perm(row[2 * j], row[2 * j + 1], 0x7632));
#pragma unroll
            for (int off = 1; off < 4; off *= 2) rm[j] = __vmaxu2(rm[j], __shfl_xor_sync(0xFFFFFFFFu, rm[j], off));
            rc[j] = mx_codes2(rm[j]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const mx_scale s = mx_scale_of(half_of(rm[i / 2], i % 2), half_of(rc[i / 2], i % 2));
            uint32_t v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = qdq2(w[i][k], s, s);
            store_row<kVec>(p, t, p.rows, i, v);
        }
    }

    if (kCols) {
        /* column maxima over the column block's 4 lanes (row groups); then the copy, computed in
         * place two columns at a time (w is not needed after this), so that only one pair of
         * column scales is live at once */
        /* the block's rows are all inside [lo, hi) or all outside: lo and hi are multiples of 32 */
        const bool inside = row0 >= lo && row0 < hi;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            cm[k] = __vmaxu2(cm[k], __shfl_xor_sync(0xFFFFFFFFu, cm[k], 8));
            cm[k] = __vmaxu2(cm[k], __shfl_xor_sync(0xFFFFFFFFu, cm[k], 16));
            const uint32_t codes = mx_codes2(cm[k]);
            const mx_scale a = mx_scale_of(half_of(cm[k], 0), half_of(codes, 0));
            const mx_scale b = mx_scale_of(half_of(cm[k], 1), half_of(codes, 1));
#pragma unroll
            for (int i = 0; i < 8; ++i) w[i][k] = inside ? qdq2(w[i][k], a, b) : 0u;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) store_row<kVec>(p, t, p.cols, i, w[i]);
    }
}

}  // namespace mok_qdq

#endif /* MOK_CUDA_QUANT_QDQ_MXFP8_CUH */
