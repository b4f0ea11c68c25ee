/*
 * Routing plan on the GPU (mok_plan_build in mok_core.h), deterministic, no host sync: the launcher of the
 * kernels in plan/plan_build.cuh (how the plan is built is described there).
 */
#include <stdint.h>
#include <cuda_runtime.h>

#include "mok_cuda.h"
#include "common/launch.cuh"
#include "plan/plan_build.cuh"

using namespace mok_plan;

extern "C" size_t mok_plan_workspace_bytes(int64_t T, int64_t K, int64_t E) {
    if (T <= 0 || K <= 0 || E <= 0) {
        return 1;
    }
    const int64_t nc = mok_ceil_div(T * K, PLAN_CHUNK);
    const size_t bytes = (size_t)nc * (size_t)E * sizeof(int32_t);
    return bytes > 0 ? bytes : 1;
}

extern "C" int mok_plan_build_cuda(const struct mok_plan_build_args* args, cudaStream_t stream) {
    /* ---- argument checks ---- */
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->T >= 0 && args->K >= 0 && args->E >= 0 && args->tile >= 1 && args->capacity >= 0);
    const int64_t TK = args->T * args->K;
    MOK_CHECK_ARG(TK <= MOK_INT32_LIMIT && args->capacity <= MOK_INT32_LIMIT);
    MOK_CHECK_ARG(args->offsets != NULL && args->num_skipped != NULL);
    MOK_CHECK_ARG(args->E == 0 || args->counts != NULL);
    MOK_CHECK_ARG(TK == 0 || (args->topk_idx != NULL && args->row_of != NULL));
    MOK_CHECK_ARG(args->capacity == 0 || args->src_of_row != NULL);
    const int64_t NC = mok_ceil_div(TK, PLAN_CHUNK);
    MOK_CHECK_ARG(NC * args->E == 0 || args->workspace != NULL);
    if (args->capacity < plan_capacity(TK, args->E, args->tile)) {
        return MOK_ERR_CAPACITY;
    }

    plan_params p;
    p.topk_idx = args->topk_idx;
    p.TK = TK;
    p.E = args->E;
    p.NC = NC;
    p.tile = args->tile;
    p.capacity = args->capacity;
    p.skip_invalid = args->skip_invalid;
    p.counts = args->counts;
    p.offsets = args->offsets;
    p.row_of = args->row_of;
    p.src_of_row = args->src_of_row;
    p.num_skipped = args->num_skipped;
    p.ws = (int32_t*)args->workspace;
    p.error_flag = args->error_flag;

    plan_build_launches(p, mok_on_stream(stream));
    return mok_launch_status();
}
