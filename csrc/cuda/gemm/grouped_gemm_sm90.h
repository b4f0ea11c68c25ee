/* Host entry of the sm_90a BF16 grouped GEMM (grouped_gemm_sm90.cu), used by mok_grouped_gemm_cuda
 * when the problem fits it; the SIMT kernel serves everything else. */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_SM90_H
#define MOK_CUDA_GEMM_GROUPED_GEMM_SM90_H

#include "../mok_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the sm_90a kernel handles these arguments: bf16, NT, K and N multiples of 8 (16-byte TMA
 * strides), a Hopper device, and MOK_DISABLE_SM90 unset. */
int mok_grouped_gemm_sm90_supported(const struct mok_grouped_gemm_args* args);
int mok_grouped_gemm_sm90(const struct mok_grouped_gemm_args* args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
