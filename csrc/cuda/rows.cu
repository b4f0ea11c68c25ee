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

extern "C" int mok_gather_rows_cuda(const struct mok_gather_rows_args* args, cudaStream_t stream) {
    return mok_run_status(gather_rows_run(args, mok_on_stream(stream)));
}

extern "C" int mok_combine_cuda(const struct mok_combine_args* args, cudaStream_t stream) {
    return mok_run_status(combine_run(args, mok_on_stream(stream)));
}

extern "C" int mok_combine_weight_grad_cuda(const struct mok_combine_weight_grad_args* args, cudaStream_t stream) {
    return mok_run_status(combine_weight_grad_run(args, mok_on_stream(stream)));
}
