/*
 * MXFP8 quantise-dequantise of bf16 [M, N] tensors (mok_qdq_cuda.h): the launcher of the kernel in
 * quant/qdq_mxfp8.cuh, bit-exact with mok_qdq_mxfp8_rows / mok_qdq_mxfp8_cols of the C core.
 * One warp per 32 x 64 tile, 8 warps per CTA, one tile per warp (the hardware balances the CTAs;
 * with the column-wise copy and offsets, each CTA first checks the offsets' alignment, E + 1 reads
 * from L2). With src_of_row, the rows are the plan's gathered rows of x, read straight from x (v48).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "mok_qdq_cuda.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "quant/qdq_mxfp8.cuh"

namespace {

template <bool kRows, bool kCols, bool kGather>
void launch(const mok_qdq::params& p, bool vec, unsigned grid, cudaStream_t stream) {
    if (vec) mok_qdq::qdq_mxfp8_kernel<kRows, kCols, true, kGather><<<grid, mok_qdq::kThreads, 0, stream>>>(p);
    else mok_qdq::qdq_mxfp8_kernel<kRows, kCols, false, kGather><<<grid, mok_qdq::kThreads, 0, stream>>>(p);
}

template <bool kGather>
void launch_copies(const mok_qdq::params& p, bool vec, unsigned grid, cudaStream_t stream) {
    if (p.rows != NULL && p.cols != NULL) launch<true, true, kGather>(p, vec, grid, stream);
    else if (p.rows != NULL) launch<true, false, kGather>(p, vec, grid, stream);
    else launch<false, true, kGather>(p, vec, grid, stream);
}

}  // namespace

extern "C" int mok_qdq_mxfp8_cuda(const struct mok_qdq_mxfp8_args* a, cudaStream_t stream) {
    using namespace mok_qdq;
    MOK_CHECK_ARG(a != NULL && a->M >= 0 && a->N >= 0);
    MOK_CHECK_ARG(a->rows != NULL || a->cols != NULL);
    MOK_CHECK_ARG(a->offsets == NULL || a->E >= 0);
    MOK_CHECK_ARG(a->src_of_row == NULL || (a->T >= 0 && a->K >= 1 && a->K <= MOK_INT32_LIMIT));
    if (a->M == 0 || a->N == 0) return MOK_OK;
    MOK_CHECK_ARG(a->x != NULL);
    const int64_t tiles_m = mok_ceil_div(a->M, kTileRows), tiles_n = mok_ceil_div(a->N, kTileCols);
    /* warp tile indices (and the grid's last CTA) fit int32 */
    MOK_CHECK_ARG(tiles_m <= (MOK_INT32_LIMIT - kWarps) / tiles_n);
    params p;
    p.x = static_cast<const uint16_t*>(a->x);
    p.M = a->M;
    p.N = a->N;
    p.rows = static_cast<uint16_t*>(a->rows);
    p.cols = static_cast<uint16_t*>(a->cols);
    p.offsets = a->offsets;
    p.E = a->E;
    p.error_flag = a->error_flag;
    p.tiles_n = (int)tiles_n;
    p.tiles = (int)(tiles_m * tiles_n);
    p.gather.src = a->src_of_row;
    p.gather.w = a->w;
    p.gather.src_limit = a->src_of_row != NULL ? a->T * a->K : 0;
    p.gather.top_k = a->src_of_row != NULL ? (int)a->K : 1;
    const int band = 2 * mok_gather_band(); /* 128-column bands: two 64-column warp tiles */
    p.col_band = band > 0 && band < p.tiles_n ? band : p.tiles_n;
    /* 16-byte loads and stores: rows of 8k elements, 16-byte aligned pointers */
    const bool vec = a->N % 8 == 0 && mok_aligned16(a->x, a->rows, a->cols);
    const unsigned grid = (unsigned)mok_ceil_div(p.tiles, kWarps);
    if (a->src_of_row != NULL) launch_copies<true>(p, vec, grid, stream);
    else launch_copies<false>(p, vec, grid, stream);
    return mok_launch_status();
}
