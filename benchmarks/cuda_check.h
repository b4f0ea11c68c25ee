/* CHECK(x): exit with the file, line and CUDA error string when a runtime call fails; for the
 * standalone tools in benchmarks/ (sm90_gemm_timing.cu, sm90_fp8_gemm_check.cu). */
#ifndef MOK_BENCHMARKS_CUDA_CHECK_H
#define MOK_BENCHMARKS_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t err_ = (x);                                                           \
        if (err_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif /* MOK_BENCHMARKS_CUDA_CHECK_H */
