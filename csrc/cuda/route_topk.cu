/*
 * Router top-k, forward and backward (mok_route_topk / mok_route_topk_backward in mok_core.h): the launchers of
 * the kernels in route/route_topk.cuh (the algorithm, its order of sums and its tie rules are described there).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "route/route_topk.cuh"

using namespace mok_route;

extern "C" int mok_route_topk_cuda(const struct mok_route_topk_args* args, cudaStream_t stream) {
    /* ---- argument checks (the core's rules, plus E <= ROUTE_MAX_E) ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->T >= 0 && args->E >= 1 && args->E <= ROUTE_MAX_E);
    MOK_CHECK_ARG(args->K >= 1 && args->K <= args->E);
    MOK_CHECK_ARG(args->score_func == MOK_SCORE_SOFTMAX || args->score_func == MOK_SCORE_SIGMOID);
    if (args->n_group > 1) {
        MOK_CHECK_ARG(args->E % args->n_group == 0);
        MOK_CHECK_ARG(args->topk_group >= 1 && args->topk_group <= args->n_group);
        MOK_CHECK_ARG(args->K <= args->topk_group * (args->E / args->n_group));
    }
    MOK_CHECK_ARG(args->T == 0 || (args->logits != NULL && args->topk_idx != NULL && args->topk_w != NULL));
    if (args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (args->T == 0) {
        return 0;
    }
    route_params p;
    p.logits = args->logits;
    p.bias = args->bias;
    p.grad_w = NULL;
    p.topk_idx_in = NULL;
    p.T = args->T;
    p.E = args->E;
    p.K = args->K;
    p.score_func = args->score_func;
    p.n_group = args->n_group;
    p.topk_group = args->topk_group;
    p.renormalize = args->renormalize;
    p.scaling = args->scaling;
    p.topk_idx = args->topk_idx;
    p.out = args->topk_w;
    /* ---- launch: one warp per token ---- */
    if (args->dtype == MOK_F32) {
        route_topk_kernel<float><<<route_grid<float>(p.T), route_cfg<float>::WARPS * 32, 0, stream>>>(p);
    } else {
        route_topk_kernel<double><<<route_grid<double>(p.T), route_cfg<double>::WARPS * 32, 0, stream>>>(p);
    }
    return mok_launch_status();
}

extern "C" int mok_route_topk_backward_cuda(const struct mok_route_topk_backward_args* args, cudaStream_t stream) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->T >= 0 && args->E >= 1 && args->E <= ROUTE_MAX_E);
    MOK_CHECK_ARG(args->K >= 1 && args->K <= args->E);
    MOK_CHECK_ARG(args->score_func == MOK_SCORE_SOFTMAX || args->score_func == MOK_SCORE_SIGMOID);
    MOK_CHECK_ARG(args->T == 0 || (args->grad_w != NULL && args->logits != NULL && args->topk_idx != NULL &&
                                   args->grad_logits != NULL));
    if (args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (args->T == 0) {
        return 0;
    }
    route_params p;
    p.logits = args->logits;
    p.bias = NULL;
    p.grad_w = args->grad_w;
    p.topk_idx_in = args->topk_idx;
    p.T = args->T;
    p.E = args->E;
    p.K = args->K;
    p.score_func = args->score_func;
    p.n_group = 1;
    p.topk_group = 1;
    p.renormalize = args->renormalize;
    p.scaling = args->scaling;
    p.topk_idx = NULL;
    p.out = args->grad_logits;
    /* ---- launch: one warp per token ---- */
    if (args->dtype == MOK_F32) {
        route_topk_backward_kernel<float><<<route_grid<float>(p.T), route_cfg<float>::WARPS * 32, 0, stream>>>(p);
    } else {
        route_topk_backward_kernel<double><<<route_grid<double>(p.T), route_cfg<double>::WARPS * 32, 0, stream>>>(p);
    }
    return mok_launch_status();
}
