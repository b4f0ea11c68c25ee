/*
 * SwiGLU on concatenated [gate | up] rows (mok_swiglu_forward / mok_swiglu_backward in mok_core.h): the kernels and
 * the choice among them (launcher: swiglu.cu; a header of its own so that the CPU emulation, tests/emu/swiglu_emu.cpp,
 * runs them too):
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
#ifndef MOK_CUDA_SWIGLU_SWIGLU_KERNELS_CUH
#define MOK_CUDA_SWIGLU_SWIGLU_KERNELS_CUH

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../mok_cuda.h"
#include "../common/dtype.cuh"
#include "../common/swiglu.cuh"
#include "../common/launch.cuh"
#include "../common/vec.cuh"
#include "../common/warp.cuh"

namespace mok_swiglu_rows {

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

/* bf16, I % 8 == 0, 16-byte aligned: 8 consecutive j per thread (the scalar kernel's 64-bit division
 * per element and 2-byte accesses ran at 1.7 TB/s on Mixtral's h, RESULTS v10's trace). */
__global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_forward_bf16x8_kernel(const __nv_bfloat16* __restrict__ h,
                                                                               int64_t R, int64_t I,
                                                                               __nv_bfloat16* __restrict__ act) {
    const int64_t IV = I / MOK_VEC, n = R * IV;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = idx / IV, j = (idx % IV) * MOK_VEC;
        float g[MOK_VEC], u[MOK_VEC], a[MOK_VEC];
        mok_unpack8(mok_ld8(h + r * 2 * I + j), g);
        mok_unpack8(mok_ld8(h + r * 2 * I + I + j), u);
#pragma unroll
        for (int i = 0; i < MOK_VEC; ++i) a[i] = mok_swiglu(g[i], u[i]);
        mok_st8(act + r * I + j, a);
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

/* ------------------------------------------------------------------------------------------------
 * Row-scaled SwiGLU backward (mok_swiglu_scaled_backward in mok_core.h): one warp per row, so that
 * the row's d_s is one fixed-shape reduction (lane l sums j = l, l + 32, ... in increasing j, then
 * the fixed shuffle tree): bitwise reproducible, equal to the core's serial sum up to rounding.
 * act is recomputed as the forward stored it (SwiGLU rounded to T, the GEMM1 epilogue's bits).
 * src_of_row entries >= n_pairs give s = 0 (they cannot be reported without a host sync).
 * ---------------------------------------------------------------------------------------------- */
template <typename Acc>
__device__ __forceinline__ Acc row_scale(const Acc* __restrict__ w, const int32_t* __restrict__ src_of_row,
                                         int64_t n_pairs, int64_t r) {
    const int64_t src = (int64_t)src_of_row[r];
    return (src >= 0 && src < n_pairs) ? w[src] : (Acc)0;
}

template <typename T>
__global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_scaled_backward_kernel(
    const T* __restrict__ h, const T* __restrict__ d_z, int64_t R, int64_t I, const int32_t* __restrict__ src_of_row,
    const typename mok_acc<T>::type* __restrict__ w, int64_t n_pairs, T* __restrict__ d_h, T* __restrict__ z,
    typename mok_acc<T>::type* __restrict__ d_s) {
    typedef typename mok_acc<T>::type Acc;
    const WarpStride ws = warp_stride();
    for (int64_t r = ws.warp; r < R; r += ws.count) {
        const Acc s = row_scale(w, src_of_row, n_pairs, r);
        Acc dot = (Acc)0;
        for (int64_t j = ws.lane; j < I; j += 32) {
            const Acc g = mok_to_acc(h[r * 2 * I + j]), u = mok_to_acc(h[r * 2 * I + I + j]);
            const Acc dz = mok_to_acc(d_z[r * I + j]);
            const Acc act = mok_to_acc(mok_from_acc<T>(mok_swiglu(g, u)));
            dot = mok_add(dot, mok_mul(dz, act));
            z[r * I + j] = mok_from_acc<T>(mok_mul(s, act));
            Acc d_gate, d_up;
            mok_swiglu_grad(g, u, mok_mul(s, dz), d_gate, d_up);
            d_h[r * 2 * I + j] = mok_from_acc<T>(d_gate);
            d_h[r * 2 * I + I + j] = mok_from_acc<T>(d_up);
        }
        dot = warp_sum_to_lane0(dot);
        if (ws.lane == 0) d_s[r] = dot;
    }
}

/* bf16 x 8 variant (I % 8 == 0, 16-byte aligned): lane l takes the vectors c = l, l + 32, ... */
__global__ void __launch_bounds__(SWIGLU_THREADS) swiglu_scaled_backward_bf16x8_kernel(
    const __nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ d_z, int64_t R, int64_t I,
    const int32_t* __restrict__ src_of_row, const float* __restrict__ w, int64_t n_pairs,
    __nv_bfloat16* __restrict__ d_h, __nv_bfloat16* __restrict__ z, float* __restrict__ d_s) {
    const WarpStride ws = warp_stride();
    const int64_t IV = I / MOK_VEC;
    for (int64_t r = ws.warp; r < R; r += ws.count) {
        const float s = row_scale(w, src_of_row, n_pairs, r);
        float dot = 0.f;
        for (int64_t c = ws.lane; c < IV; c += 32) {
            const int64_t j = c * MOK_VEC;
            float g[MOK_VEC], u[MOK_VEC], dz[MOK_VEC], zs[MOK_VEC], dg[MOK_VEC], du[MOK_VEC];
            mok_unpack8(mok_ld8(h + r * 2 * I + j), g);
            mok_unpack8(mok_ld8(h + r * 2 * I + I + j), u);
            mok_unpack8(mok_ld8(d_z + r * I + j), dz);
#pragma unroll
            for (int i = 0; i < MOK_VEC; ++i) {
                const float act = mok_to_acc(mok_from_acc<__nv_bfloat16>(mok_swiglu(g[i], u[i])));
                dot = mok_add(dot, mok_mul(dz[i], act));
                zs[i] = mok_mul(s, act);
                mok_swiglu_grad(g[i], u[i], mok_mul(s, dz[i]), dg[i], du[i]);
            }
            mok_st8(z + r * I + j, zs);
            mok_st8(d_h + r * 2 * I + j, dg);
            mok_st8(d_h + r * 2 * I + I + j, du);
        }
        dot = warp_sum_to_lane0(dot);
        if (ws.lane == 0) d_s[r] = dot;
    }
}

/* Shared checks of both directions; 1 when there is nothing to do, 0 to launch, < 0 on error. */
inline int swiglu_check(const struct mok_swiglu_args* args, int backward) {
    MOK_CHECK_ARG(args != NULL);
    MOK_CHECK_ARG(args->R >= 0 && args->I >= 0);
    MOK_CHECK_ARG(args->h != NULL && args->out != NULL);
    MOK_CHECK_ARG(!backward || args->d_act != NULL);
    if (args->dtype != MOK_BF16 && args->dtype != MOK_F16 && args->dtype != MOK_F32 && args->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    return (args->R == 0 || args->I == 0) ? 1 : 0;
}


/* ------------------------------------------------------------------------------------------------
 * The operations: argument checks and the choice of kernels, each launch as launch(kernel, grid, block,
 * kernel arguments...) (the launcher's <<<>>> on its stream, the emulation's run of every CTA). Return
 * MOK_ERR_ARG / MOK_ERR_DTYPE, or 0 once the launches are issued.
 * ---------------------------------------------------------------------------------------------- */

template <class Launch>
int swiglu_forward_run(const struct mok_swiglu_args* args, Launch&& launch) {
    const int c = swiglu_check(args, 0);
    if (c != 0) {
        return c < 0 ? c : 0;
    }
    if (args->dtype == MOK_BF16 && args->I % MOK_VEC == 0 && mok_aligned16(args->h, args->out)) {
        const unsigned int grid =
            mok_grid_stride_blocks(args->R * (args->I / MOK_VEC), SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
        launch(swiglu_forward_bf16x8_kernel, grid, SWIGLU_THREADS, (const __nv_bfloat16*)args->h, args->R, args->I,
               (__nv_bfloat16*)args->out);
        return 0;
    }
    const unsigned int grid = mok_grid_stride_blocks(args->R * args->I, SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
    switch (args->dtype) {
        case MOK_BF16:
            launch(swiglu_forward_kernel<__nv_bfloat16>, grid, SWIGLU_THREADS, (const __nv_bfloat16*)args->h, args->R,
                   args->I, (__nv_bfloat16*)args->out);
            break;
        case MOK_F16:
            launch(swiglu_forward_kernel<__half>, grid, SWIGLU_THREADS, (const __half*)args->h, args->R, args->I,
                   (__half*)args->out);
            break;
        case MOK_F32:
            launch(swiglu_forward_kernel<float>, grid, SWIGLU_THREADS, (const float*)args->h, args->R, args->I,
                   (float*)args->out);
            break;
        default:
            launch(swiglu_forward_kernel<double>, grid, SWIGLU_THREADS, (const double*)args->h, args->R, args->I,
                   (double*)args->out);
            break;
    }
    return 0;
}

template <class Launch>
int swiglu_backward_run(const struct mok_swiglu_args* args, Launch&& launch) {
    const int c = swiglu_check(args, 1);
    if (c != 0) {
        return c < 0 ? c : 0;
    }
    if (args->dtype == MOK_BF16 && args->I % MOK_VEC == 0 && mok_aligned16(args->h, args->d_act, args->out)) {
        const unsigned int grid =
            mok_grid_stride_blocks(args->R * (args->I / MOK_VEC), SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
        launch(swiglu_backward_bf16x8_kernel, grid, SWIGLU_THREADS, (const __nv_bfloat16*)args->h,
               (const __nv_bfloat16*)args->d_act, args->R, args->I, (__nv_bfloat16*)args->out);
        return 0;
    }
    const unsigned int grid = mok_grid_stride_blocks(args->R * args->I, SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
    switch (args->dtype) {
        case MOK_BF16:
            launch(swiglu_backward_kernel<__nv_bfloat16>, grid, SWIGLU_THREADS, (const __nv_bfloat16*)args->h,
                   (const __nv_bfloat16*)args->d_act, args->R, args->I, (__nv_bfloat16*)args->out);
            break;
        case MOK_F16:
            launch(swiglu_backward_kernel<__half>, grid, SWIGLU_THREADS, (const __half*)args->h,
                   (const __half*)args->d_act, args->R, args->I, (__half*)args->out);
            break;
        case MOK_F32:
            launch(swiglu_backward_kernel<float>, grid, SWIGLU_THREADS, (const float*)args->h,
                   (const float*)args->d_act, args->R, args->I, (float*)args->out);
            break;
        default:
            launch(swiglu_backward_kernel<double>, grid, SWIGLU_THREADS, (const double*)args->h,
                   (const double*)args->d_act, args->R, args->I, (double*)args->out);
            break;
    }
    return 0;
}

template <class Launch>
int swiglu_scaled_backward_run(const struct mok_swiglu_scaled_backward_args* a, Launch&& launch) {
    MOK_CHECK_ARG(a != NULL);
    MOK_CHECK_ARG(a->R >= 0 && a->I >= 0 && a->n_pairs >= 0);
    MOK_CHECK_ARG(a->R == 0 || (a->src_of_row != NULL && a->d_s != NULL));
    MOK_CHECK_ARG(a->R == 0 || a->n_pairs == 0 || a->w != NULL);
    MOK_CHECK_ARG(a->R == 0 || a->I == 0 || (a->h != NULL && a->d_z != NULL && a->d_h != NULL && a->z != NULL));
    if (a->dtype != MOK_BF16 && a->dtype != MOK_F16 && a->dtype != MOK_F32 && a->dtype != MOK_F64) {
        return MOK_ERR_DTYPE;
    }
    if (a->R == 0) return 0;
    const unsigned int grid = mok_grid_stride_blocks(a->R * 32, SWIGLU_THREADS, SWIGLU_BLOCKS_PER_SM);
    if (a->dtype == MOK_BF16 && a->I % MOK_VEC == 0 && mok_aligned16(a->h, a->d_z, a->d_h) && mok_aligned16(a->z)) {
        launch(swiglu_scaled_backward_bf16x8_kernel, grid, SWIGLU_THREADS, (const __nv_bfloat16*)a->h,
               (const __nv_bfloat16*)a->d_z, a->R, a->I, a->src_of_row, (const float*)a->w, a->n_pairs,
               (__nv_bfloat16*)a->d_h, (__nv_bfloat16*)a->z, (float*)a->d_s);
        return 0;
    }
#define MOK_SCALED_BWD(T, Acc)                                                                                   \
    launch(swiglu_scaled_backward_kernel<T>, grid, SWIGLU_THREADS, (const T*)a->h, (const T*)a->d_z, a->R, a->I, \
           a->src_of_row, (const Acc*)a->w, a->n_pairs, (T*)a->d_h, (T*)a->z, (Acc*)a->d_s)
    switch (a->dtype) {
        case MOK_BF16:
            MOK_SCALED_BWD(__nv_bfloat16, float);
            break;
        case MOK_F16:
            MOK_SCALED_BWD(__half, float);
            break;
        case MOK_F32:
            MOK_SCALED_BWD(float, float);
            break;
        default:
            MOK_SCALED_BWD(double, double);
            break;
    }
#undef MOK_SCALED_BWD
    return 0;
}

}  // namespace mok_swiglu_rows

#endif /* MOK_CUDA_SWIGLU_SWIGLU_KERNELS_CUH */
