#!/usr/bin/env bash
# Why does bench_gemm_fp8.py read some FP8 forward GEMMs 5-10% under the standalone checker (performance log,
# v39: DeepSeek-V3 GEMM1 1042 against 1160 TFLOP/s, Qwen3 GEMM1 1022 against 1123, DeepSeek-V3 GEMM2 1148
# against 1154; one H100, the same kernels)? v61 ruled out the walk. Left: the data (the bench feeds quantised
# normal values, the checker uniform bytes) and the power limit (the bench's sustained runs against the
# checker's 10 calls). This probe times the default checker on the bench's balanced experts with both kinds of
# data (MOK_FP8_CHECK_DATA) and 10 or 300 back-to-back calls (MOK_FP8_CHECK_ITERS), interleaved, with the SM
# clock and board power sampled every 50 ms (only the 300-call runs, 0.2-1 s, last long enough to be sampled).
# No extension build (about 3 minutes). Run on the GPU machine
# from the repo root:
#
#   bash benchmarks/fp8_gap_probe.sh
#   BENCH=1 bash benchmarks/fp8_gap_probe.sh   # also clock_probe.py's GEMM mode on the built extension
#
# Reading it: if gauss runs lower than uniform at the same clock, the data costs cycles; if at a lower clock, it
# costs power. If 300 calls run slower than 10, the bench's sustained timing meets the power limit that
# the checker's short burst does not. TFLOP/s per GHz separates the two.
# PROBLEMS (';'-separated R E N K) and ROUNDS (default 2) replace the defaults. Output: $OUT/fp8_gap_probe.txt
# (one line per run) and a table of medians printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mok-out}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2}
# DeepSeek-V3 GEMM1 (the largest gap), Qwen3 GEMM1, DeepSeek-V3 GEMM2 (none)
PROBLEMS=${PROBLEMS:-"65536 32 4096 7168;131072 128 1536 2048;65536 32 7168 2048"}
BIN=$(mktemp -d /tmp/mok_fp8_gap.XXXXXX)
LOG=$OUT/fp8_gap_probe.txt
: > "$LOG"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/gap_env.txt"
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o "$BIN/check" \
    benchmarks/sm90_fp8_gemm_check.cu -lcuda > "$BIN/build.log" 2>&1 || { tail -20 "$BIN/build.log"; exit 1; }

# one run: the checker with data $1 and $2 calls on problem $3, the clock and power sampled every 50 ms; the
# samples above half the run's peak power are the kernel's (the rest is the host making the operands), and a
# run whose peak stays under 250 W had none (10 calls: 8-35 ms)
run_one() {
    local data=$1 iters=$2 prob=$3 samples=$BIN/samples.csv
    nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 > "$samples" 2>/dev/null &
    local smi=$!
    local line
    # shellcheck disable=SC2086
    line=$(MOK_FP8_CHECK_BALANCED=1 MOK_FP8_CHECK_DATA=$data MOK_FP8_CHECK_ITERS=$iters timeout 120 \
        "$BIN/check" $prob 2>&1 | tail -1)
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    local clocks
    clocks=$(python3 - "$samples" <<'EOF'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        mhz, watts = (float(x) for x in line.split(","))
        rows.append((mhz, watts))
    except ValueError:
        pass
peak = max((w for _, w in rows), default=0.0)
busy = [(m, w) for m, w in rows if w > 0.5 * peak] if peak > 250 else []
if busy:
    print(f"clock {statistics.median(m for m, _ in busy):.0f} MHz power {statistics.median(w for _, w in busy):.0f} W "
          f"({len(busy)} samples)")
else:
    print("clock - MHz power - W (0 samples)")
EOF
)
    echo "$data x$iters: $line | $clocks" | tee -a "$LOG"
}

IFS=';' read -r -a probs <<< "$PROBLEMS"
for ((round = 1; round <= ROUNDS; round++)); do
    for prob in "${probs[@]}"; do
        for data in uniform gauss; do
            for iters in 10 300; do
                run_one "$data" "$iters" "$prob"
            done
        done
    done
done

if [ -n "${BENCH:-}" ]; then
    # the bench's side: its own operands through the extension, 4 s back to back each, clocks sampled
    timeout 150 python3 benchmarks/clock_probe.py --gemm gemm1 --shapes dsv3_ep8_slice,qwen3_30b_a3b \
        --impls mok_fp8,torch_scaled_grouped_mm --seconds 4 > "$OUT/gap_clock_probe_gemm1.txt" 2>&1
    timeout 90 python3 benchmarks/clock_probe.py --gemm gemm2 --shapes dsv3_ep8_slice \
        --impls mok_fp8,torch_scaled_grouped_mm --seconds 4 > "$OUT/gap_clock_probe_gemm2.txt" 2>&1
    tail -8 "$OUT/gap_clock_probe_gemm1.txt" "$OUT/gap_clock_probe_gemm2.txt"
fi

# the medians over rounds: TFLOP/s, MHz, W and TFLOP/s per GHz per problem and mode
python3 - "$LOG" <<'EOF'
import re, statistics, sys
runs = {}
pat = re.compile(r"^(\w+) x(\d+): R=(\d+) E=(\d+) N=(\d+) K=(\d+): [\d.]+ ms, (\d+) TFLOP/s, .*?\((ok|FAIL)\).*\| "
                 r"clock (\S+) MHz power (\S+) W")
for line in open(sys.argv[1]):
    m = pat.match(line)
    if not m:
        print("unparsed (a failed run?):", line.strip()[:200])
        continue
    data, iters, R, E, N, K, tf, ok, mhz, watts = m.groups()
    key = (f"{R}x{E}x{N}x{K}", f"{data} x{iters}")
    runs.setdefault(key, []).append((float(tf), float(mhz) if mhz != "-" else float("nan"),
                                     float(watts) if watts != "-" else float("nan"), ok))
print(f"{'problem':24s} {'data, calls':14s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>5s} {'TFLOP/s per GHz':>16s}")
for (prob, mode), rs in runs.items():
    tf = statistics.median(r[0] for r in rs)
    mhz = statistics.median(r[1] for r in rs)
    watts = statistics.median(r[2] for r in rs)
    flag = "" if all(r[3] == "ok" for r in rs) else "  FAIL"
    print(f"{prob:24s} {mode:14s} {tf:8.0f} {mhz:6.0f} {watts:5.0f} {tf / mhz * 1e3:16.0f}{flag}")
EOF
