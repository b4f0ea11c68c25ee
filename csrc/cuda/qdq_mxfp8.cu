/*
 * MXFP8 quantise-dequantise of bf16 [M, N] tensors (mok_qdq_cuda.h): the launcher of the kernel in
 * quant/qdq_mxfp8.cuh, bit-exact with mok_qdq_mxfp8_rows / mok_qdq_mxfp8_cols of the C core.
 * One warp per 32 x 64 tile, 8 warps per CTA, one tile per warp (the hardware balances the CTAs;
 * with the column-wise copy and offsets, each CTA first checks the offsets' alignment, E + 1 reads
 * from L2).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "mok_qdq_cuda.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "quant/qdq_mxfp8.cuh"

namespace {

template <bool kRows, bool kCols>
void launch(const mok_qdq::params& p, bool vec, unsigned grid, cudaStream_t stream) {
    if (vec) mok_qdq::qdq_mxfp8_kernel<kRows, kCols, true><<<grid, mok_qdq::kThreads, 0, stream>>>(p);
    else mok_qdq::qdq_mxfp8_kernel<kRows, kCols, false><<<grid, mok_qdq::kThreads, 0, stream>>>(p);
}

}  // namespace

extern "C" int mok_qdq_mxfp8_cuda(const struct mok_qdq_mxfp8_args* a, cudaStream_t stream) {
    using namespace mok_qdq;
    MOK_CHECK_ARG(a != NULL && a->M >= 0 && a->N >= 0);
    MOK_CHECK_ARG(a->rows != NULL || a->cols != NULL);
    MOK_CHECK_ARG(a->offsets == NULL || a->E >= 0);
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
    /* 16-byte loads and stores: rows of 8k elements, 16-byte aligned pointers */
    const bool vec = a->N % 8 == 0 && mok_aligned16(a->x, a->rows, a->cols);
    const unsigned grid = (unsigned)mok_ceil_div(p.tiles, kWarps);
    if (a->rows != NULL && a->cols != NULL) {
        launch<true, true>(p, vec, grid, stream);
    } else if (a->rows != NULL) {
        launch<true, false>(p, vec, grid, stream);
    } else {
        launch<false, true>(p, vec, grid, stream);
    }
    return mok_launch_status();
}
