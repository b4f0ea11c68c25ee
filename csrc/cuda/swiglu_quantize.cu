/*
 * mok_swiglu_quantize_fp8_cuda: SwiGLU or its gradient with the result quantised in the same pass
 * (the kernels of quant/swiglu_quantize_tile.cuh; why: the FP8 layer quantises act and d_h right
 * after computing them, and their bf16 copies were a round trip through memory).
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "quant/swiglu_quantize_tile.cuh"

namespace {

enum { kMinBlocks = 2 }; /* CTAs per SM (v39: benchmarks/swiglu_quant_timing.cu) */

template <bool kBackward, bool kScaled>
void launch(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, bool rows, bool cols,
            unsigned grid, cudaStream_t stream) {
    using namespace mok_qtile;
    if (rows && cols)
        swiglu_quantize_bf16_kernel<kBackward, true, true, kMinBlocks, kScaled><<<grid, kThreads, 0, stream>>>(t, sw);
    else if (rows)
        swiglu_quantize_bf16_kernel<kBackward, true, false, kMinBlocks, kScaled><<<grid, kThreads, 0, stream>>>(t, sw);
    else
        swiglu_quantize_bf16_kernel<kBackward, false, true, kMinBlocks, kScaled><<<grid, kThreads, 0, stream>>>(t, sw);
}

}  // namespace

extern "C" int mok_swiglu_quantize_fp8_cuda(const struct mok_swiglu_quantize_fp8_args* a, cudaStream_t stream) {
    using namespace mok_qtile;
    MOK_CHECK_ARG(a != NULL && a->R >= 0 && a->I > 0 && a->I % kTile == 0);
    const bool rows = a->q != NULL, cols = a->qt != NULL, backward = a->d_act != NULL;
    MOK_CHECK_ARG(rows || cols);
    MOK_CHECK_ARG(!rows || a->scales != NULL);
    MOK_CHECK_ARG(!cols || a->scales_t != NULL);
    if (a->R == 0) return 0;
    MOK_CHECK_ARG(a->h != NULL && mok_aligned16(a->h, a->d_act, a->out));
    MOK_CHECK_ARG(!(backward && a->row_scale != NULL) || a->d_s_part != NULL);
    const int64_t N = backward ? 2 * a->I : a->I;
    const int64_t tiles = tile_count(a->R, N); /* of the output */
    MOK_CHECK_ARG(tiles <= MOK_INT32_LIMIT);
    tile_args t = tile_args_of(NULL, a->R, N, a->q, a->scales, a->qt, a->scales_t);
    t.scales_t_mn = a->scales_t_mn_major != 0;
    t.col_tile = a->col_tile != 0;
    swiglu_tile_args sw;
    sw.h = static_cast<const __nv_bfloat16*>(a->h);
    sw.d_act = static_cast<const __nv_bfloat16*>(a->d_act);
    sw.out = static_cast<__nv_bfloat16*>(a->out);
    sw.I = a->I;
    sw.row_scale = a->row_scale;
    sw.d_s_part = a->d_s_part;
    sw.R = a->R;
    /* the forward's scale touches only the column-wise copy: without one it is the plain kernel */
    const bool scaled = a->row_scale != NULL && (backward || cols);
    if (backward && scaled) launch<true, true>(t, sw, rows, cols, (unsigned)tiles, stream);
    else if (backward) launch<true, false>(t, sw, rows, cols, (unsigned)tiles, stream);
    else if (scaled) launch<false, true>(t, sw, rows, cols, (unsigned)tiles, stream);
    else launch<false, false>(t, sw, rows, cols, (unsigned)tiles, stream);
    return mok_launch_status();
}
