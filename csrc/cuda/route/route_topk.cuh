/*
 * Router top-k, forward and backward (mok_route_topk / mok_route_topk_backward in mok_core.h): the kernels
 * (launcher: route_topk.cu; a header of its own so that the CPU emulation, tests/emu/route_emu.cpp, runs them too).
 * T = float or double (MOK_F32 / MOK_F64): storage and arithmetic type are the same.
 *
 * One warp per token (grid-stride over tokens), E <= ROUTE_MAX_E experts. Per-warp shared scratch:
 *   s[E]     scores (softmax or sigmoid)
 *   c[E]     choice scores s + bias (forward) / ds, the gradient w.r.t. s (backward)
 *   g[E]     group scores, then the selected weights w_k (forward)
 *   excl[E]  1 = expert excluded (outside the kept groups, or already selected)
 *   gsel[E]  1 = group kept
 * Lane l owns the experts e = l, l + 32, ... for element-wise work.
 *
 * Determinism and order:
 * - Sums over experts or over k (softmax denominator, renormalisation sum, softmax-backward dot
 *   product, ds accumulation) are done serially by lane 0 in increasing index order, the core's
 *   order, so they are bitwise reproducible and as close to the core as the exp implementation.
 * - Selection uses a total order: higher value first, ties to the lower id; NOTE: NaN ranks below
 *   every number (including -Inf), NaNs among themselves by id, so the warp argmax (a butterfly
 *   over lanes) has a unique answer independent of the shuffle order, and K ids are always found.
 */
#ifndef MOK_CUDA_ROUTE_ROUTE_TOPK_CUH
#define MOK_CUDA_ROUTE_ROUTE_TOPK_CUH

#include <math.h>
#include <stdint.h>
#include <cuda_runtime.h>

#include "../mok_cuda.h"
#include "../common/dtype.cuh"
#include "../common/launch.cuh"

namespace mok_route {

enum { ROUTE_MAX_E = 512 };

/* Warps per block: the per-warp scratch of double is twice as large. */
template <typename T>
struct route_cfg {
    enum { WARPS = sizeof(T) == 8 ? 2 : 4 };
};

template <typename T>
struct route_smem {
    T s[ROUTE_MAX_E];
    T c[ROUTE_MAX_E];
    T g[ROUTE_MAX_E];
    unsigned char excl[ROUTE_MAX_E];
    unsigned char gsel[ROUTE_MAX_E];
};
static_assert(sizeof(route_smem<float>) * route_cfg<float>::WARPS <= 48 * 1024, "static shared memory limit");
static_assert(sizeof(route_smem<double>) * route_cfg<double>::WARPS <= 48 * 1024, "static shared memory limit");

struct route_params {
    const void* logits;
    const void* bias;
    const void* grad_w;
    const int32_t* topk_idx_in;
    int64_t T, E, K;
    int score_func;
    int64_t n_group, topk_group;
    int renormalize;
    double scaling;
    int32_t* topk_idx;
    void* out; /* topk_w (forward) or grad_logits (backward) */
};

/* (a, ia) ranks before (b, ib)? id -1 is "no candidate" and ranks last. */
template <typename T>
__device__ __forceinline__ bool route_better(T a, int ia, T b, int ib) {
    if (ib < 0) {
        return ia >= 0;
    }
    if (ia < 0) {
        return false;
    }
    const bool an = isnan(a), bn = isnan(b);
    if (an || bn) {
        return an == bn ? ia < ib : bn;
    }
    return a != b ? a > b : ia < ib;
}

/* Warp-wide best of the per-lane candidates; every lane returns the same (value, id). */
template <typename T>
__device__ __forceinline__ int route_warp_best(T v, int id, T* best_v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        const T ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int oid = __shfl_xor_sync(0xffffffffu, id, off);
        if (route_better(ov, oid, v, id)) {
            v = ov;
            id = oid;
        }
    }
    *best_v = v;
    return id;
}

/* Scores s[e] of one token into sm->s (softmax with max subtraction, or sigmoid). Ends with
 * __syncwarp: sm->s is visible to the whole warp. */
template <typename T>
__device__ __forceinline__ void route_scores(const T* __restrict__ x, int64_t E, int score_func, int lane,
                                             route_smem<T>* sm) {
    if (score_func == MOK_SCORE_SIGMOID) {
        /* ---- sigmoid: s = 1 / (1 + exp(-x)) ---- */
        for (int e = lane; e < E; e += 32) {
            sm->s[e] = mok_div((T)1, mok_add((T)1, mok_exp(-x[e])));
        }
        __syncwarp();
        return;
    }
    /* ---- softmax, phase 1: max over the row (order-free; NaN ignored like fmax) ---- */
    T m = -(T)INFINITY;
    for (int e = lane; e < E; e += 32) {
        m = fmax(m, x[e]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        m = fmax(m, __shfl_xor_sync(0xffffffffu, m, off));
    }
    /* ---- phase 2: exp(x - max) ---- */
    for (int e = lane; e < E; e += 32) {
        sm->s[e] = mok_exp(mok_sub(x[e], m));
    }
    __syncwarp();
    /* ---- phase 3: denominator, serial in increasing e (lane 0) ---- */
    T sum = (T)0;
    if (lane == 0) {
        for (int e = 0; e < E; ++e) {
            sum = mok_add(sum, sm->s[e]);
        }
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    /* ---- phase 4: normalise ---- */
    for (int e = lane; e < E; e += 32) {
        sm->s[e] = mok_div(sm->s[e], sum);
    }
    __syncwarp();
}

/* ------------------------------------------------------------------------------------------------
 * Forward: selection and weights of one token per warp.
 * ---------------------------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(route_cfg<T>::WARPS * 32) route_topk_kernel(route_params p) {
    enum { WARPS = route_cfg<T>::WARPS };
    __shared__ route_smem<T> smem[WARPS];
    const int lane = (int)(threadIdx.x % 32);
    const int wid = (int)(threadIdx.x / 32);
    route_smem<T>* sm = &smem[wid];
    const T* __restrict__ logits = (const T*)p.logits;
    const T* __restrict__ bias = (const T*)p.bias;
    T* __restrict__ topk_w = (T*)p.out;
    const int E = (int)p.E, K = (int)p.K;
    const bool grouped = p.n_group > 1;
    const int n_group = grouped ? (int)p.n_group : 1;
    const int gsize = E / n_group;

    for (int64_t t = (int64_t)blockIdx.x * WARPS + wid; t < p.T; t += (int64_t)gridDim.x * WARPS) {
        /* ---- scores, choice scores, nothing excluded yet ---- */
        route_scores<T>(logits + t * E, E, p.score_func, lane, sm);
        for (int e = lane; e < E; e += 32) {
            sm->c[e] = bias != NULL ? mok_add(sm->s[e], bias[e]) : sm->s[e];
            sm->excl[e] = 0;
        }
        __syncwarp();

        if (grouped) {
            /* ---- group scores: top1 + top2 choice scores of each group (top1 alone for size 1) ---- */
            for (int gi = lane; gi < n_group; gi += 32) {
                T v1 = (T)0, v2 = (T)0;
                int i1 = -1, i2 = -1;
                for (int e = gi * gsize; e < (gi + 1) * gsize; ++e) {
                    const T v = sm->c[e];
                    if (route_better(v, e, v1, i1)) {
                        v2 = v1;
                        i2 = i1;
                        v1 = v;
                        i1 = e;
                    } else if (route_better(v, e, v2, i2)) {
                        v2 = v;
                        i2 = e;
                    }
                }
                sm->g[gi] = gsize >= 2 ? mok_add(v1, v2) : v1;
                sm->gsel[gi] = 0;
            }
            __syncwarp();
            /* ---- keep the topk_group best groups (ties to the lower group id) ---- */
            for (int64_t j = 0; j < p.topk_group; ++j) {
                T bv = (T)0;
                int bi = -1;
                for (int gi = lane; gi < n_group; gi += 32) {
                    if (!sm->gsel[gi] && route_better(sm->g[gi], gi, bv, bi)) {
                        bv = sm->g[gi];
                        bi = gi;
                    }
                }
                const int win = route_warp_best<T>(bv, bi, &bv);
                if (lane == 0) {
                    sm->gsel[win] = 1;
                }
                __syncwarp();
            }
            /* ---- exclude the experts of the other groups ---- */
            for (int e = lane; e < E; e += 32) {
                sm->excl[e] = sm->gsel[e / gsize] ? 0 : 1;
            }
            __syncwarp();
        }

        /* ---- top-K by descending choice score, ties to the lower expert id ---- */
        for (int k = 0; k < K; ++k) {
            T bv = (T)0;
            int bi = -1;
            for (int e = lane; e < E; e += 32) {
                if (!sm->excl[e] && route_better(sm->c[e], e, bv, bi)) {
                    bv = sm->c[e];
                    bi = e;
                }
            }
            const int win = route_warp_best<T>(bv, bi, &bv);
            /* NOTE: win >= 0 always: the launcher checks K <= number of allowed experts. */
            if (lane == 0) {
                sm->excl[win] = 1;
                sm->g[k] = sm->s[win];
                p.topk_idx[t * K + k] = win;
            }
            __syncwarp();
        }

        /* ---- weights: optional renormalisation (serial sum over k), then scaling ---- */
        T denom = (T)1;
        if (p.renormalize) {
            T sum = (T)0;
            if (lane == 0) {
                for (int k = 0; k < K; ++k) {
                    sum = mok_add(sum, sm->g[k]);
                }
            }
            denom = mok_add(__shfl_sync(0xffffffffu, sum, 0), (T)1e-20);
        }
        const T scaling = (T)p.scaling;
        for (int k = lane; k < K; k += 32) {
            T wk = sm->g[k];
            if (p.renormalize) {
                wk = mok_div(wk, denom);
            }
            topk_w[t * K + k] = mok_mul(wk, scaling);
        }
        /* NOTE: the next token overwrites the scratch; all lanes must be done reading it. */
        __syncwarp();
    }
}

/* ------------------------------------------------------------------------------------------------
 * Backward: gradient w.r.t. the logits of one token per warp (fixed topk_idx).
 * ---------------------------------------------------------------------------------------------- */
template <typename T>
__global__ void __launch_bounds__(route_cfg<T>::WARPS * 32) route_topk_backward_kernel(route_params p) {
    enum { WARPS = route_cfg<T>::WARPS };
    __shared__ route_smem<T> smem[WARPS];
    const int lane = (int)(threadIdx.x % 32);
    const int wid = (int)(threadIdx.x / 32);
    route_smem<T>* sm = &smem[wid];
    const T* __restrict__ logits = (const T*)p.logits;
    const T* __restrict__ grad_w = (const T*)p.grad_w;
    T* __restrict__ grad_logits = (T*)p.out;
    const int E = (int)p.E, K = (int)p.K;
    const T scaling = (T)p.scaling;

    for (int64_t t = (int64_t)blockIdx.x * WARPS + wid; t < p.T; t += (int64_t)gridDim.x * WARPS) {
        /* ---- recompute the scores, clear ds (kept in c) ---- */
        route_scores<T>(logits + t * E, E, p.score_func, lane, sm);
        for (int e = lane; e < E; e += 32) {
            sm->c[e] = (T)0;
        }
        __syncwarp();

        /* ---- dsel_k and ds_e, serial over k by lane 0 (fixed order of the += into ds) ---- */
        /* NOTE: an index outside [0, E) (not producible by the forward) contributes nothing. */
        if (lane == 0) {
            const int32_t* __restrict__ idx = p.topk_idx_in + t * K;
            const T* __restrict__ g = grad_w + t * K;
            T S = (T)0, G = (T)0;
            if (p.renormalize) {
                for (int k = 0; k < K; ++k) {
                    const int e = idx[k];
                    const T sel = (e >= 0 && e < E) ? sm->s[e] : (T)0;
                    S = mok_add(S, sel);
                    G = mok_add(G, mok_mul(g[k], sel));
                }
                S = mok_add(S, (T)1e-20);
            }
            for (int k = 0; k < K; ++k) {
                const int e = idx[k];
                if (e < 0 || e >= E) {
                    continue;
                }
                T dsel;
                if (p.renormalize) {
                    /* dsel = scaling * (g_k / S - G / S^2) */
                    dsel = mok_mul(scaling, mok_sub(mok_div(g[k], S), mok_div(G, mok_mul(S, S))));
                } else {
                    dsel = mok_mul(scaling, g[k]);
                }
                sm->c[e] = mok_add(sm->c[e], dsel);
            }
        }
        __syncwarp();

        if (p.score_func == MOK_SCORE_SIGMOID) {
            /* ---- sigmoid: dlogit = ds * s * (1 - s) ---- */
            for (int e = lane; e < E; e += 32) {
                const T s = sm->s[e];
                grad_logits[t * E + e] = mok_mul(mok_mul(sm->c[e], s), mok_sub((T)1, s));
            }
        } else {
            /* ---- softmax: dot = sum_e s_e ds_e (serial, increasing e), dlogit = s (ds - dot) ---- */
            T dot = (T)0;
            if (lane == 0) {
                for (int e = 0; e < E; ++e) {
                    dot = mok_add(dot, mok_mul(sm->s[e], sm->c[e]));
                }
            }
            dot = __shfl_sync(0xffffffffu, dot, 0);
            for (int e = lane; e < E; e += 32) {
                grad_logits[t * E + e] = mok_mul(sm->s[e], mok_sub(sm->c[e], dot));
            }
        }
        /* NOTE: the next token overwrites the scratch; all lanes must be done reading it. */
        __syncwarp();
    }
}

template <typename T>
inline unsigned int route_grid(int64_t T_) {
    return mok_grid_stride_blocks(T_, route_cfg<T>::WARPS, 16);
}

}  // namespace mok_route

#endif /* MOK_CUDA_ROUTE_ROUTE_TOPK_CUH */
