/*
 * SwiGLU on the GPU (mok_swiglu_forward / mok_swiglu_backward / mok_swiglu_scaled_backward in mok_core.h): the
 * launchers of swiglu/swiglu_kernels.cuh's kernels (what each computes, and which runs when, is described there).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "swiglu/swiglu_kernels.cuh"

using namespace mok_swiglu_rows;

extern "C" int mok_swiglu_forward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream) {
    return mok_run_status(swiglu_forward_run(args, mok_on_stream(stream)));
}

extern "C" int mok_swiglu_backward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream) {
    return mok_run_status(swiglu_backward_run(args, mok_on_stream(stream)));
}

extern "C" int mok_swiglu_scaled_backward_cuda(const struct mok_swiglu_scaled_backward_args* a, cudaStream_t stream) {
    return mok_run_status(swiglu_scaled_backward_run(a, mok_on_stream(stream)));
}
