/*
 * SwiGLU on concatenated [gate | up] rows (mok_swiglu_forward / mok_swiglu_backward in mok_core.h):
 *   h [R, 2I]; forward  act[r, j] = silu(g) * u,   silu(g) = g / (1 + exp(-g))
 *              backward d_h[r, j]     = d_act * u * sig(g) * (1 + g * (1 - sig(g)))   (d_gate)
 *                       d_h[r, I + j] = d_act * silu(g)                              (d_up)
 *   with g = h[r, j], u = h[r, I + j], sig(g) = 1 / (1 + exp(-g)).
 *
 * Element-wise, one thread per (r, j), grid-stride; bf16 with I % 8 == 0 and 16-byte aligned
 * tensors: one thread per 8 consecutive j (16-byte loads and stores), the same arithmetic. Arithmetic in the accumulation type, each
 * operation rounded on its own (mok_add / mok_mul / mok_div: no FMA contraction), left to right
 * as written above; one rounding to the storage type at the end.
 */
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mok_cuda.h"
#include "common/dtype.cuh"
#include "common/swiglu.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace {

enum { SWIGLU_THREADS = 256, SWIGLU_BLOCKS_PER_SM = 16 };

template <typename T>
__global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_forward_kernel(const T* __restrict__ h, int64_t R, int64_t I,
                                                                        T* __restrict__ act) {
    typedef typename mok_acc<T>::type Acc;
    const int64_t n = R * I;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        /* ---- load gate and up of element (r, j) ---- */
        const int64_t r = idx / I, j = idx % I;
        const Acc g = mok_to_acc(h[r * 2 * I + j]);
        const Acc u = mok_to_acc(h[r * 2 * I + I + j]);
        /* ---- act = silu(g) * u, rounded once ---- */
        act[idx] = mok_from_acc<T>(mok_mul(mok_silu(g), u));
    }
}

template <typename T>
__global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_backward_kernel(const T* __restrict__ h,
                                                                         const T* __restrict__ d_act, int64_t R,
                                                                         int64_t I, T* __restrict__ d_h) {
    typedef typename mok_acc<T>::type Acc;
    const int64_t n = R * I;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        /* ---- load gate, up and the incoming gradient of element (r, j) ---- */
        const int64_t r = idx / I, j = idx % I;
        const Acc g = mok_to_acc(h[r * 2 * I + j]);
        const Acc u = mok_to_acc(h[r * 2 * I + I + j]);
        const Acc da = mok_to_acc(d_act[idx]);
        Acc d_gate, d_up;
        mok_swiglu_grad(g, u, da, d_gate, d_up);
        d_h[r * 2 * I + j] = mok_from_acc<T>(d_gate);
        d_h[r * 2 * I + I + j] = mok_from_acc<T>(d_up);
    }
}

__global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_backward_bf16x8_kernel(const __nv_bfloat16* __restrict__ h,
                                                                                const __nv_bfloat16* __restrict__ d_act,
                                                                                int64_t R, int64_t I,
                                                                                __nv_bfloat16* __restrict__ d_h) {
    const int64_t IV = I / MOK_VEC, n = R * IV;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / IV, j = (idx % IV) * MOK_VEC;
        float g[MOK_VEC], u[MOK_VEC], da[MOK_VEC], dg[MOK_VEC], du[MOK_VEC];
        mok_unpack8(mok_ld8(h + r * 2 * I + j), g);
        mok_unpack8(mok_ld8(h + r * 2 * I + I + j), u);
        mok_unpack8(mok_ld8(d_act + r * I + j), da);
#pragma unroll
        for (int i = 0; i < MOK_VEC; ++i) mok_swiglu_grad(g[i], u[i], da[i], dg[i], du[i]);
        mok_st8(d_h + r * 2 * I + j, dg);
        mok_st8(d_h + r * 2 * I + I + j, du);
    }
}

/* Shared checks of both directions; 1 when there is nothing to do, 0 to launch, < 0 on error. */
int swiglu_check(const struct mok_swiglu_args* args, int backward) {
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->I >= 0);
    MOK_CHECK_ARG(args->h != NULL && args->out != NULL);
    MOK_CHECK_ARG(!backward || args->d_act != NULL);
    if (args->dtype != MOK_BF16 && args->dtype != MOK_F16 && args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    return (args->R == 0 || args->I == 0) ? 1 : 0;
}

}  // namespace

extern "C" int mok_swiglu_forward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream) {
    const int c = swiglu_check(args, 0);
    if (c != 0) {
        return c < 0 ? c : 0;
    }
    const unsigned int grid = mok_grid_stride_blocks(args->R * args->I, SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
    switch (args->dtype) {
        case MOK_BF16:
            swiglu_forward_kernel<__nv_bfloat16><<<grid, SWIGLU_THREADS, 0, stream>>>(
                (const __nv_bfloat16*)args->h, args->R, args->I, (__nv_bfloat16*)args->out);
            break;
        case MOK_F16:
            swiglu_forward_kernel<__half><<<grid, SWIGLU_THREADS, 0, stream>>>((const __half*)args->h, args->R,
                                                                              args->I, (__half*)args->out);
            break;
        case MOK_F32:
            swiglu_forward_kernel<float><<<grid, SWIGLU_THREADS, 0, stream>>>((const float*)args->h, args->R, args->I,
                                                                             (float*)args->out);
            break;
        default:
            swiglu_forward_kernel<double><<<grid, SWIGLU_THREADS, 0, stream>>>((const double*)args->h, args->R,
                                                                              args->I, (double*)args->out);
            break;
    }
    return mok_launch_status();
}

extern "C" int mok_swiglu_backward_cuda(const struct mok_swiglu_args* args, cudaStream_t stream) {
    const int c = swiglu_check(args, 1);
    if (c != 0) {
        return c < 0 ? c : 0;
    }
    if (args->dtype == MOK_BF16 && args->I % MOK_VEC == 0 && mok_aligned16(args->h, args->d_act, args->out)) {
        const unsigned int grid =
            mok_grid_stride_blocks(args->R * (args->I / MOK_VEC), SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
        swiglu_backward_bf16x8_kernel<<<grid, SWIGLU_THREADS, 0, stream>>>(
            (const __nv_bfloat16*)args->h, (const __nv_bfloat16*)args->d_act, args->R, args->I,
            (__nv_bfloat16*)args->out);
        return mok_launch_status();
    }
    const unsigned int grid = mok_grid_stride_blocks(args->R * args->I, SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
    switch (args->dtype) {
        case MOK_BF16:
            swiglu_backward_kernel<__nv_bfloat16><<<grid, SWIGLU_THREADS, 0, stream>>>(
                (const __nv_bfloat16*)args->h, (const __nv_bfloat16*)args->d_act, args->R, args->I,
                (__nv_bfloat16*)args->out);
            break;
        case MOK_F16:
            swiglu_backward_kernel<__half><<<grid, SWIGLU_THREADS, 0, stream>>>(
                (const __half*)args->h, (const __half*)args->d_act, args->R, args->I, (__half*)args->out);
            break;
        case MOK_F32:
            swiglu_backward_kernel<float><<<grid, SWIGLU_THREADS, 0, stream>>>(
                (const float*)args->h, (const float*)args->d_act, args->R, args->I, (float*)args->out);
            break;
        default:
            swiglu_backward_kernel<double><<<grid, SWIGLU_THREADS, 0, stream>>>(
                (const double*)args->h, (const double*)args->d_act, args->R, args->I, (double*)args->out);
            break;
    }
    return mok_launch_status();
}
