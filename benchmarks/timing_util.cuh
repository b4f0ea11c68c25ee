/*
 * Pieces shared by the stand-alone kernel timings in benchmarks/ (swiglu_quant_timing.cu,
 * rowcol_timing.cu): random bf16 fill, a 16-byte copy (the bandwidth ceiling), back-to-back event
 * timing and a device-to-host byte copy.
 */
#ifndef MOK_BENCHMARKS_TIMING_UTIL_CUH
#define MOK_BENCHMARKS_TIMING_UTIL_CUH

#include <stdint.h>
#include <stdlib.h>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.h"

/* bf16 in about [-4, 4]: sign, exponent 120..129, random mantissa (a hash of the index and seed). */
__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = (uint16_t)((x & 0x8000u) | ((120u + (x >> 16) % 10u) << 7) | ((x >> 4) & 0x7Fu));
    }
}

__global__ void copy_kernel(const uint4* __restrict__ a, uint4* __restrict__ b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) b[i] = a[i];
}

/* Mean ms per launch over iters back-to-back launches, after 3 untimed ones. */
template <typename F>
float time_ms(F launch, int iters = 20) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) launch();
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGetLastError());
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return ms / iters;
}

/* The problem sizes of a timing tool: pairs (a, b) from the command line if it has any, else defaults. */
static inline std::vector<int64_t> problems_from_args(int argc, char** argv, std::vector<int64_t> defaults) {
    if (argc <= 2) return defaults;
    std::vector<int64_t> probs;
    for (int i = 1; i + 1 < argc; i += 2) {
        probs.push_back(atoll(argv[i]));
        probs.push_back(atoll(argv[i + 1]));
    }
    return probs;
}

static inline std::vector<uint8_t> host_bytes(const void* p, size_t n) {
    std::vector<uint8_t> v(n);
    CHECK(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost));
    return v;
}

#endif /* MOK_BENCHMARKS_TIMING_UTIL_CUH */
