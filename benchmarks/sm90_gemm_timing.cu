/*
 * Where a tile of mok's sm_90a grouped GEMM spends its time: the kernel built with
 * -DMOK_SM90_TIMING counts, in one consumer thread per CTA, the cycles of tile setup (scheduler,
 * expert segments), the K-block mainloop (and in it the waits for the producer's stages and the
 * final wgmma drain) and the epilogue. No torch: a standalone program over the C launcher.
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMOK_SM90_TIMING -Icsrc/cuda \
 *        -o /tmp/sm90_gemm_timing benchmarks/sm90_gemm_timing.cu -lcuda && /tmp/sm90_gemm_timing
 *   /tmp/sm90_gemm_timing R E N K [swiglu|nn|wgrad] [const]   (default: Qwen3-30B-A3B's down projection)
 *
 * Built without -DMOK_SM90_TIMING it times the kernel as shipped (no counters): what A/B runs use
 * (benchmarks/fp8_check_variants.sh with TOOL=bf16).
 *
 * `wgrad` times the weight-gradient variant: out[e] [K, N] = a_e^T b_e over expert e's rows, with
 * a [R, K] and b [R, N] (both MN-major), the FLOPs of the same R, N, K. Its consumer has no
 * counters yet: the time and TFLOP/s only.
 *
 * Experiment switches (off by default): -DMOK_SM90_SKIP_EPILOGUE=1 (no stores from whole-segment
 * tiles) or 2 (chunks staged, no TMA stores): WRONG results, timing bounds of the epilogue;
 * -DMOK_SM90_EPI_LEND=0 (the epilogue stages in its own buffers only, not in the tile's last ring
 * stage: the kernel before v26).
 *
 * Operands are pseudo-random bf16 in [-1, 1) unless `const` asks for one repeated value (what the
 * v10-v13 measurements used: it keeps clocks high, and may flatter the memory system, as L2 and
 * DRAM compress uniform data).
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../csrc/cuda/grouped_gemm_sm90.cu"

#include "cuda_check.h"

/* x[i] = a hash of i mapped to [-1, 1), as bf16 */
__global__ void fill_random_bf16(__nv_bfloat16* x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 0x7feb352du;
        h ^= h >> 15;
        x[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

int main(int argc, char** argv) {
    const int64_t R = argc > 1 ? atoll(argv[1]) : 131072, E = argc > 2 ? atoll(argv[2]) : 128;
    const int64_t N = argc > 3 ? atoll(argv[3]) : 2048, K = argc > 4 ? atoll(argv[4]) : 768;
    const char* mode = argc > 5 ? argv[5] : "nt";
    const bool swiglu = strcmp(mode, "swiglu") == 0, nn = strcmp(mode, "nn") == 0, wgrad = strcmp(mode, "wgrad") == 0;
    const int64_t per = R / E / 128 * 128;

    void *a, *b, *out, *act = NULL;
    int32_t* offsets;
    CHECK(cudaMalloc(&a, R * K * 2));
    /* wgrad: b is [R, N] and out [E, K, N]; otherwise b is [E, N, K] and out [R, N] */
    const int64_t b_elems = wgrad ? R * N : E * N * K, out_elems = wgrad ? E * K * N : R * N;
    CHECK(cudaMalloc(&b, b_elems * 2));
    CHECK(cudaMalloc(&out, out_elems * 2));
    if (swiglu) CHECK(cudaMalloc(&act, R * N));
    if (argc > 6 && strcmp(argv[6], "const") == 0) {
        /* 0x3c3c: bf16 0.0115 everywhere */
        CHECK(cudaMemset(a, 0x3c, R * K * 2));
        CHECK(cudaMemset(b, 0x3c, b_elems * 2));
    } else {
        fill_random_bf16<<<1024, 256>>>((__nv_bfloat16*)a, R * K, 1u);
        fill_random_bf16<<<1024, 256>>>((__nv_bfloat16*)b, b_elems, 2u);
        CHECK(cudaGetLastError());
    }
    int32_t* h_off = (int32_t*)malloc((E + 1) * sizeof(int32_t));
    for (int64_t e = 0; e <= E; ++e) h_off[e] = (int32_t)(e * per);
    CHECK(cudaMalloc(&offsets, (E + 1) * sizeof(int32_t)));
    CHECK(cudaMemcpy(offsets, h_off, (E + 1) * sizeof(int32_t), cudaMemcpyHostToDevice));

    mok_grouped_gemm_args g;
    memset(&g, 0, sizeof(g));
    g.a = a;
    g.b = b;
    g.dtype = MOK_BF16;
    g.offsets = offsets;
    g.R = R;
    g.E = E;
    g.N = N;
    g.Kd = K;
    g.trans_b = nn ? 0 : 1;
    g.out = out;
    g.swiglu_out = act;
    if (wgrad ? !mok_grouped_gemm_wgrad_sm90_supported(R, E, K, N, 0) : !mok_grouped_gemm_sm90_supported(&g)) {
        fprintf(stderr, "the sm_90a kernel does not take these arguments\n");
        return 1;
    }
    auto run = [&]() -> int {
        return wgrad ? mok_grouped_gemm_wgrad_sm90(a, b, offsets, R, E, K, N, out, NULL, 0, 0) : mok_grouped_gemm_sm90(&g, 0);
    };
    for (int i = 0; i < 3; ++i) CHECK((cudaError_t)run());
    CHECK(cudaDeviceSynchronize());
#ifdef MOK_SM90_TIMING
    unsigned long long zero[mok_sm90::TIMING_SLOTS] = {0};
    CHECK(cudaMemcpyToSymbol(mok_sm90::timing, zero, sizeof(zero)));
#endif
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    const int iters = 10;
    CHECK(cudaEventRecord(t0));
    for (int i = 0; i < iters; ++i) CHECK((cudaError_t)run());
    CHECK(cudaEventRecord(t1));
    CHECK(cudaDeviceSynchronize());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    ms /= iters;
    unsigned long long c[mok_sm90::TIMING_SLOTS] = {0};
#ifdef MOK_SM90_TIMING
    CHECK(cudaMemcpyFromSymbol(c, mok_sm90::timing, sizeof(c)));
    const char* build = "instrumented build";
#else
    const char* build = "uninstrumented build";
#endif
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const double tiles = (double)c[mok_sm90::TIMING_TILES];
    if (tiles == 0) printf("(no per-tile counters for this variant)\n");
    const double flops = 2.0 * per * E * N * K;
    printf("R=%lld E=%lld N=%lld K=%lld %s: %.3f ms, %.0f TFLOP/s (%s), %.0f tiles per call\n", (long long)R,
           (long long)E, (long long)N, (long long)K, mode, ms, flops / ms / 1e9, build, tiles / iters);
    const char* names[] = {"tiles", "setup", "mainloop", "  of it: waits for a full stage", "  of it: final wgmma drain",
                           "epilogue", "  of it: waits for a buffer's read", "FP8 promotion (FP8 kernel only)"};
    static_assert(sizeof(names) / sizeof(names[0]) == mok_sm90::TIMING_SLOTS, "a name per counter");
    printf("%-34s %10s %8s\n", "cycles per tile (thread 128)", "cycles", "us");
    for (int i = 1; tiles > 0 && i < mok_sm90::TIMING_SLOTS; ++i) {
        const double cyc = c[i] / tiles;
        printf("%-34s %10.0f %8.2f\n", names[i], cyc, cyc / clock_khz * 1e3);
    }
    printf("(SM clock attribute %d MHz; clock64 counts SM cycles)\n", clock_khz / 1000);
    {
        /* how many CTA pairs fit at once (the clustered launch sizes its grid by this) */
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(132);
        cfg.blockDim = dim3(mok_sm90::kThreads);
        cfg.dynamicSmemBytes = sizeof(mok_sm90::smem_layout) + 1024;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int n = 0;
        CHECK(cudaFuncSetAttribute(mok_sm90::grouped_gemm_bf16_nt_kernel<false, false, false, false, 2>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cfg.dynamicSmemBytes));
        CHECK(cudaOccupancyMaxActiveClusters(&n, mok_sm90::grouped_gemm_bf16_nt_kernel<false, false, false, false, 2>, &cfg));
        printf("2-CTA clusters resident at once: %d\n", n);
    }
    return 0;
}
