/*
 * mok MXFP8 quantise-dequantise launcher: the C ABI between csrc/torch (the mok::qdq_mxfp8 op) and
 * csrc/cuda/qdq_mxfp8.cu. No torch types here.
 *
 * x [M, N] bf16 -> bf16 [M, N] copies holding the values of x's MXFP8 encoding (E4M3 codes times
 * their block's RCEIL E8M0 scale), bit for bit mok_qdq_mxfp8_rows / mok_qdq_mxfp8_cols of the C core
 * (csrc/core/mok_core.h, where the rules are written out):
 *   rows  1 x 32 blocks along N;
 *   cols  32 x 1 blocks along M, aligned to 32 rows of x: the core's segment rule when every
 *         offsets[e] is a multiple of 32 or M (mok's CUDA plans are 128-aligned); rows outside
 *         [offsets[0], offsets[E]) are written as +0; offsets NULL: one segment [0, M).
 * Either output may be NULL (not computed); both may share nothing with x. One kernel reads x once
 * and writes the copies asked for; with src_of_row, x's gathered rows (below).
 *
 * An offset outside [0, M] or neither a multiple of 32 nor M cannot be checked on the host without
 * a synchronisation: the kernel sets MOK_DEVICE_ERR_UNALIGNED_PLAN in error_flag and writes nothing
 * (neither copy). The kernel uses only those conditions and offsets[0], offsets[E]; the core's other
 * condition (non-decreasing) is the caller's to keep.
 */
#ifndef MOK_QDQ_CUDA_H
#define MOK_QDQ_CUDA_H

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mok_qdq_mxfp8_args {
    const void* x;          /* [M, N] bf16 */
    int64_t M, N;
    void* rows;             /* [M, N] bf16: row-wise qdq, or NULL */
    void* cols;             /* [M, N] bf16: column-wise qdq, or NULL */
    const int32_t* offsets; /* [E + 1] int32, device; or NULL (one segment). Read only when cols != NULL */
    int64_t E;
    int32_t* error_flag;    /* host-mapped error word (MOK_DEVICE_ERR_*) or NULL */
    /* Gathered rows (src_of_row not NULL): the input is gather_rows(x, src_of_row, w, K) [M, N] of x
     * [T, N], read straight from x and never written: row m is row src_of_row[m] / K of x, times
     * w[src_of_row[m]] (rounded to bf16) when w is not NULL, a zero row where src_of_row[m] is outside
     * [0, T * K) (padding, -1). NULL: x itself is the [M, N] input. */
    const int32_t* src_of_row; /* [M] int32, device */
    const float* w;            /* [T * K] fp32, device, or NULL */
    int64_t T, K;
};

/* MOK_OK, MOK_ERR_ARG for bad arguments, or a (positive) CUDA error code of the launch. */
int mok_qdq_mxfp8_cuda(const struct mok_qdq_mxfp8_args* args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MOK_QDQ_CUDA_H */
