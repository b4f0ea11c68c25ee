#!/usr/bin/env bash
# One device call for the FP8 kernel's compile-time experiments around v68 (MOK_SM90_FP8_EPI_TILE: a plain tile's
# epilogue staged at once) and v69 (MOK_SM90_FP8_HALF_PIPE=N: a 192-wide K-block as two halves, one promoted while
# the other runs), performance log. Run on the GPU machine from the repo root.
#
# Both are the default since v70 (RESULTS v39, H100: +3.4-6.5% forward together, same bits, the GPU suite passed
# on them). Next, the default call below: the former default ("old") for reference, N = 8 with the whole-tile
# epilogue (alone it beat N = 4 on DeepSeek-V3's GEMM1), the weight gradient's half pipe on top of the whole-tile
# epilogue, and the timing builds (they did not fit in v39's call: run with fewer variants or TIMING=0 if short).
#
#   bash benchmarks/run_fp8_pipe_session.sh
#       The standalone checker's variants against the default, interleaved, two rounds (8-9 minutes): the
#       forward GEMMs (the first two problems have 1 and 3 K-blocks a tile, v69's tails), the weight gradients
#       (per-column scales, then b's scales per 128 x 128 tile), then the timing builds' cycles per tile ($OUT/fwd,
#       $OUT/wgrad, $OUT/wgrad_tiled, $OUT/timing; tables printed last).
#       VARIANTS replaces the forward's variant list, WVARIANTS the weight gradients' (fp8_check_variants.sh's
#       syntax; builds of the same name are reused); TIMING=0 leaves the timing builds out (for a call with little
#       device time left).
#   SUITE_DEFINES="-DMOK_SM90_FP8_HALF_PIPE=8" bash benchmarks/run_fp8_pipe_session.sh
#       Instead: the extension built with those switches (setup.py's MOK_NVCC_DEFINES), the GPU suite on it and
#       bench_gemm_fp8.py (about 6 minutes): what a winner needs before it becomes the default.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mok-out}
mkdir -p "$OUT"

if [ -n "${SUITE_DEFINES:-}" ]; then
    export MOK_NVCC_DEFINES="$SUITE_DEFINES"
    echo "extension built with MOK_NVCC_DEFINES=$MOK_NVCC_DEFINES" | tee "$OUT/defines.txt"
    source benchmarks/gpu_session.sh # the build, with the defines
    T0=$SECONDS
    run_gpu_suite
    timeout 240 python3 benchmarks/bench_gemm_fp8.py --shapes mixtral_8x7b,dsv3_ep8_slice,qwen3_30b_a3b \
        --gemms gemm1,gemm2 --passes fwd,wgrad --iters 10 --warmup 3 --out /tmp/mok_bench_gemm_fp8.json \
        > /tmp/mok_bench_gemm_fp8.txt 2>&1
    cp /tmp/mok_bench_gemm_fp8.md "$OUT/bench_gemm_fp8.md" 2>/dev/null || tail -20 /tmp/mok_bench_gemm_fp8.txt
    echo "bench_gemm_fp8 ($((SECONDS - T0)) s)"
    grep -E "^\| (mixtral|dsv3|qwen3)" "$OUT/bench_gemm_fp8.md" | cut -c1-160
    exit 0
fi

T0=$SECONDS
# this call's builds, shared by its passes (REUSE=1) and by nothing older: a warm machine's /tmp may hold
# binaries of the same names built from another tree
BIN=$(mktemp -d /tmp/mok_fp8_pipe.XXXXXX)
export BIN
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/env.txt"
# (v39: N = 4 with the whole-tile epilogue became the default; N = 8 without it read 1178 against 1160 on DeepSeek-V3's
# GEMM1, below it elsewhere)
VARIANTS=${VARIANTS:-"def: old:-DMOK_SM90_FP8_HALF_PIPE=0,-DMOK_SM90_FP8_EPI_TILE=0 half8:-DMOK_SM90_FP8_HALF_PIPE=8"}
WVARIANTS=${WVARIANTS:-"def: old:-DMOK_SM90_FP8_HALF_PIPE=0,-DMOK_SM90_FP8_EPI_TILE=0 wg2:-DMOK_SM90_FP8_HALF_PIPE_WGRAD=2 wg4:-DMOK_SM90_FP8_HALF_PIPE_WGRAD=4"}
# 1 and 3 K-blocks a tile; Qwen3 GEMM2, GEMM1; DeepSeek-V3 GEMM1; Mixtral GEMM2; DeepSeek-V3 GEMM2
FWD="8192 8 1536 128;8192 8 1536 384;131072 128 2048 768;131072 128 1536 2048;65536 32 4096 7168;16384 8 4096 14336;65536 32 7168 2048"
# Qwen3's two weight gradients, Mixtral's GEMM1 weight gradient (R E M N)
WGRAD="131072 128 1536 2048;131072 128 2048 768;16384 8 28672 4096"
OUT=$OUT/fwd VARIANTS=$VARIANTS PROBLEMS=$FWD timeout 330 bash benchmarks/fp8_check_variants.sh > "$OUT/fwd.txt" 2>&1
echo "forward ($((SECONDS - T0)) s)"
OUT=$OUT/wgrad VARIANTS=$WVARIANTS PROBLEMS=$WGRAD WGRAD=1 REUSE=1 timeout 200 bash benchmarks/fp8_check_variants.sh \
    > "$OUT/wgrad.txt" 2>&1
echo "weight gradient ($((SECONDS - T0)) s)"
OUT=$OUT/wgrad_tiled VARIANTS=$WVARIANTS PROBLEMS=$WGRAD WGRAD=tiled REUSE=1 timeout 150 \
    bash benchmarks/fp8_check_variants.sh > "$OUT/wgrad_tiled.txt" 2>&1
echo "weight gradient, tiled b scales ($((SECONDS - T0)) s)"
# the cycle counters of the default and each variant (a timing build's TFLOP/s is ~17% low: read its shares)
TVARIANTS=""
for v in $VARIANTS; do
    flags=${v#*:}
    TVARIANTS+=" t${v%%:*}:-DMOK_SM90_TIMING${flags:+,$flags}"
done
if [ "${TIMING:-1}" != 0 ] && [ $((SECONDS - T0)) -lt 450 ]; then
    OUT=$OUT/timing VARIANTS=$TVARIANTS PROBLEMS="131072 128 2048 768;65536 32 4096 7168" ROUNDS=1 BIN=$BIN/timing \
        timeout 120 bash benchmarks/fp8_check_variants.sh > "$OUT/timing.txt" 2>&1
    echo "timing ($((SECONDS - T0)) s)"
    # name, problem: the cycle counters per tile
    sed -E 's/^(\S+) round 1: (.*) R=([0-9]+) E=([0-9]+) N=([0-9]+) K=([0-9]+):.*/\1 \3x\4x\5x\6: \2/' \
        "$OUT/timing/fp8_check_variants.txt" | tr -s ' ' | cut -c1-300
fi
echo "== forward TFLOP/s (median of rounds; (ok) = matches float64)"
tail -"$(( $(wc -w <<< "$VARIANTS") + 1 ))" "$OUT/fwd.txt"
echo "== weight gradient TFLOP/s"
tail -"$(( $(wc -w <<< "$WVARIANTS") + 1 ))" "$OUT/wgrad.txt"
echo "== weight gradient, b's scales per 128 x 128 tile, TFLOP/s"
tail -"$(( $(wc -w <<< "$WVARIANTS") + 1 ))" "$OUT/wgrad_tiled.txt"
