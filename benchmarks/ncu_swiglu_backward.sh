#!/usr/bin/env bash
# Hardware counters of the SwiGLU + quantise backward kernels, stand-alone (benchmarks/swiglu_quant_timing.cu,
# one launch per variant): the per-tile kernel and the streamed split one (the library's default since v55),
# on the Qwen3 shape by default. Sections (speed of light, compute, instruction mix, scheduler, warp states)
# of both in $OUT/ncu_swiglu_bwd.txt; per-SASS-instruction executed counts and stall samples of the split
# kernel in $OUT/ncu_sass_swiglu_bwd.csv.gz; the profiler's logs in $OUT/ncu_swiglu_bwd*.log. Allow about 3
# minutes after the build (nvcc of the harness ~25 s; every section replays the kernel and restores the
# memory it writes, which is most of the time: the first run, with all sections at once on the Mixtral
# shape under a 100 s limit, made no report).
#   bash benchmarks/ncu_swiglu_backward.sh [R I]      # on the GPU machine, from the repo root
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
PROBLEM=${*:-131072 768}
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -Ibenchmarks -o /tmp/mok_sqt \
    benchmarks/swiglu_quant_timing.cu || exit 1
BOTH='regex:swiglu_quantize_bf16_kernel<true, true, true, 2, false>|swiglu_backward_split_stream_kernel<true, true, 2, 4>'
SPLIT='regex:swiglu_backward_split_stream_kernel<true, true, 2, 4>'
# shellcheck disable=SC2086
MOK_SQT_ONCE=1 timeout 150 "$NCU" --clock-control none --kernel-name-base demangled --kernel-name "$BOTH" -c 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    --section WarpStateStats /tmp/mok_sqt $PROBLEM > "$OUT/ncu_swiglu_bwd.txt" 2> "$OUT/ncu_swiglu_bwd.log" ||
    tail -5 "$OUT/ncu_swiglu_bwd.log"
# shellcheck disable=SC2086
MOK_SQT_ONCE=1 timeout 150 "$NCU" --clock-control none --kernel-name-base demangled --kernel-name "$SPLIT" -c 1 \
    --section SourceCounters -f -o /tmp/ncu_swiglu_bwd /tmp/mok_sqt $PROBLEM > "$OUT/ncu_swiglu_bwd_sass.log" 2>&1 ||
    tail -5 "$OUT/ncu_swiglu_bwd_sass.log"
"$NCU" -i /tmp/ncu_swiglu_bwd.ncu-rep --page source --print-source sass --csv 2>&1 | gzip > "$OUT/ncu_sass_swiglu_bwd.csv.gz"
grep -E "swiglu_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued" \
    "$OUT/ncu_swiglu_bwd.txt" | cut -c1-120 | head -24
