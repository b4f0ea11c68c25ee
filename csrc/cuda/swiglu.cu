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

namespace {

/* launch(kernel, grid, block, arguments...) as <<<grid, block, 0, stream>>> */
auto on_stream(cudaStream_t stream) {
    return [stream](auto kernel, unsigned grid, unsigned block, auto... kernel_args) {
        kernel<<<grid, block, 0, stream>>>(kernel_args...);
    };
}

/* a run's argument error, or the launches' status */
int status_of(int run) { return run != 0 ? run : mok_launch_status(); }

}  // namespace

extern "C" int mok_swiglu_forward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream) {
    return status_of(swiglu_forward_run(args, on_stream(stream)));
}

extern "C" int mok_swiglu_backward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream) {
    return status_of(swiglu_backward_run(args, on_stream(stream)));
}

extern "C" int mok_swiglu_scaled_backward_cuda(const struct mok_swiglu_scaled_backward_args* a, cudaStream_t stream) {
    return status_of(swiglu_scaled_backward_run(a, on_stream(stream)));
}
