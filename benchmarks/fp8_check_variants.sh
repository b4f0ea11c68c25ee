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
# WGRAD=1 times the weight-gradient variant instead (PROBLEMS then read R E M N after 'wgrad'); WGRAD=tiled its
# form with b's scales per 128 x 128 block (the checker's 'wgrad_tiled': the layer's tiled column copies).
# A flag yield=F patches the built checker: in each run of promotion FFMAs, the reuse-flagged ones in the first
# F of the run become yield points (benchmarks/sass_yield.py; performance log v58).
# A flag src=DIR builds DIR/benchmarks/sm90_fp8_gemm_check.cu instead (a copy of an older tree, e.g.
# `mkdir -p _ab/old && git archive HEAD csrc benchmarks | tar -x -C _ab/old`, then "old:src=_ab/old").
# PROBLEMS: ';'-separated checker arguments (R E N K), default DeepSeek-V3 and Mixtral GEMM1.
# REUSE=1 keeps variants already built in $BIN (BIN: default /tmp/mok_fp8_variants) instead of building them again.
# TOOL=bf16 builds and times the BF16 kernel's standalone timer (benchmarks/sm90_gemm_timing.cu) the
# same way; its PROBLEMS read R E N K [swiglu|nn|wgrad] and its outputs are not checked (the GPU
# suite checks that kernel), so its cells say "unchecked".
# A variant built with -DMOK_SM90_TIMING (the kernel's cycle counters, performance log v31) keeps its cycles per
# tile (mainloop, full-stage waits, drain, promotion, epilogue) in its run's line; read its shares, not its
# TFLOP/s (the counters cost ~17%).
# Output: one line per run and a table of TFLOP/s (median over rounds) at the end; the raw lines
# also go to $OUT/fp8_check_variants.txt (TOOL=bf16: $OUT/bf16_timing_variants.txt) when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
VARIANTS=${VARIANTS:-"def: b128:-DMOK_SM90_FP8_BN_FWD=128,-DMOK_SM90_FP8_BN_WGRAD=128"}
PROBLEMS=${PROBLEMS:-"65536 32 4096 7168;16384 8 28672 4096"}
ROUNDS=${ROUNDS:-2}
TOOL=${TOOL:-fp8}
case ${WGRAD:-} in
    "") MODE=() ;;
    tiled) MODE=(wgrad_tiled) ;;
    *) MODE=(wgrad) ;;
esac
case $TOOL in
    fp8) TOOL_SRC=benchmarks/sm90_fp8_gemm_check.cu LOG_NAME=fp8_check_variants.txt ;;
    bf16) TOOL_SRC=benchmarks/sm90_gemm_timing.cu LOG_NAME=bf16_timing_variants.txt ;;
    *) echo "TOOL must be fp8 or bf16, got '$TOOL'"; exit 2 ;;
esac
BIN=${BIN:-/tmp/mok_${TOOL}_variants}
LOG=${OUT:+$OUT/$LOG_NAME}
LOG=${LOG:-/tmp/$LOG_NAME}
mkdir -p "$BIN" "$(dirname "$LOG")"
: > "$LOG"

built=" "
for v in $VARIANTS; do
    name=${v%%:*}
    flags=${v#*:}
    # REUSE=1: a second pass over the same builds (e.g. WGRAD=1 after the forward) keeps the binaries in $BIN
    if [ -n "${REUSE:-}" ] && [ -x "$BIN/$name" ]; then continue; fi
    rm -f "$BIN/$name" # (a failed build must not leave an older binary to be timed)
    built+="$name "
    src=.
    defs=()
    for f in ${flags//,/ }; do
        case $f in src=*) src=${f#src=} ;; yield=*) ;; *) defs+=("$f") ;; esac
    done
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$src/csrc/cuda" "${defs[@]}" \
        -o "$BIN/$name" "$src/$TOOL_SRC" -lcuda > "$BIN/$name.build.log" 2>&1 &
done
wait
for v in $VARIANTS; do
    name=${v%%:*}
    [ -x "$BIN/$name" ] || { echo "build of $name failed:"; tail -20 "$BIN/$name.build.log"; exit 1; }
    [[ $built == *" $name "* ]] || continue # reused: patched when it was built
    flags=${v#*:}
    for f in ${flags//,/ }; do
        case $f in
            yield=*)  # the built binary's promotion FFMAs made yield points (benchmarks/sass_yield.py, v58)
                python3 benchmarks/sass_yield.py "$BIN/$name" "$BIN/$name.y" --fraction "${f#yield=}" &&
                    mv "$BIN/$name.y" "$BIN/$name" || { echo "sass_yield on $name failed"; exit 1; } ;;
        esac
    done
done

IFS=';' read -r -a probs <<< "$PROBLEMS"
for round in $(seq 1 "$ROUNDS"); do
    for v in $VARIANTS; do
        name=${v%%:*}
        for prob in "${probs[@]}"; do
            # shellcheck disable=SC2086
            line=$("$BIN/$name" "${MODE[@]}" $prob 2>&1 | grep -E '^(wgrad(_tiled)? )?R=|FAIL|error|does not take| cycles ' |
                tr -s ' ' | tr '\n' ' ')
            echo "$name round $round: $line" | tee -a "$LOG"
        done
    done
done

# median TFLOP/s per variant and problem
python3 - "$LOG" <<'EOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    # checker lines end in (ok) or (FAIL); the BF16 timer's name a mode and are unchecked
    m = re.search(r"^(\S+) round \d+: .*?\bR=(\d+) E=(\d+) [MN]=(\d+) [NK]=(\d+)( \w+)?: [\d.]+ ms, (\d+) TFLOP/s"
                  r"(?:.*?\((ok|FAIL)\)(?: bits ([0-9a-f]+))?)?", line)
    if m:
        prob = "x".join(m.group(2, 3, 4, 5)) + (m.group(6) or "").replace(" ", ":")
        runs.setdefault((m.group(1), prob), []).append((int(m.group(7)), m.group(8) or "unchecked", m.group(9)))
names = list(dict.fromkeys(k[0] for k in runs))
probs = list(dict.fromkeys(k[1] for k in runs))
# the checker fingerprints every output bit: a cell whose bits differ from the first variant's on that problem
# (or between its own rounds) says "bits!=" (a variant meant to keep the default's numerics must not)
first_bits = {p: {b for _, _, b in runs.get((names[0], p), []) if b} for p in probs}
print("variant".ljust(10) + "".join(p.rjust(34) for p in probs))
for n in names:
    cells = []
    for p in probs:
        r = runs.get((n, p), [])
        bits = {b for _, _, b in r if b}
        cells.append((f"{statistics.median(t for t, _, _ in r):.0f} ({min(t for t, _, _ in r)}-{max(t for t, _, _ in r)})"
                      + ("" if all(ok == "ok" for _, ok, _ in r) else " FAIL" if any(ok == "FAIL" for _, ok, _ in r)
                         else " unchecked")
                      + (" bits!=" if bits and (len(bits) > 1 or bits != first_bits[p]) else "")) if r else "-")
    print(n.ljust(10) + "".join(c.rjust(34) for c in cells))
EOF
