/* Host entry of the sm_90a BF16 grouped GEMM (grouped_gemm_sm90.cu), used by mok_grouped_gemm_cuda
 * when the problem fits it; the SIMT kernel serves everything else. */
#ifndef MOK_CUDA_GEMM_GROUPED_GEMM_SM90_H
#define MOK_CUDA_GEMM_GROUPED_GEMM_SM90_H

#include <stdint.h>

#include "../mok_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the sm_90a kernel handles these arguments: bf16, NT or NN (not NN with the SwiGLU
 * epilogue), K and N multiples of 8 (16-byte TMA strides), a Hopper device, and MOK_DISABLE_SM90
 * unset; with b_second, NT with SwiGLU or NN with Kd / 2 a multiple of 64. */
int mok_grouped_gemm_sm90_supported(const struct mok_grouped_gemm_args* args);

/* 1 when two tensors can be the planes of one TMA map: both 16-byte aligned, at different addresses
 * (one tensor passed twice gets no stride-0 map) and their distance a valid TMA stride (below 2^40
 * bytes); split weights whose tensors are not fall back to a copy. */
static inline int mok_sm90_planes_ok(const void* x, const void* y) {
    const uintptr_t a = (uintptr_t)x, b = (uintptr_t)y, d = a < b ? b - a : a - b;
    return (a | b) % 16 == 0 && d != 0 && d < ((uintptr_t)1 << 40);
}
/* The map base and plane stride of a tensor split over two allocations (first: half 0, second: half 1):
 * the lower address is the base, so the stride is positive (TMA strides are unsigned); *flip = 1 when
 * that is the second. */
static inline const void* mok_sm90_split_base(const void* first, const void* second, uint64_t* plane_stride,
                                              int32_t* flip) {
    const uintptr_t f = (uintptr_t)first, s = (uintptr_t)second;
    *flip = s < f ? 1 : 0;
    *plane_stride = (uint64_t)(s < f ? f - s : s - f);
    return s < f ? second : first;
}
int mok_grouped_gemm_sm90(const struct mok_grouped_gemm_args* args, cudaStream_t stream);

/* Weight gradient out[e] = a_e^T b_e over the rows of expert e, with a [R, M] and b [R, N] read as
 * they are (MN-major operands); bf16; M, N multiples of 8. Experts whose row range is not
 * 64-aligned run on a slow FMA fallback inside the same kernel.
 * out_second: NULL (out is [E, M, N]), or the tensor of rows [M / 2, M) of every expert's result,
 * out then holding rows [0, M / 2) ([E, M / 2, N] each; torchtitan's w1 / w3 gradients); needs
 * M / 2 % 64 == 0 (mok_grouped_gemm_wgrad_sm90_supported with split = 1). */
int mok_grouped_gemm_wgrad_sm90_supported(int64_t R, int64_t E, int64_t M, int64_t N, int split);
int mok_grouped_gemm_wgrad_sm90(const void* a, const void* b, const int32_t* offsets, int64_t R, int64_t E,
                                int64_t M, int64_t N, void* out, void* out_second, int num_sms, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
