/*
 * mok FP8 grouped GEMM launcher: the C ABI between csrc/torch (the mok::grouped_mm_fp8 op) and
 * csrc/cuda/grouped_gemm_fp8_sm90.cu. No torch types here.
 *
 * Blockwise recipe (DeepSeek-V3's): A [R, K] E4M3 codes with fp32 scales per 1 x 128 block
 * (sa [R, K / 128], mok.fp8's "blockwise_1x128"), B [E, N, K] E4M3 with fp32 scales per 128 x 128
 * block (sb [E, N / 128, K / 128]: "blockwise_128x128" of B viewed as [E * N, K]):
 *
 *   out[r, n] = sum_kb sa[r, kb] * sb[e, n / 128, kb] * sum_{k in block kb} A[r, k] * B[e, n, k]
 *
 * for offsets[e] <= r < offsets[e + 1], in bf16 [R, N]; rows outside [offsets[0], offsets[E]) are
 * written as 0 (as the BF16 grouped GEMM). The sm_90a kernel needs K % 128 == 0, N % 128 == 0, a
 * Hopper GPU, 16-byte aligned pointers, and every offsets[e] a multiple of 128 (mok's CUDA plans
 * are): a misaligned offset sets MOK_DEVICE_ERR_UNALIGNED_PLAN in error_flag (the rows of the
 * misaligned experts are then not computed) - the check needs device memory, and a host check
 * would stall the GPU.
 */
#ifndef MOK_FP8_GEMM_CUDA_H
#define MOK_FP8_GEMM_CUDA_H

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mok_grouped_gemm_fp8_args {
    const void* a;          /* [R, K] e4m3 */
    const float* sa;        /* [R, K / 128] */
    const void* b;          /* [E, N, K] e4m3 */
    const float* sb;        /* [E, N / 128, K / 128] */
    const int32_t* offsets; /* [E + 1], device */
    int64_t R, E, N, K;
    void* out;              /* [R, N] bf16 */
    int32_t* error_flag;    /* host-mapped error word (MOK_DEVICE_ERR_*) or NULL */
    int num_sms;            /* persistent grid size hint (0: query the device) */
    /* NULL, or [R, N / 2] bf16: GEMM1 of the experts with SwiGLU fused. B's rows are [gate | up]
     * (N = 2I, I % 64 == 0) and out = h; act[r, j] = SwiGLU(h[r, j], h[r, I + j]) of the rounded h,
     * bit for bit what mok_swiglu_forward_cuda computes from out (zeros outside the experts). */
    void* act;
};

/* 1 when the sm_90a kernel takes these arguments (see above); MOK_DISABLE_SM90 turns it off. */
int mok_grouped_gemm_fp8_supported(const struct mok_grouped_gemm_fp8_args* args);
/* MOK_OK, or an error status (MOK_ERR_*) / CUDA error code. */
int mok_grouped_gemm_fp8_cuda(const struct mok_grouped_gemm_fp8_args* args, cudaStream_t stream);

/*
 * Weight gradient ("wgrad", a K-grouped GEMM): the contraction runs over each expert's rows of the
 * plan's row space, on column-wise copies of both operands (mok.fp8.quantize_rowcol's qt): a [M, R]
 * and b [N, R] E4M3 codes (R contiguous) with fp32 scales per 1 x 128 block along R, stored MN-major
 * (one K-block's scales contiguous, read by one bulk copy per stage): sa [ceil(R / 128), M] and
 * sb [ceil(R / 128), N]:
 *
 *   out[e, m, n] = sum_{kb = offsets[e] / 128}^{offsets[e + 1] / 128 - 1} sa[kb, m] * sb[kb, n]
 *                      * sum_{r in block kb} a[m, r] * b[n, r]
 *
 * in bf16 [E, M, N]; an expert without rows gets zeros. With sb_tiled, b's scales are per 128 x 128
 * block, sb [ceil(R / 128), N / 128] with sb[kb, n / 128] for column n (b the column-wise copy of an
 * activation quantised in 128 x 128 tiles): the promotion's factor is then one per row and column
 * block, as the forward's, instead of one per element. The sm_90a kernel needs M % 128 == 0,
 * N % 128 == 0, R % 16 == 0 (TMA row pitch), 16-byte aligned pointers and every offsets[e] a multiple
 * of 128 (otherwise MOK_DEVICE_ERR_UNALIGNED_PLAN in error_flag and nothing computed).
 */
struct mok_grouped_gemm_fp8_wgrad_args {
    const void* a;          /* [M, R] e4m3 */
    const float* sa;        /* [ceil(R / 128), M] */
    const void* b;          /* [N, R] e4m3 */
    const float* sb;        /* [ceil(R / 128), N], or [ceil(R / 128), N / 128] with sb_tiled */
    int sb_tiled;           /* b's scales per 128 x 128 block */
    const int32_t* offsets; /* [E + 1], device */
    int64_t R, E, M, N;
    void* out;              /* [E, M, N] bf16; with out_second its rows [0, M / 2): [E, M / 2, N] */
    void* out_second;       /* NULL, or rows [M / 2, M) of every expert, [E, M / 2, N] (torchtitan's w3
                               gradient beside w1's in out); needs M / 2 % 64 == 0 and
                               mok_sm90_planes_ok(out, out_second) */
    int32_t* error_flag;    /* host-mapped error word (MOK_DEVICE_ERR_*) or NULL */
    int num_sms;            /* persistent grid size hint (0: query the device) */
};

int mok_grouped_gemm_fp8_wgrad_supported(const struct mok_grouped_gemm_fp8_wgrad_args* args);
int mok_grouped_gemm_fp8_wgrad_cuda(const struct mok_grouped_gemm_fp8_wgrad_args* args, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MOK_FP8_GEMM_CUDA_H */
