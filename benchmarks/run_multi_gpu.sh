#!/usr/bin/env bash
# Issue 6 in one device call on a multi-GPU kind (nvidia-h200-x8, -x4 or -x2): builds mok, then runs
# with NVLink multicast off (gpu_session.sh exports the switches)
#   1. the expert-parallel tests with one process per GPU (W = 2, 4, 8 as the GPUs allow) and the
#      single-GPU EP tests,
#   2. bench_ep.py: dispatch / combine GB/s per GPU for mok, NCCL all_to_all_single and
#      all_to_all_vdev_2d at 4096 and 8192 tokens per rank, H 7168 and 4096, top-8, 256 experts,
#   3. bench_ep_layer.py: mok's EP layer (BF16, every GEMM in FP8, MXFP8) against the torchtitan-style
#      EP baseline, DeepSeek-V3 and Qwen3 shapes, on every GPU.
# Logs in $OUT: env.txt, build.log, ep_tests.txt, bench_ep.txt, bench_ep_layer.txt.
#   OUT=/tmp/out bash benchmarks/run_multi_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-benchmarks/out}
source benchmarks/gpu_session.sh || exit 1
echo "GPUs: $(python3 -c 'import torch; print(torch.cuda.device_count())')"
timeout 300 python3 -m pytest tests/test_ep_gpu.py tests/test_ep.py -q -m "gpu or not gpu" -p no:cacheprovider \
    > "$OUT/ep_tests.txt" 2>&1
tail -1 "$OUT/ep_tests.txt"
for tokens in 4096 8192; do
    for hidden in 7168 4096; do
        timeout 120 python3 benchmarks/bench_ep.py --tokens $tokens --hidden $hidden --experts 256 --topk 8
    done
done > "$OUT/bench_ep.txt" 2>&1
grep -E "GB/s" "$OUT/bench_ep.txt" | grep "rank 0" | cut -c1-150
timeout 420 python3 benchmarks/bench_ep_layer.py --shapes dsv3,qwen3_30b_a3b --recipes bf16,blockwise_all,mxfp8 \
    > "$OUT/bench_ep_layer.txt" 2>&1
grep "^|" "$OUT/bench_ep_layer.txt"
