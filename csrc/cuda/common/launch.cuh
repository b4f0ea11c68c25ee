/*
 * Host-side helpers shared by the launchers: argument checks, grid sizing, the SM count and the
 * mapping of launch errors to the launcher's return value (see mok_cuda.h).
 */
#ifndef MOK_CUDA_COMMON_LAUNCH_CUH
#define MOK_CUDA_COMMON_LAUNCH_CUH

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "../mok_cuda.h"

/* Return MOK_ERR_ARG from the enclosing launcher when cond is false. */
#define MOK_CHECK_ARG(cond)          \
    do {                             \
        if (!(cond)) {               \
            return MOK_ERR_ARG;      \
        }                            \
    } while (0)

/* The environment variable `name` is set to exactly `value` (the launchers' run-time experiment
 * switches, read on every call so that one process can compare both settings). */
static inline bool env_equals(const char* name, const char* value) {
    const char* env = getenv(name);
    return env && strcmp(env, value) == 0;
}

/* Width, in 128-column tile columns, of the bands in which the quantisers of gathered rows walk their
 * tiles (each band down all rows before the next, so that the L2 keeps the band's columns of x for the
 * top_k row tiles that read each token; 0: row-major over the whole grid). Performance log v51.
 * MOK_QUANT_GATHER_BAND=0 .. 64 forces a width (read on every call, so that one process can compare). */
enum { kGatherBandDefault = 1 }; /* v51: fastest of 0, 1, 2, 4, 8 on every gathered pass measured */
static inline int mok_gather_band(void) {
    const char* env = getenv("MOK_QUANT_GATHER_BAND");
    if (env != NULL && *env != 0) {
        char* end = NULL;
        const long v = strtol(env, &end, 10);
        if (*end == 0 && v >= 0 && v <= 64) return (int)v;
    }
    return kGatherBandDefault;
}

/* Largest value any int32 index tensor of mok can hold. */
#define MOK_INT32_LIMIT ((int64_t)2147483647)

/* 0 when every launch so far succeeded, else the (positive) cudaError_t of the last failure. */
static inline int mok_launch_status(void) {
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : (int)err;
}

/* A kernel family's run (rows/rows.cuh's *_run, say: its checks and its launches): its argument error, or, once
 * it has launched, the launches' status. */
static inline int mok_run_status(int run) { return run != 0 ? run : mok_launch_status(); }

#ifdef __CUDACC__
/* launch(kernel, grid, block, kernel arguments...) as <<<grid, block, 0, stream>>>: what the launchers hand a
 * family's *_run / *_launches (the CPU emulation, tests/emu/, hands them one that runs every CTA). */
inline auto mok_on_stream(cudaStream_t stream) {
    return [stream](auto kernel, unsigned grid, unsigned block, auto... kernel_args) {
        kernel<<<grid, block, 0, stream>>>(kernel_args...);
    };
}
#endif

/* Number of SMs of the current device, queried once per device and cached.
 * NOTE: the cache is a plain static array; concurrent first calls store the same value. */
static inline int mok_num_sms(void) {
    enum { MAX_DEVICES = 64 };
    static int cache[MAX_DEVICES];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        return 1;
    }
    if (dev >= 0 && dev < MAX_DEVICES && cache[dev] > 0) {
        return cache[dev];
    }
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
        n = 1;
    }
    if (dev >= 0 && dev < MAX_DEVICES) {
        cache[dev] = n;
    }
    return n;
}

/* Opts kKernel in to `bytes` of dynamic shared memory (needed past 48 KiB, static included) once per
 * device: the attribute is per device, and setting it again on every launch would also set it inside a
 * CUDA graph capture. 0 or the cudaError_t. kKernel is a template argument so that each kernel has its
 * own flags (a function-pointer argument would share them between kernels of one signature).
 * NOTE: plain static flags; concurrent first calls set the same attribute. */
template <auto kKernel>
static inline int mok_opt_in_dynamic_smem(size_t bytes) {
    enum { kMaxDevices = 64 };
    static bool configured[kMaxDevices];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return (int)cudaErrorInvalidDevice;
    if (!configured[dev]) {
        const cudaError_t err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (err != cudaSuccess) return (int)err;
        configured[dev] = true;
    }
    return 0;
}

/* Number of blocks of a grid-stride launch over n work items, threads items per block, at most
 * blocks_per_sm blocks per SM (n > 0). */
static inline unsigned int mok_grid_stride_blocks(int64_t n, int64_t threads, int64_t blocks_per_sm) {
    int64_t blocks = (n + threads - 1) / threads;
    const int64_t cap = (int64_t)mok_num_sms() * blocks_per_sm;
    if (blocks > cap) {
        blocks = cap;
    }
    return (unsigned int)(blocks < 1 ? 1 : blocks);
}

static inline int64_t mok_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif /* MOK_CUDA_COMMON_LAUNCH_CUH */
