#!/usr/bin/env bash
# One device call that validates and measures the FP8 path (about 6 minutes on the H200, v20): build,
# the GPU suite, the quantisers (bench_quant.py: the rowcol pass against the copy ceiling),
# issue 5's GEMM criteria (bench_gemm_fp8.py: mok FP8 TFLOP/s and its
# ratio to mok BF16, the fused SwiGLU GEMM1 against GEMM + SwiGLU) and the layer per recipe (every GEMM
# in FP8 as the default one node and as three nodes, v52; tiled weight-gradient copies, v50; MXFP8). Files in $OUT (6-8): env.txt,
# build.log, gpu_tests.txt, bench_quant.md, bench_swiglu_quant.md, bench_gemm_fp8.md, bench_moe_layer.md, and with the
# options below swiglu_widths.txt, bf16_timing_variants.txt, fp8_tails.md, trace_qwen3_fp8.txt.
#   bash benchmarks/run_fp8_session.sh                 # on the GPU machine, from the repo root
#   SKIP_TESTS=1 ROUNDS=3 bash benchmarks/run_fp8_session.sh
# SKIP_LAYER=1 leaves out the layer run (about 1 minute on the H200; a second call can run it);
# SKIP_GEMM=1 leaves out bench_gemm_fp8.py (about 1.5 minutes), SKIP_QUANT=1 bench_quant.py and
# bench_swiglu_quant.py (about 1 minute). TAILS and TRACE run either way.
# LAYER_IMPLS=a,b,... replaces the layer run's impls. SQ_TIMING=1 also times the SwiGLU + quantisation
# kernels' variants stand-alone (benchmarks/swiglu_quant_timing.cu; $OUT/swiglu_quant_timing.txt).
# ROWCOL_TIMING=1 also times the rowcol quantiser's variants stand-alone (benchmarks/rowcol_timing.cu:
# its halves, its loads, a banded walk; $OUT/rowcol_timing.txt).
# TAILS=1 also measures how far the FP8 layer's y and gradients land from the emulation over 150 seeds
# ($OUT/fp8_tails.md; tests/test_fp8_experts.py's tolerances).
# TRACE=1 also traces the Qwen3 layer kernel by kernel in BF16 and all-FP8 (one node, three nodes, tiled) ($OUT/trace_qwen3_fp8.txt;
# TRACE_IMPLS=a,b,... replaces the impls, TRACE_SHAPES=a,b,... the shape).
# CHECK_BALANCED=1 also times the FP8 checker's N = 4096 forward GEMMs (DeepSeek-V3's GEMM1, Mixtral's GEMM2) with
# ragged experts against balanced ones (MOK_FP8_CHECK_BALANCED=1), and balanced with the tile walk's band at 8 and
# 32 M-tiles (-DMOK_SCHED_BAND_M_TILES; default 16), two rounds ($OUT/checker_balanced.txt; v61's probe).
# SWIGLU_WIDTHS=1 also times the fused SwiGLU GEMM1's tile widths in the standalone checker (128 x 128
# against the opt-in 128 x 192, MOK_SM90_FP8_SWIGLU_BN=192; v32), interleaved.
# FFMA_YIELD=1 also times the FP8 checker with its promotion FFMAs made yield points (v58; benchmarks/sass_yield.py)
# against the same build unpatched, on five forward GEMMs, interleaved ($OUT/fp8_check_variants.txt);
# FFMA_YIELD_VARIANTS, FFMA_YIELD_PROBLEMS and FFMA_YIELD_ROUNDS replace its variants, problems and rounds.
# FFMA_YIELD_LIB=F also patches the built extension so (v58, fraction F), runs the FP8 GEMM and layer GPU tests on
# it and times bench_gemm_fp8.py and the layer (mok, mok_fp8_all_tiled; SKIP_YIELD_LAYER=1 leaves it out) with the
# plain and the patched extension in turn, twice ($OUT/bench_gemm_fp8_{plain,yield}_N.md, bench_moe_layer_*).
# SQ_AB=DIR also times the SwiGLU + quantisation harness built from this tree against the one in DIR (a copy
# of an older tree, as for BF16_AB), interleaved, after benchmarks/swiglu_exp_check.cu where this tree has it
# ($OUT/swiglu_quant_ab.txt; SQ_AB_PROBLEMS="R I ..." replaces the three shapes, SQ_AB_ROUNDS the two rounds).
# SKIP_BUILD=1 builds no extension (about 85 s less) and so runs only the options that build their own
# harness (SQ_TIMING, SQ_AB, ROWCOL_TIMING, SWIGLU_WIDTHS, CHECK_BALANCED, FFMA_YIELD, BF16_AB): it implies SKIP_TESTS,
# SKIP_QUANT, SKIP_GEMM and SKIP_LAYER, and refuses FFMA_YIELD_LIB, TAILS and TRACE.
# BF16_AB=DIR also times the BF16 kernel built from this tree against the one in DIR (a copy of an
# older tree: `mkdir -p _ab/old && git archive HEAD csrc benchmarks | tar -x -C _ab/old`) on the
# Mixtral, DeepSeek-V3 and Qwen3 GEMMs, interleaved ($OUT/bf16_timing_variants.txt).
cd "$(dirname "$0")/.."
if [ -n "${SKIP_BUILD:-}" ]; then
    if [ -n "${FFMA_YIELD_LIB:-}${TAILS:-}${TRACE:-}" ]; then
        echo "SKIP_BUILD=1 leaves no extension for FFMA_YIELD_LIB, TAILS or TRACE"
        exit 2
    fi
    SKIP_TESTS=1 SKIP_QUANT=1 SKIP_GEMM=1 SKIP_LAYER=1
fi
source benchmarks/gpu_session.sh
T0=$SECONDS
if [ -z "${SKIP_TESTS:-}" ]; then
    run_gpu_suite
fi

if [ -z "${SKIP_QUANT:-}" ]; then
    run_bench_quant

    # SwiGLU + quantisation in one op (the opt-in FUSED_SWIGLU_QUANT path) against the two ops (v39)
    timeout 90 python3 benchmarks/bench_swiglu_quant.py --out /tmp/mok_bench_swiglu_quant.json > /tmp/mok_bench_swiglu_quant.txt 2>&1
    cp /tmp/mok_bench_swiglu_quant.md "$OUT/bench_swiglu_quant.md" 2>/dev/null || tail -20 /tmp/mok_bench_swiglu_quant.txt
    echo "bench_swiglu_quant ($((SECONDS - T0)) s):"; grep -E "^\| (qwen3|mixtral|dsv3)" "$OUT/bench_swiglu_quant.md" | cut -c1-120
fi

if [ -n "${SQ_TIMING:-}" ]; then
    # the SwiGLU + quantisation kernels' variants, stand-alone (v39)
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o /tmp/mok_sqt benchmarks/swiglu_quant_timing.cu &&
        /tmp/mok_sqt > "$OUT/swiglu_quant_timing.txt" 2>&1
    echo "swiglu_quant_timing ($((SECONDS - T0)) s):"; cat "$OUT/swiglu_quant_timing.txt"
fi

if [ -n "${SQ_AB:-}" ]; then
    # the SwiGLU + quantisation harness built from this tree and from the older one in $SQ_AB (a copy made with
    # `git archive`, see BF16_AB), run in turn twice (old, new, old, new): one device's clocks for both
    # ($OUT/swiglu_quant_ab.txt). With benchmarks/swiglu_exp_check.cu in this tree (v57's patch) its
    # exhaustive check runs first.
    if [ -f benchmarks/swiglu_exp_check.cu ]; then
        nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o /tmp/mok_sec \
            benchmarks/swiglu_exp_check.cu &
    fi
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$SQ_AB/csrc/cuda" -I"$SQ_AB/benchmarks" \
        -o /tmp/mok_sqt_old "$SQ_AB/benchmarks/swiglu_quant_timing.cu" &
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -Ibenchmarks -o /tmp/mok_sqt_new \
        benchmarks/swiglu_quant_timing.cu &
    wait
    if [ -f benchmarks/swiglu_exp_check.cu ]; then
        timeout 60 /tmp/mok_sec > "$OUT/swiglu_exp_check.txt" 2>&1
        echo "swiglu_exp_check rc=$?:"; head -20 "$OUT/swiglu_exp_check.txt"
    fi
    for round in $(seq 1 "${SQ_AB_ROUNDS:-2}"); do
        for which in old new; do
            echo "== $which round $round"
            timeout 100 "/tmp/mok_sqt_$which" ${SQ_AB_PROBLEMS:-}
        done
    done > "$OUT/swiglu_quant_ab.txt" 2>&1
    echo "swiglu_quant A/B ($((SECONDS - T0)) s):"; grep -E "^==|^R=|bwd|fwd" "$OUT/swiglu_quant_ab.txt" | cut -c1-150
fi

if [ -n "${ROWCOL_TIMING:-}" ]; then
    # the rowcol quantiser's variants stand-alone: its halves, its loads, a banded walk (v41)
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -Ibenchmarks -o /tmp/mok_rct \
        benchmarks/rowcol_timing.cu && timeout 90 /tmp/mok_rct > "$OUT/rowcol_timing.txt" 2>&1
    echo "rowcol_timing ($((SECONDS - T0)) s):"; cat "$OUT/rowcol_timing.txt"
fi

if [ -n "${CHECK_BALANCED:-}" ]; then
    # v61: is the bench's loss at N = 4096 (against the checker's ragged problems) the balanced plans' walk?
    for band in 16 8 32; do
        nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -DMOK_SCHED_BAND_M_TILES=$band \
            -o /tmp/mok_fp8_check_b$band benchmarks/sm90_fp8_gemm_check.cu > /tmp/mok_fp8_check_b$band.log 2>&1 &
    done
    wait
    {
        for round in 1 2; do
            for prob in "65536 32 4096 7168" "16384 8 4096 14336"; do
                for run in "16 0" "16 1" "8 1" "32 1"; do
                    set -- $run
                    # shellcheck disable=SC2086
                    line=$(MOK_FP8_CHECK_BALANCED=$2 timeout 60 /tmp/mok_fp8_check_b$1 $prob 2>&1 | grep -E '^R=|FAIL|error' |
                           tr '\n' ' ')
                    echo "$prob band $1 balanced $2 round $round: $line"
                done
            done
        done
    } > "$OUT/checker_balanced.txt" 2>&1
    echo "FP8 checker, ragged against balanced ($((SECONDS - T0)) s):"; cut -c1-150 "$OUT/checker_balanced.txt"
fi

if [ -n "${SWIGLU_WIDTHS:-}" ]; then
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -o /tmp/mok_fp8_check \
        benchmarks/sm90_fp8_gemm_check.cu > /tmp/mok_fp8_check.build.log 2>&1 || tail -20 /tmp/mok_fp8_check.build.log
    {
        for round in 1 2; do
            for prob in "65536 32 4096 7168" "16384 8 28672 4096" "131072 128 1536 2048"; do
                for bn in 128 192; do
                    # shellcheck disable=SC2086
                    line=$(MOK_FP8_CHECK_SWIGLU=1 MOK_SM90_FP8_SWIGLU_BN=$bn timeout 60 /tmp/mok_fp8_check $prob 2>&1 |
                           grep -E '^R=|FAIL|error' | tr '\n' ' ')
                    echo "swiglu bn $bn round $round: $line"
                done
            done
        done
    } > "$OUT/swiglu_widths.txt" 2>&1
    echo "SwiGLU widths ($((SECONDS - T0)) s):"; cut -c1-150 "$OUT/swiglu_widths.txt"
fi

if [ -n "${FFMA_YIELD:-}" ]; then
    # v58: the FP8 checker as built against the same binary with its promotion FFMAs made yield points
    # (benchmarks/sass_yield.py: half of each run, all of it), interleaved; every run checks its outputs
    VARIANTS=${FFMA_YIELD_VARIANTS:-"def: y50:yield=0.5 y100:yield=1"} ROUNDS=${FFMA_YIELD_ROUNDS:-2} \
        PROBLEMS=${FFMA_YIELD_PROBLEMS:-"65536 32 4096 7168;16384 8 28672 4096;16384 8 4096 14336;65536 32 7168 2048;131072 128 2048 768"} \
        timeout 420 bash benchmarks/fp8_check_variants.sh | tail -5
    echo "FFMA yield A/B ($((SECONDS - T0)) s)"
fi

if [ -n "${FFMA_YIELD_LIB:-}" ]; then
    # v58 in the library: the built extension patched as the checker is (FFMA_YIELD_LIB=F), its FP8 GEMM tests on
    # the patched code, then bench_gemm_fp8.py and the FP8 layer with the plain and the patched extension in
    # turn, twice (one process per run: each loads the .so in place at that moment); the plain one put back
    so=$(ls mok/_C*.so | head -1)
    cp "$so" /tmp/mok_C_plain.so
    python3 benchmarks/sass_yield.py "$so" /tmp/mok_C_yield.so --fraction "$FFMA_YIELD_LIB" || exit 1
    cp /tmp/mok_C_yield.so "$so"
    timeout 150 python3 -m pytest tests/test_fp8_gemm.py tests/test_fp8_experts.py -q -m gpu -p no:cacheprovider \
        > "$OUT/gpu_tests_fp8_yield.txt" 2>&1
    echo "FP8 GEMM and layer tests on the patched extension: $(tail -1 "$OUT/gpu_tests_fp8_yield.txt")"
    for round in 1 2; do
        for v in plain yield; do
            cp "/tmp/mok_C_$v.so" "$so"
            timeout 120 python3 benchmarks/bench_gemm_fp8.py --shapes mixtral_8x7b,dsv3_ep8_slice,qwen3_30b_a3b \
                --gemms gemm1,gemm2 --passes fwd,wgrad --iters 10 --warmup 3 --out "/tmp/mok_gemm_$v$round.json" \
                > /dev/null 2>&1
            cp "/tmp/mok_gemm_$v$round.md" "$OUT/bench_gemm_fp8_${v}_$round.md" 2>/dev/null
            [ -n "${SKIP_YIELD_LAYER:-}" ] || timeout 150 python3 benchmarks/bench_moe_layer.py \
                --shapes qwen3_30b_a3b,mixtral_8x7b,dsv3_ep8_slice --routing balanced --impls mok,mok_fp8_all_tiled \
                --naive off --rounds 1 --out "/tmp/mok_layer_$v$round.json" > /dev/null 2>&1
            cp "/tmp/mok_layer_$v$round.md" "$OUT/bench_moe_layer_${v}_$round.md" 2>/dev/null
            echo "FFMA yield in the library, $v round $round ($((SECONDS - T0)) s)"
        done
    done
    cp /tmp/mok_C_plain.so "$so"
    for f in "$OUT"/bench_gemm_fp8_*_?.md; do
        echo "== $f"; grep -E "\| mok_fp8 " "$f" | cut -c1-110
    done
fi

if [ -n "${BF16_AB:-}" ]; then
    TOOL=bf16 VARIANTS="old:src=$BF16_AB new:" ROUNDS=2 \
        PROBLEMS="16384 8 28672 4096 swiglu;16384 8 4096 14336;65536 32 4096 7168 swiglu;65536 32 7168 2048;131072 128 1536 2048 swiglu;131072 128 2048 768" \
        timeout 200 bash benchmarks/fp8_check_variants.sh | tail -4
    echo "BF16 A/B ($((SECONDS - T0)) s)"
fi

[ -z "${SKIP_GEMM:-}" ] && timeout 240 python3 benchmarks/bench_gemm_fp8.py --shapes mixtral_8x7b,dsv3_ep8_slice,qwen3_30b_a3b \
    --gemms gemm1,gemm2 --passes fwd,wgrad --iters 10 --warmup 3 --out /tmp/mok_bench_gemm_fp8.json \
    > /tmp/mok_bench_gemm_fp8.txt 2>&1
if [ -z "${SKIP_GEMM:-}" ]; then
    cp /tmp/mok_bench_gemm_fp8.md "$OUT/bench_gemm_fp8.md" 2>/dev/null || tail -20 /tmp/mok_bench_gemm_fp8.txt
    echo "bench_gemm_fp8 ($((SECONDS - T0)) s)"
fi

[ -z "${SKIP_LAYER:-}" ] && timeout 200 python3 benchmarks/bench_moe_layer.py --shapes qwen3_30b_a3b,mixtral_8x7b,dsv3_ep8_slice \
    --routing balanced --impls ${LAYER_IMPLS:-eager,mok,mok_fp8_dgrad,mok_fp8_all,mok_fp8_all_3nodes,mok_fp8_all_tiled,mok_fp8_all_tiled_3nodes,mok_mxfp8} --naive off \
    --rounds "${ROUNDS:-2}" --out /tmp/mok_bench_moe_layer.json > /tmp/mok_bench_moe_layer.txt 2>&1
if [ -z "${SKIP_LAYER:-}" ]; then
    cp /tmp/mok_bench_moe_layer.md "$OUT/bench_moe_layer.md" 2>/dev/null || tail -20 /tmp/mok_bench_moe_layer.txt
    echo "bench_moe_layer ($((SECONDS - T0)) s)"
fi
if [ -n "${TAILS:-}" ]; then
    # the FP8 layer's y and gradients against the float64 emulation over 150 seeds (the tests' tolerances)
    timeout 150 python3 benchmarks/fp8_emulation_tails.py --seeds 150 --grads > "$OUT/fp8_tails.md" 2>&1
    cat "$OUT/fp8_tails.md"
fi
if [ -n "${TRACE:-}" ]; then
    # where the FP8 layer's time goes on Qwen3 (1.05x mok BF16 in v20, 1.25x asked): every kernel per step
    timeout 120 python3 benchmarks/trace_moe_layer.py --shapes "${TRACE_SHAPES:-qwen3_30b_a3b}" \
        --impls "${TRACE_IMPLS:-mok,mok_fp8_all,mok_fp8_all_3nodes,mok_fp8_all_tiled}" \
        --top 25 > "$OUT/trace_qwen3_fp8.txt" 2>&1
    echo "trace ($((SECONDS - T0)) s)"
fi
cut -c1-200 "$OUT/bench_gemm_fp8.md" "$OUT/bench_moe_layer.md" 2>/dev/null || true
