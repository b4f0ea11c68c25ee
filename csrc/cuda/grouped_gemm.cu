/*
 * Grouped GEMM over the plan's row space on the GPU (mok_grouped_gemm in mok_core.h), NT and NN, with
 * gather-on-load of the A rows and the optional SwiGLU epilogue: bf16 NT problems go to the sm_90a wgmma
 * kernel (grouped_gemm_sm90.cu), which fuses the SwiGLU epilogue; the SIMT kernel of
 * gemm/grouped_gemm_simt.cuh serves the other dtypes, NN and unaligned shapes.
 *
 * SwiGLU epilogue on the SIMT path (swiglu_out != NULL): a second phase; after the GEMM kernel the
 * launcher runs mok_swiglu_forward_cuda(h = out, I = N / 2, out = swiglu_out) on the same stream, which
 * reads the rounded values of out and therefore equals mok_swiglu_forward applied to out exactly.
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "gemm/grouped_gemm_simt.cuh"
#include "gemm/grouped_gemm_sm90.h"

extern "C" int mok_grouped_gemm_cuda(const struct mok_grouped_gemm_args* args, cudaStream_t stream) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->E >= 0 && args->N >= 0 && args->Kd >= 0);
    MOK_CHECK_ARG(args->offsets != NULL && args->out != NULL);
    MOK_CHECK_ARG(args->a != NULL && args->b != NULL);
    MOK_CHECK_ARG(args->a_gather == NULL || args->a_gather_div >= 1);
    MOK_CHECK_ARG(args->swiglu_out == NULL || (args->trans_b != 0 && args->N % 2 == 0));
    if (args->dtype != MOK_BF16 && args->dtype != MOK_F16 && args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (args->R == 0 || args->N == 0) {
        return 0;
    }
    /* ---- the sm_90a wgmma kernel where it applies (bf16 NT), the SIMT kernel otherwise ---- */
    if (mok_grouped_gemm_sm90_supported(args)) {
        return mok_grouped_gemm_sm90(args, stream);
    }
    /* (the on-load MXFP8 qdq of A and split weights exist on the sm_90a kernel only) */
    MOK_CHECK_ARG(!args->qdq_a_mxfp8 && args->b_second == NULL);

    int status = mok_run_status(mok_gemm_simt::grouped_gemm_simt_run(args, mok_on_stream(stream)));
    if (status != 0 || args->swiglu_out == NULL) {
        return status;
    }

    /* ---- SwiGLU epilogue as a second phase on the same stream (see the file header) ---- */
    struct mok_swiglu_args sw;
    sw.h = args->out;
    sw.d_act = NULL;
    sw.dtype = args->dtype;
    sw.R = args->R;
    sw.I = args->N / 2;
    sw.out = args->swiglu_out;
    return mok_swiglu_forward_cuda(&sw, stream);
}
