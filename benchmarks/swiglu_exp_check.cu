/*
 * Exhaustive check that SwiGLU's float sigmoid and silu (csrc/cuda/common/swiglu.cuh, with exp(-g) by
 * ex2.approx.ftz since v57) give the same bits as their form before (__expf, which keeps subnormal results)
 * for every one of the 2^32 float values of g. NaN matches NaN (any payload). Prints the count of
 * mismatches and the first few; exit status 1 if any.
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o /tmp/sec benchmarks/swiglu_exp_check.cu
 *   /tmp/sec
 */
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "common/swiglu.cuh"

#define CHECK(x)                                                                      \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 2;                                                                 \
        }                                                                             \
    } while (0)

/* the forms before v57 */
__device__ __forceinline__ float silu_before(float g) { return __fdividef(g, 1.0f + __expf(-g)); }
__device__ __forceinline__ float sigmoid_before(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

__device__ __forceinline__ bool same(float a, float b) {
    return __float_as_uint(a) == __float_as_uint(b) || (a != a && b != b);
}

struct mismatch {
    uint32_t g_bits, want, got, which; /* which: 0 sigmoid, 1 silu */
};

__global__ void check_all(unsigned long long* count, mismatch* first, int first_cap) {
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t v = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; v < (1ull << 32); v += step) {
        const float g = __uint_as_float((uint32_t)v);
        const float s0 = sigmoid_before(g), s1 = mok_sigmoid(g);
        const float f0 = silu_before(g), f1 = mok_silu(g);
        for (int which = 0; which < 2; ++which) {
            const float want = which ? f0 : s0, got = which ? f1 : s1;
            if (same(want, got)) continue;
            const unsigned long long k = atomicAdd(count, 1ull);
            if (k < (unsigned long long)first_cap)
                first[k] = {(uint32_t)v, __float_as_uint(want), __float_as_uint(got), (uint32_t)which};
        }
    }
}

int main() {
    unsigned long long* count;
    mismatch* first;
    const int cap = 16;
    CHECK(cudaMalloc(&count, sizeof(*count)));
    CHECK(cudaMalloc(&first, cap * sizeof(mismatch)));
    CHECK(cudaMemset(count, 0, sizeof(*count)));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    check_all<<<sms * 8, 256>>>(count, first, cap);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    unsigned long long n = 0;
    mismatch host[cap];
    CHECK(cudaMemcpy(&n, count, sizeof(n), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(host, first, sizeof(host), cudaMemcpyDeviceToHost));
    printf("swiglu exp check: %llu mismatches over 2^32 values of g (sigmoid and silu)\n", n);
    for (unsigned long long i = 0; i < n && i < (unsigned long long)cap; ++i)
        printf("  g=0x%08x %s: before 0x%08x now 0x%08x\n", host[i].g_bits, host[i].which ? "silu" : "sigmoid",
               host[i].want, host[i].got);
    return n ? 1 : 0;
}
