/*
 * Weight-gradient grouped GEMM with a ragged contraction on the GPU (mok_grouped_gemm_wgrad in mok_core.h):
 *   out[e, m, n] = sum over r in [offsets[e], offsets[e + 1]) (increasing r) of a[r, m] * B[r, n]
 *   B[r, :] = b[b_gather[r] / b_gather_div, :] (zeros when b_gather[r] < 0), or b[r, :].
 * The argument checks and the launch of gemm/grouped_gemm_simt.cuh's kernel (described there).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "gemm/grouped_gemm_simt.cuh"

extern "C" int mok_grouped_gemm_wgrad_cuda(const struct mok_grouped_gemm_wgrad_args* args, cudaStream_t stream) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->E >= 0 && args->M >= 0 && args->N >= 0);
    MOK_CHECK_ARG(args->offsets != NULL && args->out != NULL && args->a != NULL && args->b != NULL);
    MOK_CHECK_ARG(args->b_gather == NULL || args->b_gather_div >= 1);
    if (args->dtype != MOK_BF16 && args->dtype != MOK_F16 && args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (args->E == 0 || args->M == 0 || args->N == 0) {
        return 0;
    }

    return mok_run_status(mok_gemm_simt::grouped_gemm_wgrad_simt_run(args, mok_on_stream(stream)));
}
