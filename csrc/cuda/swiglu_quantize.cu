/*
 * mok_swiglu_quantize_fp8_cuda: SwiGLU or its gradient with the result quantised in the same pass
 * (why: the FP8 layer quantises act and d_h right after computing them, and their bf16 copies were a
 * round trip through memory). The streamed kernels of quant/swiglu_quantize_stream.cuh by default (forward v54,
 * backward v55); MOK_SWIGLU_STREAM=0 takes the per-tile one of quant/swiglu_quantize_tile.cuh (same outputs).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "quant/swiglu_quantize_stream.cuh"

namespace {

enum { kMinBlocks = 2 }; /* per-tile kernel: CTAs per SM (v39: benchmarks/swiglu_quant_timing.cu) */

/* The streamed forward's shape (v54, benchmarks/swiglu_quant_timing.cu): one item ahead, one CTA an SM. */
enum { kForwardAhead = 1, kForwardCtas = 1 };
/* The streamed backward (v55: swiglu_backward_split_stream_kernel, per output tile): its ring of loads
 * 4 rows deep at two CTAs an SM (4 and 6 rows measured alike, 8 rows fit one CTA only and lost).
 * NOTE: 1.14-1.22x the per-tile kernel stand-alone, but the layer was not measurably faster (v55: the
 * large shapes' steps run at the power limit); the default on the kernel's gain, same bits either way. */
enum { kBackwardDepth = 4, kBackwardCtas = 2 };

/* The per-tile kernel (MOK_SWIGLU_STREAM=0), one CTA per tile of the output. */
template <bool kBackward, bool kRows, bool kCols, bool kScaled>
void launch_tiles(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, cudaStream_t stream) {
    using namespace mok_qtile;
    const unsigned grid = (unsigned)tile_count(t.M, t.N);
    swiglu_quantize_bf16_kernel<kBackward, kRows, kCols, kMinBlocks, kScaled><<<grid, kThreads, 0, stream>>>(t, sw);
}

/* A persistent kernel on as many CTAs as are resident (ctas an SM), or as there are items. */
template <auto kKernel>
int launch_persistent(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, int64_t items, int ctas,
                      size_t smem, cudaStream_t stream) {
    const int err = mok_opt_in_dynamic_smem<kKernel>(smem); /* once per device: not inside a graph capture */
    if (err != 0) return err;
    const int64_t resident = (int64_t)ctas * mok_num_sms();
    kKernel<<<(unsigned)(items < resident ? items : resident), mok_qtile::kThreads, smem, stream>>>(t, sw);
    return 0;
}

/* The streamed kernels: the forward's (items: tiles of [R, I]) and the backward's, split per output tile
 * (items: tiles of d_h [R, 2I]; the row-scaled one's ring carries the row scales too, v56). */
template <bool kBackward, bool kRows, bool kCols, bool kScaled>
int launch_stream(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, cudaStream_t stream) {
    using namespace mok_qtile;
    if constexpr (!kBackward) {
        constexpr auto kernel = swiglu_quantize_stream_kernel<kRows, kCols, kScaled, kForwardAhead, kForwardCtas>;
        return launch_persistent<kernel>(t, sw, tile_count(sw.R, sw.I), kForwardCtas, stream_smem_bytes(kForwardAhead),
                                         stream);
    } else {
        constexpr auto kernel =
            swiglu_backward_split_stream_kernel<kRows, kCols, kBackwardCtas, kBackwardDepth, kScaled>;
        return launch_persistent<kernel>(t, sw, tile_count(sw.R, 2 * sw.I), kBackwardCtas,
                                         split_stream_smem_bytes(kBackwardDepth, kScaled), stream);
    }
}

/* Which kernel, per direction (v54-v56: measured in benchmarks/swiglu_quant_timing.cu and the layer):
 * streamed both ways. MOK_SWIGLU_STREAM=0 / 1 forces the per-tile / streamed kernels both ways, =fwd / =bwd
 * streams that direction only (read on every call, so that one process can compare). */
static inline bool use_stream(bool backward) {
    const char* env = getenv("MOK_SWIGLU_STREAM");
    if (env != NULL && *env != 0) {
        if (strcmp(env, "0") == 0) return false;
        if (strcmp(env, "1") == 0) return true;
        if (strcmp(env, "fwd") == 0) return !backward;
        if (strcmp(env, "bwd") == 0) return backward;
    }
    return true;
}

template <bool kBackward, bool kScaled>
int launch(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, bool rows, bool cols,
           cudaStream_t stream) {
    if (!use_stream(kBackward)) {
        if (rows && cols) launch_tiles<kBackward, true, true, kScaled>(t, sw, stream);
        else if (rows) launch_tiles<kBackward, true, false, kScaled>(t, sw, stream);
        else launch_tiles<kBackward, false, true, kScaled>(t, sw, stream);
        return 0;
    }
    if (rows && cols) return launch_stream<kBackward, true, true, kScaled>(t, sw, stream);
    if (rows) return launch_stream<kBackward, true, false, kScaled>(t, sw, stream);
    return launch_stream<kBackward, false, true, kScaled>(t, sw, stream);
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
    int err = 0;
    if (backward && scaled) err = launch<true, true>(t, sw, rows, cols, stream);
    else if (backward) err = launch<true, false>(t, sw, rows, cols, stream);
    else if (scaled) err = launch<false, true>(t, sw, rows, cols, stream);
    else err = launch<false, false>(t, sw, rows, cols, stream);
    return err != 0 ? err : mok_launch_status();
}
