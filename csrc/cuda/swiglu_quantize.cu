/*
 * mok_swiglu_quantize_fp8_cuda: SwiGLU or its gradient with the result quantised in the same pass
 * (why: the FP8 layer quantises act and d_h right after computing them, and their bf16 copies were a
 * round trip through memory). The streamed kernel of quant/swiglu_quantize_stream.cuh by default (v54);
 * MOK_SWIGLU_STREAM=0 takes the per-tile one of quant/swiglu_quantize_tile.cuh (same outputs).
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "quant/swiglu_quantize_stream.cuh"

namespace {

enum { kMinBlocks = 2 }; /* per-tile kernel: CTAs per SM (v39: benchmarks/swiglu_quant_timing.cu) */

/* The streamed kernel's shape (v54, benchmarks/swiglu_quant_timing.cu): how many items ahead its loads
 * run and how many CTAs share an SM (the backward's 96 KiB per item ahead leave room for one). */
template <bool kBackward>
struct stream_shape {
    enum { kAhead = kBackward ? 2 : 1, kCtas = 1 };
};

/* The per-tile kernel (MOK_SWIGLU_STREAM=0), one CTA per tile of the output. */
template <bool kBackward, bool kRows, bool kCols, bool kScaled>
void launch_tiles(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, cudaStream_t stream) {
    using namespace mok_qtile;
    const unsigned grid = (unsigned)tile_count(t.M, t.N);
    swiglu_quantize_bf16_kernel<kBackward, kRows, kCols, kMinBlocks, kScaled><<<grid, kThreads, 0, stream>>>(t, sw);
}

/* The streamed kernel: persistent, as many CTAs as are resident (or as there are items). */
template <bool kBackward, bool kRows, bool kCols, bool kScaled>
int launch_stream(const mok_qtile::tile_args& t, const mok_qtile::swiglu_tile_args& sw, cudaStream_t stream) {
    using namespace mok_qtile;
    using shape = stream_shape<kBackward>;
    const auto kernel = swiglu_quantize_stream_kernel<kBackward, kRows, kCols, kScaled, shape::kAhead, shape::kCtas>;
    const size_t smem = stream_smem_bytes(kBackward, shape::kAhead);
    /* once per variant and device (as the GEMM launchers do): not again inside a CUDA graph capture */
    enum { kMaxDevices = 64 };
    static bool configured[kMaxDevices];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return (int)cudaErrorInvalidDevice;
    if (!configured[dev]) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return (int)err;
        configured[dev] = true;
    }
    const int64_t items = tile_count(sw.R, sw.I);
    const int64_t resident = (int64_t)shape::kCtas * mok_num_sms();
    const unsigned grid = (unsigned)(items < resident ? items : resident);
    kernel<<<grid, kThreads, smem, stream>>>(t, sw);
    return 0;
}

/* Which kernel by default, per direction (v54: measured in benchmarks/swiglu_quant_timing.cu and the layer);
 * MOK_SWIGLU_STREAM=0 / 1 forces the per-tile / streamed one (read on every call, so that one process can
 * compare). */
enum { kStreamForward = 1, kStreamBackward = 0 };
static inline bool use_stream(bool backward) {
    if (env_equals("MOK_SWIGLU_STREAM", "0")) return false;
    if (env_equals("MOK_SWIGLU_STREAM", "1")) return true;
    return (backward ? kStreamBackward : kStreamForward) != 0;
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
