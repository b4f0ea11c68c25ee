#!/usr/bin/env bash
# Hardware counters of the per-tile SwiGLU + quantise backward (the layer's default backward, v54: issue-bound?)
# on the Mixtral shape, stand-alone (benchmarks/swiglu_quant_timing.cu, one launch per variant): sections in
# $OUT/ncu_swiglu_bwd.txt, per-SASS-instruction executed counts and stall samples in
# $OUT/ncu_sass_swiglu_bwd.csv.gz, its log in $OUT/ncu_swiglu_bwd.log. About 1 minute after the build (nvcc of the harness: ~25 s).
#   bash benchmarks/ncu_swiglu_backward.sh [R I]      # on the GPU machine, from the repo root
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -Ibenchmarks -o /tmp/mok_sqt \
    benchmarks/swiglu_quant_timing.cu || exit 1
KERNEL='regex:swiglu_quantize_bf16_kernel<true, true, true, 2, false>'
# shellcheck disable=SC2068
MOK_SQT_ONCE=1 timeout 180 "$NCU" --clock-control none --kernel-name-base demangled --kernel-name "$KERNEL" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters \
    -f -o /tmp/ncu_swiglu_bwd /tmp/mok_sqt ${@:-16384 14336} > "$OUT/ncu_swiglu_bwd.log" 2>&1 || tail -5 "$OUT/ncu_swiglu_bwd.log"
"$NCU" -i /tmp/ncu_swiglu_bwd.ncu-rep > "$OUT/ncu_swiglu_bwd.txt" 2>&1
"$NCU" -i /tmp/ncu_swiglu_bwd.ncu-rep --page source --print-source sass --csv 2>&1 | gzip > "$OUT/ncu_sass_swiglu_bwd.csv.gz"
grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued|Executed Instructions  " \
    "$OUT/ncu_swiglu_bwd.txt" | cut -c1-120 | head -20
