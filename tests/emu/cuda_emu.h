/*
 * A small CPU emulation of the CUDA features that mok's quantisation, routing, plan, row and SwiGLU
 * kernels use, so that their indexing, shuffles, barriers and shared-memory layouts can be tested where there
 * is no GPU (tests/test_*_emu.py). Include it before any kernel header and compile
 * with a host C++ compiler against the CUDA toolkit's headers.
 *
 * Every thread of a CTA is a coroutine (ucontext) on one OS thread; CTAs run one after another.
 * A thread runs until it reaches a warp shuffle or __syncthreads, then yields. A shuffle completes
 * when all 32 lanes of the warp wait at a shuffle of the same sequence number (a divergent or
 * partial-warp shuffle is reported as an error, as is a barrier that some thread can never reach),
 * a barrier when every thread of the CTA waits at it. __shared__ variables are function statics:
 * shared by the CTA's threads, and left as they were by the previous CTA (like real shared memory,
 * nothing zeroes them).
 *
 * What it does NOT model: the device's arithmetic (the intrinsics below are IEEE host operations
 * with denormals, which is what the kernels rely on), memory ordering, bank conflicts, timing.
 */
#ifndef MOK_TESTS_CUDA_EMU_H
#define MOK_TESTS_CUDA_EMU_H

#define __shared__ static
#define __launch_bounds__(...)

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace emu {

inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
inline float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

enum State { kRunnable, kAtShuffle, kAtBarrier, kDone };

struct Thread {
    ucontext_t ctx;
    std::vector<char> stack;
    State state = kRunnable;
    uint32_t value = 0;   /* what this lane offers to a shuffle */
    int src = 0;          /* the lane it reads */
    uint32_t result = 0;  /* what it got */
    long shuffles = 0;    /* shuffles done: all lanes of one exchange must agree */
    long barrier_ors = 0; /* __syncthreads_or calls done */
};

struct Cta {
    std::vector<Thread> threads;
    ucontext_t scheduler;
    int current = 0;
    std::function<void()> body;
    std::vector<int> barrier_or; /* __syncthreads_or number n's OR, gathered before its barrier completes */
};

inline Cta*& cta() {
    static Cta* c = nullptr;
    return c;
}

}  // namespace emu

/* The built-in variables, set before every resume of a thread. */
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {

inline void resume(int t) {
    Cta& c = *cta();
    c.current = t;
    threadIdx = make_uint3((unsigned)t, 0, 0);
    swapcontext(&c.scheduler, &c.threads[t].ctx);
}

inline void yield() {
    Cta& c = *cta();
    swapcontext(&c.threads[c.current].ctx, &c.scheduler);
    threadIdx = make_uint3((unsigned)c.current, 0, 0);
}

inline void entry() {
    cta()->body();
    Cta& c = *cta();
    c.threads[c.current].state = kDone;
    swapcontext(&c.threads[c.current].ctx, &c.scheduler);
}

inline uint32_t shuffle(uint32_t mask, uint32_t v, int src_lane) {
    if (mask != 0xFFFFFFFFu) throw std::runtime_error("emu: only full-warp shuffles are modelled");
    Cta& c = *cta();
    Thread& me = c.threads[c.current];
    me.value = v;
    me.src = src_lane & 31;
    me.state = kAtShuffle;
    yield();
    return c.threads[c.current].result;
}

/* Runs kernel() for every CTA of grid x block threads (1-D). Throws on a divergent shuffle or a
 * barrier that cannot complete. */
inline void launch(unsigned grid, unsigned block, const std::function<void()>& kernel) {
    if (block % 32 != 0) throw std::runtime_error("emu: the block must be whole warps");
    /* NOTE: one CTA object (and its coroutine stacks) for every launch: allocating the stacks
     * anew each time costs more than the emulation itself. */
    static Cta c;
    c.body = kernel;
    if (c.threads.size() != block) c.threads.resize(block);
    for (auto& t : c.threads)
        if (t.stack.empty()) t.stack.resize(64 << 10);
    cta() = &c;
    gridDim = dim3(grid, 1, 1);
    blockDim = dim3(block, 1, 1);
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx = make_uint3(b, 0, 0);
        for (auto& t : c.threads) {
            getcontext(&t.ctx);
            t.ctx.uc_stack.ss_sp = t.stack.data();
            t.ctx.uc_stack.ss_size = t.stack.size();
            t.ctx.uc_link = nullptr;
            makecontext(&t.ctx, entry, 0);
            t.state = kRunnable;
            t.shuffles = 0;
            t.barrier_ors = 0;
        }
        c.barrier_or.clear();
        for (;;) {
            for (unsigned t = 0; t < block; ++t)
                while (c.threads[t].state == kRunnable) resume((int)t);
            bool all_done = true, moved = false;
            for (unsigned w = 0; w < block / 32; ++w) {
                Thread* lanes = &c.threads[32 * w];
                int waiting = 0;
                for (int l = 0; l < 32; ++l) waiting += lanes[l].state == kAtShuffle;
                if (waiting == 0) continue;
                if (waiting != 32) throw std::runtime_error("emu: shuffle with lanes missing (divergent or exited)");
                for (int l = 0; l < 32; ++l)
                    if (lanes[l].shuffles != lanes[0].shuffles)
                        throw std::runtime_error("emu: lanes of a warp are at different shuffles");
                for (int l = 0; l < 32; ++l) lanes[l].result = lanes[lanes[l].src].value;
                for (int l = 0; l < 32; ++l) {
                    lanes[l].state = kRunnable;
                    lanes[l].shuffles++;
                }
                moved = true;
            }
            int at_barrier = 0, done = 0;
            for (auto& t : c.threads) {
                at_barrier += t.state == kAtBarrier;
                done += t.state == kDone;
                all_done = all_done && t.state == kDone;
            }
            if (all_done) break;
            if (at_barrier > 0 && at_barrier + done == (int)block && !moved) {
                if (done > 0) throw std::runtime_error("emu: __syncthreads after some threads exited");
                for (auto& t : c.threads) t.state = kRunnable;
                moved = true;
            }
            if (!moved) throw std::runtime_error("emu: deadlock (a barrier or shuffle can never complete)");
        }
    }
    cta() = nullptr;
}

}  // namespace emu

/* ---- the device intrinsics the kernels use, as host functions ---- */

inline void __syncthreads() {
    emu::Cta& c = *emu::cta();
    c.threads[c.current].state = emu::kAtBarrier;
    emu::yield();
}

/* Every thread's predicate ORed in before the barrier, read after it: the n-th call's OR has its own slot,
 * so a thread already past the barrier (and at its next call) cannot disturb what the others read. */
inline int __syncthreads_or(int pred) {
    emu::Cta& c = *emu::cta();
    const size_t n = (size_t)c.threads[c.current].barrier_ors++;
    if (c.barrier_or.size() <= n) c.barrier_or.resize(n + 1, 0);
    c.barrier_or[n] |= pred != 0;
    __syncthreads();
    return c.barrier_or[n];
}
inline void __threadfence_system() {}

inline unsigned __shfl_xor_sync(unsigned mask, unsigned v, int lane_mask) {
    return emu::shuffle(mask, v, (int)(threadIdx.x % 32) ^ lane_mask);
}
inline int __shfl_xor_sync(unsigned mask, int v, int lane_mask) {
    return (int)emu::shuffle(mask, (uint32_t)v, (int)(threadIdx.x % 32) ^ lane_mask);
}
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    return emu::float_of(emu::shuffle(mask, emu::bits_of(v), (int)(threadIdx.x % 32) ^ lane_mask));
}

/* 64-bit values move as two 32-bit halves, as on the device; lane l reads lane src(l) */
namespace emu {
template <typename T>
inline T shuffle64(unsigned mask, T v, int src_lane) {
    static_assert(sizeof(T) == 8, "64-bit values");
    uint64_t u;
    memcpy(&u, &v, 8);
    const uint64_t lo = shuffle(mask, (unsigned)u, src_lane), hi = shuffle(mask, (unsigned)(u >> 32), src_lane);
    u = lo | (hi << 32);
    memcpy(&v, &u, 8);
    return v;
}
inline int down_lane(unsigned delta) {
    const int lane = (int)(threadIdx.x % 32);
    return lane + (int)delta < 32 ? lane + (int)delta : lane;
}
}  // namespace emu
inline int64_t __shfl_sync(unsigned mask, int64_t v, int src_lane) { return emu::shuffle64(mask, v, src_lane); }
inline double __shfl_sync(unsigned mask, double v, int src_lane) { return emu::shuffle64(mask, v, src_lane); }
inline double __shfl_xor_sync(unsigned mask, double v, int lane_mask) {
    return emu::shuffle64(mask, v, (int)(threadIdx.x % 32) ^ lane_mask);
}
/* lane l reads lane l + delta, or keeps its own value from lane 32 - delta on */
inline float __shfl_down_sync(unsigned mask, float v, unsigned delta) {
    return emu::float_of(emu::shuffle(mask, emu::bits_of(v), emu::down_lane(delta)));
}
inline double __shfl_down_sync(unsigned mask, double v, unsigned delta) {
    return emu::shuffle64(mask, v, emu::down_lane(delta));
}

/* a warp barrier: every lane of the warp must reach it (modelled as an exchange of nothing) */
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { emu::shuffle(mask, 0u, (int)(threadIdx.x % 32)); }

/* lane l reads lane l - delta, or keeps its own value below delta */
inline int __shfl_up_sync(unsigned mask, int v, unsigned delta) {
    const int lane = (int)(threadIdx.x % 32);
    return (int)emu::shuffle(mask, (uint32_t)v, lane >= (int)delta ? lane - (int)delta : lane);
}

inline unsigned __shfl_sync(unsigned mask, unsigned v, int src_lane) { return emu::shuffle(mask, v, src_lane); }

inline int __shfl_sync(unsigned mask, int v, int src_lane) { return (int)emu::shuffle(mask, (uint32_t)v, src_lane); }
inline float __shfl_sync(unsigned mask, float v, int src_lane) {
    return emu::float_of(emu::shuffle(mask, emu::bits_of(v), src_lane));
}

inline uint4 __ldg(const uint4* p) { return *p; }
inline int32_t __ldg(const int32_t* p) { return *p; }
inline float __ldg(const float* p) { return *p; }

inline unsigned __vmaxu2(unsigned a, unsigned b) {
    const unsigned lo = std::max(a & 0xFFFFu, b & 0xFFFFu), hi = std::max(a >> 16, b >> 16);
    return lo | (hi << 16);
}

/* per 16-bit half: a - b, clamped at 0 */
inline unsigned __vsubus2(unsigned a, unsigned b) {
    const unsigned lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) - (b & 0xFFFFu) : 0u;
    const unsigned hi = (a >> 16) > (b >> 16) ? (a >> 16) - (b >> 16) : 0u;
    return lo | (hi << 16);
}

/* PTX prmt (default mode): bytes of {b, a} indexed by the selector's four low nibbles. */
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
    const uint64_t v = ((uint64_t)b << 32) | a;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}

inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline float __uint_as_float(unsigned u) { return emu::float_of(u); }
inline float __int_as_float(int u) { return emu::float_of((uint32_t)u); }
inline unsigned __float_as_uint(float x) { return emu::bits_of(x); }

/* IEEE single operations, each rounded once (the file is compiled with -ffp-contract=off). */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
/* The fast forms SwiGLU uses (common/swiglu.cuh): here IEEE host operations, which is enough to test a
 * fused kernel against the same arithmetic run unfused (tests/emu/quant_emu.cpp), not the device's
 * approximations themselves. */
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __expf(float x) { return expf(x); }
inline float mok_exp_for_one_plus(float x) { return expf(x); } /* common/swiglu.cuh's, as __expf here */
inline float __fdividef(float a, float b) { return a / b; }

/* ---- the launch helpers' device queries (common/launch.cuh's grid sizing) ----
 * Device 0 has 132 SMs (an H100's), device 1 one SM, so that a grid-stride kernel gets a small grid and each of
 * its warps several work items; emu::device selects which one cudaGetDevice reports. */
namespace emu {
inline int& device() {
    static int d = 0;
    return d;
}
}  // namespace emu
extern "C" cudaError_t cudaGetDevice(int* device) {
    *device = emu::device();
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    *value = attr == cudaDevAttrMultiProcessorCount ? (device == 0 ? 132 : 1) : 0;
    return cudaSuccess;
}

/* ---- the streamed kernels' asynchronous copies (quant/swiglu_quantize_stream.cuh) ----
 * A copy's 16 bytes are read at issue (the inputs do not change during a launch) but land in shared
 * memory only at the wait that completes its commit group, per thread as cp.async.wait_group does: a
 * slot read before its group is waited for holds the previous item's bytes (or the 0xFF poison the
 * buffer starts with) and shows up as wrong output. */
namespace emu {
struct AsyncCopy {
    void* dst;
    uint4 data;
    size_t bytes; /* 16, or 4 (a scale) */
};
struct AsyncQueue {
    std::vector<std::vector<AsyncCopy>> groups; /* committed, oldest first */
    std::vector<AsyncCopy> open;                /* issued since the last commit */
};
inline std::vector<AsyncQueue>& async_queues() {
    static std::vector<AsyncQueue> q(1024);
    return q;
}
}  // namespace emu

inline uint4* stream_fifo() {
    static std::vector<uint4> buf = [] {
        std::vector<uint4> b(16384);
        memset(b.data(), 0xFF, b.size() * sizeof(uint4));
        return b;
    }();
    return buf.data();
}
inline void stream_copy16(uint4* slot, const void* src, bool live) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (live) memcpy(&v, src, 16);
    emu::async_queues()[threadIdx.x].open.push_back({slot, v, 16});
}
inline void stream_copy4(float* slot, const float* src, bool live) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (live) memcpy(&v, src, 4);
    emu::async_queues()[threadIdx.x].open.push_back({slot, v, 4});
}
inline void stream_commit() {
    emu::AsyncQueue& q = emu::async_queues()[threadIdx.x];
    q.groups.push_back(q.open);
    q.open.clear();
}
template <int kPending>
inline void stream_wait() {
    emu::AsyncQueue& q = emu::async_queues()[threadIdx.x];
    while ((int)q.groups.size() > kPending) {
        for (const emu::AsyncCopy& c : q.groups.front()) memcpy(c.dst, &c.data, c.bytes);
        q.groups.erase(q.groups.begin());
    }
}
inline uint4 stream_read(const uint4* slot) { return *slot; }

/* quant/qdq_mxfp8.cuh's 16-byte store (inline PTX there) */
inline void st_global_v4(void* dst, const uint32_t (&v)[4]) { memcpy(dst, v, 16); }
inline float stream_read_f32(const float* slot) { return *slot; }

#endif /* MOK_TESTS_CUDA_EMU_H */
