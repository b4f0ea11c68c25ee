/*
 * Row movement (mok_gather_rows, mok_combine, mok_combine_weight_grad in mok_core.h): the kernels and the
 * choice among them (launcher: rows.cu; a header of its own so that the CPU emulation, tests/emu/rows_emu.cpp,
 * runs the same kernels by the same choice):
 *   gather_rows:          out[r, :] = (w ? w[src] : 1) * x[src / K, :], src = src_of_row[r]; 0 when src < 0
 *                         (with row_of, the inverse map [T, K], plain bf16 copies may walk the tokens)
 *   combine:              y[t, :] = sum_{k = 0..K-1, row_of[t, k] >= 0} (w ? w[t, k] : 1) * rows[row_of[t, k], :]
 *   combine_weight_grad:  d_w[t, k] = sum_h dy[t, h] * rows[row_of[t, k], h]   (0 when row_of[t, k] < 0)
 *
 * NOTE: indices that do not fit their tensor (src >= T * K, row_of >= R) cannot be reported without
 * a host sync; they are treated like the "absent" value (-1): a zero row, or a skipped term.
 *
 * bf16 rows with H % 8 == 0 and 16-byte aligned pointers (every row of mok's layers) take the
 * *_bf16x8 kernels: 16-byte loads and stores, the same arithmetic in the same order per element.
 */
#ifndef MOK_CUDA_ROWS_ROWS_CUH
#define MOK_CUDA_ROWS_ROWS_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../mok_cuda.h"
#include "../common/dtype.cuh"
#include "../common/launch.cuh"
#include "../common/vec.cuh"
#include "../common/warp.cuh"

namespace mok_rows {

enum { ROWS_THREADS = 256, ROWS_BLOCKS_PER_SM = 16, WG_WARPS = 8 };

/* ------------------------------------------------------------------------------------------------
 * gather_rows: one block per output row (grid-stride over rows), threads over H.
 * ---------------------------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(ROWS_THREADS) gather_rows_kernel(const T* __restrict__ x, int64_t T_, int64_t H,
                                                                   int64_t K, int64_t R,
                                                                   const int32_t* __restrict__ src_of_row,
                                                                   const typename mok_acc<T>::type* __restrict__ w,
                                                                   T* __restrict__ out) {
    typedef typename mok_acc<T>::type Acc;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        /* ---- source pair of this row (uniform over the block) ---- */
        const int64_t src = (int64_t)src_of_row[r];
        /* NOTE: src < T * K also guards the division by K (no valid src when K == 0). */
        const bool valid = src >= 0 && src < T_ * K;
        T* __restrict__ o = out + r * H;
        if (!valid) {
            for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
                o[h] = mok_zero<T>();
            }
            continue;
        }
        const T* __restrict__ xi = x + (src / K) * H;
        /* ---- copy, or scale in the accumulation type and round once ---- */
        /* NOTE: without w the row is copied bit for bit (1 * v rounds back to v). */
        if (w == NULL) {
            for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
                o[h] = xi[h];
            }
        } else {
            const Acc s = w[src];
            for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
                o[h] = mok_from_acc<T>(mok_mul(s, mok_to_acc(xi[h])));
            }
        }
    }
}

/* bf16 x 8 variant: one 16-byte vector per thread and step. */
__global__ void __launch_bounds__(ROWS_THREADS) gather_rows_bf16x8_kernel(const __nv_bfloat16* __restrict__ x,
                                                                          int64_t T_, int64_t H, int64_t K, int64_t R,
                                                                          const int32_t* __restrict__ src_of_row,
                                                                          const float* __restrict__ w,
                                                                          __nv_bfloat16* __restrict__ out) {
    const int64_t HV = H / MOK_VEC;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const int64_t src = (int64_t)src_of_row[r];
        const bool valid = src >= 0 && src < T_ * K;
        __nv_bfloat16* __restrict__ o = out + r * H;
        if (!valid) {
            for (int64_t c = threadIdx.x; c < HV; c += blockDim.x) {
                *reinterpret_cast<uint4*>(o + c * MOK_VEC) = make_uint4(0, 0, 0, 0);
            }
            continue;
        }
        const __nv_bfloat16* __restrict__ xi = x + (src / K) * H;
        if (w == NULL) {
            for (int64_t c = threadIdx.x; c < HV; c += blockDim.x) {
                *reinterpret_cast<uint4*>(o + c * MOK_VEC) = mok_ld8(xi + c * MOK_VEC);
            }
        } else {
            const float s = w[src];
            for (int64_t c = threadIdx.x; c < HV; c += blockDim.x) {
                float f[MOK_VEC];
                mok_unpack8(mok_ld8(xi + c * MOK_VEC), f);
#pragma unroll
                for (int i = 0; i < MOK_VEC; ++i) f[i] = mok_mul(s, f[i]);
                mok_st8(o + c * MOK_VEC, f);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * gather_rows by token (row_of given, no w; bf16, H % 8 == 0): the same rows as gather_rows_bf16x8.
 * WHY: walking the output rows reads each token's x row K times at scattered moments (its K experts'
 * segments are far apart), mostly from DRAM once x outgrows the L2: 8x x's bytes on Qwen3-30B-A3B.
 * Walking the tokens reads x once and writes it to the token's K rows. Measured (performance log
 * v23): 20% faster at K = 8 on the Qwen3 and DeepSeek-V3 shapes, but 33% slower at K = 2 and
 * slower for weighted rows (the scattered writes cost more than the saved reads), so the launcher
 * takes this walk only for plain copies with K >= GATHER_BY_TOKEN_MIN_K.
 *   by_token: one warp per token (lane k looks up pair k); row r = row_of[t, k] is written when
 *             src_of_row[r] == t * K + k. A warp, not a block: no barrier between the lookups and
 *             the copy.
 *   fixup:    one warp per row; writes every row the token walk does not: src < 0 (zeros) and a
 *             row whose pair's row_of does not point back at it (the per-row copy). The two kernels
 *             write disjoint rows, so together they cover each row exactly once whatever the maps hold.
 * ---------------------------------------------------------------------------------------------- */
enum { GATHER_BY_TOKEN_MIN_K = 4, GATHER_BY_TOKEN_MAX_K = 32, GATHER_TOKEN_VECS = 8 };

__global__ void __launch_bounds__(ROWS_THREADS) gather_rows_by_token_bf16x8_kernel(
    const __nv_bfloat16* __restrict__ x, int64_t T_, int64_t H, int64_t K, int64_t R,
    const int32_t* __restrict__ src_of_row, const int32_t* __restrict__ row_of, __nv_bfloat16* __restrict__ out) {
    const WarpStride ws = warp_stride();
    const int lane = ws.lane;
    const int64_t HV = H / MOK_VEC;
    for (int64_t t = ws.warp; t < T_; t += ws.count) {
        /* ---- lane k < K: the row of pair (t, k) if the token walk owns it, else -1 ---- */
        int64_t my_row = -1;
        if (lane < K) {
            const int64_t pair = t * K + lane;
            const int64_t r = (int64_t)row_of[pair];
            if (r >= 0 && r < R && (int64_t)src_of_row[r] == pair) my_row = r;
        }
        /* ---- read x[t] once, GATHER_TOKEN_VECS vectors per lane at a time; write them to the K rows ---- */
        const __nv_bfloat16* __restrict__ xt = x + t * H;
        /* NOTE: the loop bound is warp-uniform: every lane must reach the __shfl_sync below, also
         * when H / 8 < 32 leaves some lanes without a vector (a lane outside a full-mask shuffle
         * gives the others garbage: seen at K = 32, H = 64) */
        for (int64_t base = 0; base < HV; base += 32 * GATHER_TOKEN_VECS) {
            const int64_t c0 = base + lane;
            uint4 v[GATHER_TOKEN_VECS];
#pragma unroll
            for (int j = 0; j < GATHER_TOKEN_VECS; ++j) {
                const int64_t c = c0 + 32 * j;
                if (c < HV) v[j] = mok_ld8(xt + c * MOK_VEC);
            }
            for (int k = 0; k < K; ++k) {
                const int64_t r = __shfl_sync(0xffffffffu, my_row, k);
                if (r < 0) continue;
                __nv_bfloat16* __restrict__ o = out + r * H;
#pragma unroll
                for (int j = 0; j < GATHER_TOKEN_VECS; ++j) {
                    const int64_t c = c0 + 32 * j;
                    if (c < HV) *reinterpret_cast<uint4*>(o + c * MOK_VEC) = v[j];
                }
            }
        }
    }
}

__global__ void __launch_bounds__(ROWS_THREADS) gather_rows_fixup_bf16x8_kernel(
    const __nv_bfloat16* __restrict__ x, int64_t T_, int64_t H, int64_t K, int64_t R,
    const int32_t* __restrict__ src_of_row, const int32_t* __restrict__ row_of, __nv_bfloat16* __restrict__ out) {
    const WarpStride ws = warp_stride();
    const int lane = ws.lane;
    const int64_t HV = H / MOK_VEC;
    /* NOTE: one warp per row, rows dealt round-robin: the padding rows at the end of each expert's
     * segment are consecutive, and a warp that owned 32 of them wrote 450 KB alone (DeepSeek-V3). */
    for (int64_t r = ws.warp; r < R; r += ws.count) {
        const int64_t s = (int64_t)src_of_row[r];
        const bool zero = s < 0 || s >= T_ * K;
        if (!zero && (int64_t)row_of[s] == r) continue;  // the token walk writes it
        __nv_bfloat16* __restrict__ o = out + r * H;
        for (int64_t c = lane; c < HV; c += 32) {
            *reinterpret_cast<uint4*>(o + c * MOK_VEC) = zero ? make_uint4(0, 0, 0, 0)
                                                              : mok_ld8(x + (s / K) * H + c * MOK_VEC);
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * combine: one block per token (grid-stride), threads over H; each thread keeps ONE accumulator per
 * element and adds the K terms in increasing k (the core's order, each op rounded on its own).
 * ---------------------------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(ROWS_THREADS) combine_kernel(const T* __restrict__ rows, int64_t R, int64_t H,
                                                               int64_t T_, int64_t K,
                                                               const int32_t* __restrict__ row_of,
                                                               const typename mok_acc<T>::type* __restrict__ w,
                                                               T* __restrict__ y) {
    typedef typename mok_acc<T>::type Acc;
    for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
        const int32_t* __restrict__ ro = row_of + t * K;
        for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
            /* ---- fixed-order sum over k ---- */
            Acc acc = (Acc)0;
            for (int64_t k = 0; k < K; ++k) {
                const int64_t row = (int64_t)ro[k];
                if (row < 0 || row >= R) {
                    continue;
                }
                const Acc v = mok_to_acc(rows[row * H + h]);
                acc = mok_add(acc, w != NULL ? mok_mul(w[t * K + k], v) : v);
            }
            y[t * H + h] = mok_from_acc<T>(acc);
        }
    }
}

/* bf16 x 8 variant: the K loads of a vector are issued 4 at a time before their (in-order) sums. */
__global__ void __launch_bounds__(ROWS_THREADS) combine_bf16x8_kernel(const __nv_bfloat16* __restrict__ rows, int64_t R,
                                                                      int64_t H, int64_t T_, int64_t K,
                                                                      const int32_t* __restrict__ row_of,
                                                                      const float* __restrict__ w,
                                                                      __nv_bfloat16* __restrict__ y) {
    enum { KB = 4 };
    const int64_t HV = H / MOK_VEC;
    for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
        const int32_t* __restrict__ ro = row_of + t * K;
        for (int64_t c = threadIdx.x; c < HV; c += blockDim.x) {
            float acc[MOK_VEC];
#pragma unroll
            for (int i = 0; i < MOK_VEC; ++i) acc[i] = 0.f;
            for (int64_t k0 = 0; k0 < K; k0 += KB) {
                uint4 v[KB];
                bool ok[KB];
#pragma unroll
                for (int kk = 0; kk < KB; ++kk) {
                    const int64_t row = k0 + kk < K ? (int64_t)ro[k0 + kk] : -1;
                    ok[kk] = row >= 0 && row < R;
                    if (ok[kk]) v[kk] = mok_ld8(rows + row * H + c * MOK_VEC);
                }
                /* ---- fixed-order sum over k, as the scalar kernel ---- */
#pragma unroll
                for (int kk = 0; kk < KB; ++kk) {
                    if (!ok[kk]) continue;
                    float f[MOK_VEC];
                    mok_unpack8(v[kk], f);
                    const float wk = w != NULL ? w[t * K + k0 + kk] : 1.f;
#pragma unroll
                    for (int i = 0; i < MOK_VEC; ++i) acc[i] = mok_add(acc[i], w != NULL ? mok_mul(wk, f[i]) : f[i]);
                }
            }
            mok_st8(y + t * H + c * MOK_VEC, acc);
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * combine_weight_grad: one warp per (t, k) pair.
 * NOTE: fixed-shape reduction, not the core's serial order: lane l sums h = l, l + 32, ... in
 * increasing h (one accumulator), then the 32 partials are folded by a fixed shuffle tree
 * (offsets 16, 8, 4, 2, 1). Bitwise reproducible; equal to the core up to rounding.
 * ---------------------------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(WG_WARPS * 32) combine_weight_grad_kernel(const T* __restrict__ dy,
                                                                            const T* __restrict__ rows, int64_t R,
                                                                            int64_t H, int64_t TK, int64_t K,
                                                                            const int32_t* __restrict__ row_of,
                                                                            typename mok_acc<T>::type* __restrict__ d_w) {
    typedef typename mok_acc<T>::type Acc;
    const WarpStride ws = warp_stride();
    const int lane = ws.lane;
    for (int64_t p = ws.warp; p < TK; p += ws.count) {
        /* ---- row of the pair (uniform over the warp) ---- */
        const int64_t row = (int64_t)row_of[p];
        const bool valid = row >= 0 && row < R;
        /* ---- per-lane partial dot product, increasing h ---- */
        Acc acc = (Acc)0;
        if (valid) {
            const T* __restrict__ dyt = dy + (p / K) * H;
            const T* __restrict__ rr = rows + row * H;
            for (int64_t h = lane; h < H; h += 32) {
                acc = mok_add(acc, mok_mul(mok_to_acc(dyt[h]), mok_to_acc(rr[h])));
            }
        }
        /* ---- fixed shuffle tree over the 32 lanes ---- */
        acc = warp_sum_to_lane0(acc);
        if (lane == 0) {
            d_w[p] = valid ? acc : (Acc)0;
        }
    }
}

/* bf16 x 8 variant: lane l sums its vectors c = l, l + 32, ... (8 elements each, increasing h) in
 * one accumulator, then the same shuffle tree. */
__global__ void __launch_bounds__(WG_WARPS * 32) combine_weight_grad_bf16x8_kernel(
    const __nv_bfloat16* __restrict__ dy, const __nv_bfloat16* __restrict__ rows, int64_t R, int64_t H, int64_t TK,
    int64_t K, const int32_t* __restrict__ row_of, float* __restrict__ d_w) {
    const WarpStride ws = warp_stride();
    const int lane = ws.lane;
    const int64_t HV = H / MOK_VEC;
    for (int64_t p = ws.warp; p < TK; p += ws.count) {
        const int64_t row = (int64_t)row_of[p];
        const bool valid = row >= 0 && row < R;
        float acc = 0.f;
        if (valid) {
            const __nv_bfloat16* __restrict__ dyt = dy + (p / K) * H;
            const __nv_bfloat16* __restrict__ rr = rows + row * H;
            for (int64_t c = lane; c < HV; c += 32) {
                float a[MOK_VEC], b[MOK_VEC];
                mok_unpack8(mok_ld8(dyt + c * MOK_VEC), a);
                mok_unpack8(mok_ld8(rr + c * MOK_VEC), b);
#pragma unroll
                for (int i = 0; i < MOK_VEC; ++i) acc = mok_add(acc, mok_mul(a[i], b[i]));
            }
        }
        acc = warp_sum_to_lane0(acc);
        if (lane == 0) {
            d_w[p] = valid ? acc : 0.f;
        }
    }
}

inline int rows_dtype_ok(mok_dtype dt) { return dt == MOK_BF16 || dt == MOK_F16 || dt == MOK_F32 || dt == MOK_F64; }


/* ------------------------------------------------------------------------------------------------
 * The operations: argument checks and the choice of kernels, each launch as launch(kernel, grid, block,
 * kernel arguments...) (the launcher's <<<>>> on its stream, the emulation's run of every CTA). Return
 * MOK_ERR_ARG / MOK_ERR_DTYPE, or 0 once the launches are issued.
 * ---------------------------------------------------------------------------------------------- */

template <class Launch>
int gather_rows_run(const struct mok_gather_rows_args* args, Launch&& launch) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->T >= 0 && args->H >= 0 && args->K >= 0 && args->R >= 0);
    MOK_CHECK_ARG(args->R == 0 || (args->src_of_row != NULL && args->out != NULL));
    MOK_CHECK_ARG(args->R == 0 || args->H == 0 || args->T == 0 || args->x != NULL);
    if (!rows_dtype_ok(args->dtype)) {
        return MOK_ERR_DTYPE;
    }
    if (args->R == 0 || args->H == 0) {
        return 0;
    }
    const int64_t T = args->T, H = args->H, K = args->K, R = args->R;
    const bool bf16x8 = args->dtype == MOK_BF16 && H % MOK_VEC == 0 && mok_aligned16(args->x, args->out);
    /* ---- plain copies with the inverse map and K >= 4: walk the tokens, then the rows that walk leaves ---- */
    if (bf16x8 && args->row_of != NULL && args->w == NULL && K >= GATHER_BY_TOKEN_MIN_K && K <= GATHER_BY_TOKEN_MAX_K) {
        const __nv_bfloat16* x = (const __nv_bfloat16*)args->x;
        __nv_bfloat16* out = (__nv_bfloat16*)args->out;
        if (T > 0) {
            const unsigned int token_grid = mok_grid_stride_blocks(T, ROWS_THREADS / 32, ROWS_BLOCKS_PER_SM);
            launch(gather_rows_by_token_bf16x8_kernel, token_grid, ROWS_THREADS, x, T, H, K, R, args->src_of_row,
                   args->row_of, out);
        }
        const unsigned int fixup_grid = mok_grid_stride_blocks(R, ROWS_THREADS / 32, ROWS_BLOCKS_PER_SM);
        launch(gather_rows_fixup_bf16x8_kernel, fixup_grid, ROWS_THREADS, x, T, H, K, R, args->src_of_row, args->row_of,
               out);
        return 0;
    }
    /* ---- launch: one block per row, grid-stride ---- */
    const unsigned int grid = mok_grid_stride_blocks(args->R, 1, ROWS_BLOCKS_PER_SM);
    if (bf16x8) {
        launch(gather_rows_bf16x8_kernel, grid, ROWS_THREADS, (const __nv_bfloat16*)args->x, T, H, K, R,
               args->src_of_row, (const float*)args->w, (__nv_bfloat16*)args->out);
        return 0;
    }
    switch (args->dtype) {
        case MOK_BF16:
            launch(gather_rows_kernel<__nv_bfloat16>, grid, ROWS_THREADS, (const __nv_bfloat16*)args->x, T, H, K, R,
                   args->src_of_row, (const float*)args->w, (__nv_bfloat16*)args->out);
            break;
        case MOK_F16:
            launch(gather_rows_kernel<__half>, grid, ROWS_THREADS, (const __half*)args->x, T, H, K, R, args->src_of_row,
                   (const float*)args->w, (__half*)args->out);
            break;
        case MOK_F32:
            launch(gather_rows_kernel<float>, grid, ROWS_THREADS, (const float*)args->x, T, H, K, R, args->src_of_row,
                   (const float*)args->w, (float*)args->out);
            break;
        default:
            launch(gather_rows_kernel<double>, grid, ROWS_THREADS, (const double*)args->x, T, H, K, R, args->src_of_row,
                   (const double*)args->w, (double*)args->out);
            break;
    }
    return 0;
}

template <class Launch>
int combine_run(const struct mok_combine_args* args, Launch&& launch) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->H >= 0 && args->T >= 0 && args->K >= 0);
    MOK_CHECK_ARG(args->T == 0 || args->H == 0 || args->y != NULL);
    MOK_CHECK_ARG(args->T == 0 || args->K == 0 || args->row_of != NULL);
    MOK_CHECK_ARG(args->R == 0 || args->H == 0 || args->rows != NULL);
    if (!rows_dtype_ok(args->dtype)) {
        return MOK_ERR_DTYPE;
    }
    if (args->T == 0 || args->H == 0) {
        return 0;
    }
    /* ---- launch: one block per token, grid-stride ---- */
    const unsigned int grid = mok_grid_stride_blocks(args->T, 1, ROWS_BLOCKS_PER_SM);
    const int64_t R = args->R, H = args->H, T = args->T, K = args->K;
    if (args->dtype == MOK_BF16 && H % MOK_VEC == 0 && mok_aligned16(args->rows, args->y)) {
        launch(combine_bf16x8_kernel, grid, ROWS_THREADS, (const __nv_bfloat16*)args->rows, R, H, T, K, args->row_of,
               (const float*)args->w, (__nv_bfloat16*)args->y);
        return 0;
    }
    switch (args->dtype) {
        case MOK_BF16:
            launch(combine_kernel<__nv_bfloat16>, grid, ROWS_THREADS, (const __nv_bfloat16*)args->rows, R, H, T, K,
                   args->row_of, (const float*)args->w, (__nv_bfloat16*)args->y);
            break;
        case MOK_F16:
            launch(combine_kernel<__half>, grid, ROWS_THREADS, (const __half*)args->rows, R, H, T, K, args->row_of,
                   (const float*)args->w, (__half*)args->y);
            break;
        case MOK_F32:
            launch(combine_kernel<float>, grid, ROWS_THREADS, (const float*)args->rows, R, H, T, K, args->row_of,
                   (const float*)args->w, (float*)args->y);
            break;
        default:
            launch(combine_kernel<double>, grid, ROWS_THREADS, (const double*)args->rows, R, H, T, K, args->row_of,
                   (const double*)args->w, (double*)args->y);
            break;
    }
    return 0;
}

template <class Launch>
int combine_weight_grad_run(const struct mok_combine_weight_grad_args* args, Launch&& launch) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->H >= 0 && args->T >= 0 && args->K >= 0);
    MOK_CHECK_ARG(args->T == 0 || args->K == 0 || (args->row_of != NULL && args->d_w != NULL));
    MOK_CHECK_ARG(args->T == 0 || args->K == 0 || args->H == 0 || (args->dy != NULL && args->rows != NULL));
    if (!rows_dtype_ok(args->dtype)) {
        return MOK_ERR_DTYPE;
    }
    const int64_t TK = args->T * args->K;
    if (TK == 0) {
        return 0;
    }
    /* ---- launch: one warp per (t, k) pair, grid-stride ---- */
    const unsigned int grid = mok_grid_stride_blocks(TK, WG_WARPS, ROWS_BLOCKS_PER_SM);
    const int64_t R = args->R, H = args->H, K = args->K;
    if (args->dtype == MOK_BF16 && H % MOK_VEC == 0 && mok_aligned16(args->dy, args->rows)) {
        launch(combine_weight_grad_bf16x8_kernel, grid, WG_WARPS * 32, (const __nv_bfloat16*)args->dy,
               (const __nv_bfloat16*)args->rows, R, H, TK, K, args->row_of, (float*)args->d_w);
        return 0;
    }
    switch (args->dtype) {
        case MOK_BF16:
            launch(combine_weight_grad_kernel<__nv_bfloat16>, grid, WG_WARPS * 32, (const __nv_bfloat16*)args->dy,
                   (const __nv_bfloat16*)args->rows, R, H, TK, K, args->row_of, (float*)args->d_w);
            break;
        case MOK_F16:
            launch(combine_weight_grad_kernel<__half>, grid, WG_WARPS * 32, (const __half*)args->dy,
                   (const __half*)args->rows, R, H, TK, K, args->row_of, (float*)args->d_w);
            break;
        case MOK_F32:
            launch(combine_weight_grad_kernel<float>, grid, WG_WARPS * 32, (const float*)args->dy,
                   (const float*)args->rows, R, H, TK, K, args->row_of, (float*)args->d_w);
            break;
        default:
            launch(combine_weight_grad_kernel<double>, grid, WG_WARPS * 32, (const double*)args->dy,
                   (const double*)args->rows, R, H, TK, K, args->row_of, (double*)args->d_w);
            break;
    }
    return 0;
}

}  // namespace mok_rows

#endif /* MOK_CUDA_ROWS_ROWS_CUH */
