#!/usr/bin/env bash
# Builds mok (CUDA) and runs both benchmarks and the training example on one GPU, in about 8
# minutes on an H200. Logs and results go to $OUT (default benchmarks/out): run.log, bench_gemm.{json,md},
# bench_moe_layer.{json,md}, loss_curves.png, losses.csv, summary.json (8 files).
#   bash benchmarks/run_h200.sh            # everything
#   SKIP_BUILD=1 STEPS=100 bash benchmarks/run_h200.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
{
    echo "=== $(date -u '+%F %T UTC') on $(hostname)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    if [ -z "${SKIP_BUILD:-}" ]; then
        echo "=== build (${SECONDS}s)"
        # NOTE: the build log stays in /tmp: $OUT brings back few files.
        if ! MAX_JOBS=${MAX_JOBS:-16} $PY setup.py build_ext --inplace >/tmp/mok_build.log 2>&1; then
            tail -60 /tmp/mok_build.log
            echo "BUILD FAILED: the benchmarks still run their peers; mok rows will show the error"
        fi
    fi
    $PY -c "import mok, torch; print('mok', mok.__version__, 'cuda kernels:', mok.has_cuda_kernels(), 'torch', torch.__version__)"
    echo "=== bench_gemm (${SECONDS}s)"
    $PY benchmarks/bench_gemm.py --iters "${GEMM_ITERS:-30}" --out "$OUT/bench_gemm.json"
    echo "=== bench_moe_layer (${SECONDS}s)"
    $PY benchmarks/bench_moe_layer.py --iters "${ITERS:-20}" --naive "${NAIVE:-auto}" --out "$OUT/bench_moe_layer.json"
    echo "=== train_moe_lm (${SECONDS}s)"
    $PY examples/train_moe_lm.py --steps "${STEPS:-200}" --no-progress --log-every 50 --out "$OUT"
    echo "=== done (${SECONDS}s)"
} 2>&1 | tee "$OUT/run.log"
