/*
 * Host side of the persistent GEMM kernels' 2-CTA clusters: the launch with a cluster dimension and
 * a grid that is resident at once. Shared by the BF16 and FP8 launchers.
 */
#ifndef MOK_CUDA_GEMM_CLUSTER_LAUNCH_CUH
#define MOK_CUDA_GEMM_CLUSTER_LAUNCH_CUH

#include <stdint.h>
#include <cuda_runtime.h>

/* Launches kernel(args...) as clusters of `cluster` CTAs over `units` work units (one unit per
 * cluster at a time), at most one CTA per SM. *max_clusters caches the occupancy answer per
 * kernel (0: not yet asked). Returns 0 or the cudaError_t of the failure.
 * NOTE: a persistent grid must be resident at once: a pair needs two free SMs of one GPC, so
 * fewer pairs than SMs / 2 may fit; one more pair would run as a second wave (measured: the BF16
 * kernel 1.7x slower). The occupancy API says how many fit. */
template <typename Kernel, typename... Args>
int mok_launch_persistent_clusters(Kernel kernel, int cluster, int64_t units, int num_sms, int threads, int smem,
                                   cudaStream_t stream, int* max_clusters, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (*max_clusters == 0) {
        cfg.gridDim = dim3((unsigned)(num_sms / cluster * cluster));
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n < 1) {
            (void)cudaGetLastError();
            n = 1;
        }
        *max_clusters = n;
    }
    int64_t clusters = units < *max_clusters ? units : *max_clusters;
    const int64_t sm_groups = num_sms / cluster > 0 ? num_sms / cluster : 1;
    clusters = clusters < sm_groups ? clusters : sm_groups;
    clusters = clusters < 1 ? 1 : clusters;
    cfg.gridDim = dim3((unsigned)(clusters * cluster));
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)err;
    }
    return (int)cudaGetLastError();
}

#endif /* MOK_CUDA_GEMM_CLUSTER_LAUNCH_CUH */
