#!/usr/bin/env bash
# Builds compile-time variants of the standalone FP8 GEMM checker (benchmarks/sm90_fp8_gemm_check.cu)
# and times them on the same problems, interleaved, ROUNDS times: the A/B harness for FP8 kernel
# experiments (no torch needed). Run on the GPU machine from the repo root:
#
#   bash benchmarks/fp8_check_variants.sh                         # default variant list and problems
#   VARIANTS="def: ord:-DMOK_SM90_FP8_ORDERED=1" ROUNDS=3 bash benchmarks/fp8_check_variants.sh
#
# VARIANTS: space-separated name:flags (flags: nvcc -D options, no spaces inside one; use ',' to
# separate several, e.g. b128np:-DMOK_SM90_FP8_BN_FWD=128,-DMOK_SM90_FP8_NO_PROMOTE=1).
# WGRAD=1 times the weight-gradient variant instead (PROBLEMS then read R E M N after 'wgrad').
# A flag src=DIR builds DIR/benchmarks/sm90_fp8_gemm_check.cu instead (a copy of an older tree, e.g.
# `mkdir -p _ab/old && git archive HEAD csrc benchmarks | tar -x -C _ab/old`, then "old:src=_ab/old").
# PROBLEMS: ';'-separated checker arguments (R E N K), default DeepSeek-V3 and Mixtral GEMM1.
# Output: one line per run and a table of TFLOP/s (median over rounds) at the end; the raw lines
# also go to $OUT/fp8_check_variants.txt when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
VARIANTS=${VARIANTS:-"def: b128:-DMOK_SM90_FP8_BN_FWD=128,-DMOK_SM90_FP8_BN_WGRAD=128"}
PROBLEMS=${PROBLEMS:-"65536 32 4096 7168;16384 8 28672 4096"}
ROUNDS=${ROUNDS:-2}
BIN=${BIN:-/tmp/mok_fp8_variants}
LOG=${OUT:+$OUT/fp8_check_variants.txt}
LOG=${LOG:-/tmp/fp8_check_variants.txt}
mkdir -p "$BIN" "$(dirname "$LOG")"
: > "$LOG"

for v in $VARIANTS; do
    name=${v%%:*}
    flags=${v#*:}
    src=.
    defs=()
    for f in ${flags//,/ }; do
        case $f in src=*) src=${f#src=} ;; *) defs+=("$f") ;; esac
    done
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$src/csrc/cuda" "${defs[@]}" \
        -o "$BIN/$name" "$src/benchmarks/sm90_fp8_gemm_check.cu" > "$BIN/$name.build.log" 2>&1 &
done
wait
for v in $VARIANTS; do
    name=${v%%:*}
    [ -x "$BIN/$name" ] || { echo "build of $name failed:"; tail -20 "$BIN/$name.build.log"; exit 1; }
done

IFS=';' read -r -a probs <<< "$PROBLEMS"
for round in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
        name=${v%%:*}
        for prob in "${probs[@]}"; do
            # shellcheck disable=SC2086
            line=$("$BIN/$name" ${WGRAD:+wgrad} $prob 2>&1 | grep -E '^(wgrad )?R=|FAIL|error' | tr '\n' ' ')
            echo "$name round $round: $line" | tee -a "$LOG"
        done
    done
done

# median TFLOP/s per variant and problem
python3 - "$LOG" <<'EOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.search(r"^(\S+) round \d+: .*?\bR=(\d+) E=(\d+) [MN]=(\d+) [NK]=(\d+): [\d.]+ ms, (\d+) TFLOP/s.*?\((ok|FAIL)\)", line)
    if m:
        runs.setdefault((m.group(1), "x".join(m.group(2, 3, 4, 5))), []).append((int(m.group(6)), m.group(7)))
names = list(dict.fromkeys(k[0] for k in runs))
probs = list(dict.fromkeys(k[1] for k in runs))
print("variant".ljust(10) + "".join(p.rjust(26) for p in probs))
for n in names:
    cells = []
    for p in probs:
        r = runs.get((n, p), [])
        cells.append((f"{statistics.median(t for t, _ in r):.0f} ({min(t for t, _ in r)}-{max(t for t, _ in r)})"
                      + ("" if all(ok == "ok" for _, ok in r) else " FAIL")) if r else "-")
    print(n.ljust(10) + "".join(c.rjust(26) for c in cells))
EOF
