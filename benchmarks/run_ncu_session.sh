#!/usr/bin/env bash
# One device call that reads hardware counters (Nsight Compute, clocks left alone) of the FP8 path's
# memory-bound kernels and the FP8 GEMM (benchmarks/ncu_profile.py says which launches): per-kernel
# sections in $OUT/ncu_sections.txt, and per-SASS-instruction stall samples of the rowcol quantiser
# and the FP8 GEMM in $OUT/ncu_sass_{rowcol,gemm}.csv.gz. The profiling takes about 40 s after the build
# on an H100 (v41).
#   bash benchmarks/run_ncu_session.sh             # on the GPU machine, from the repo root
# TESTS=1 first runs the GPU suite ($OUT/gpu_tests.txt); BENCH_QUANT=1 runs bench_quant.py
# ($OUT/bench_quant.md).
cd "$(dirname "$0")/.."
source benchmarks/gpu_session.sh
T0=$SECONDS
if [ -n "${TESTS:-}" ]; then
    run_gpu_suite
fi
if [ -n "${BENCH_QUANT:-}" ]; then
    run_bench_quant
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
FILTER='regex:quantize_rows_bf16|quantize_rowcol|swiglu_quantize_bf16|grouped_gemm_fp8'
timeout 300 "$NCU" --clock-control none --kernel-name "$FILTER" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
    python3 benchmarks/ncu_profile.py > "$OUT/ncu_sections.txt" 2>&1
echo "sections ($((SECONDS - T0)) s): $(grep -c 'Section: Warp State' "$OUT/ncu_sections.txt") kernels"
for k in rowcol:quantize_rowcol_bf16_kernel gemm:grouped_gemm_fp8; do
    name=${k%%:*}
    timeout 200 "$NCU" --clock-control none --kernel-name "regex:${k#*:}" -c 1 --section SourceCounters \
        --section WarpStateStats -f -o "/tmp/ncu_$name" python3 benchmarks/ncu_profile.py > "/tmp/ncu_$name.log" 2>&1 ||
        tail -5 "/tmp/ncu_$name.log"
    "$NCU" -i "/tmp/ncu_$name.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "$OUT/ncu_sass_$name.csv.gz"
    echo "sass $name ($((SECONDS - T0)) s): $(zcat "$OUT/ncu_sass_$name.csv.gz" | wc -l) lines"
done
# the summary: per kernel, duration, throughput and the top stall reasons
grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Theoretical Occupancy" \
    "$OUT/ncu_sections.txt" | cut -c1-140 | head -90
