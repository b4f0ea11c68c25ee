/*
 * Row movement on the GPU (mok_gather_rows, mok_combine, mok_combine_weight_grad in mok_core.h): the launchers
 * of rows/rows.cuh's kernels (what each computes, and which kernel runs when, is described there).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "rows/rows.cuh"

using namespace mok_rows;

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

extern "C" int mok_gather_rows_cuda(const struct mok_gather_rows_args* args, cudaStream_t stream) {
    return status_of(gather_rows_run(args, on_stream(stream)));
}

extern "C" int mok_combine_cuda(const struct mok_combine_args* args, cudaStream_t stream) {
    return status_of(combine_run(args, on_stream(stream)));
}

extern "C" int mok_combine_weight_grad_cuda(const struct mok_combine_weight_grad_args* args, cudaStream_t stream) {
    return status_of(combine_weight_grad_run(args, on_stream(stream)));
}
