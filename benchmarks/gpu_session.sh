#!/usr/bin/env bash
# The start of a device call: records the GPU and torch in $OUT/env.txt and builds mok in place
# (log in $OUT/build.log; exits on a failed build). Sourced by the device scripts, which then run
# the tests and benchmarks: `source benchmarks/gpu_session.sh` from the repo root on the GPU machine
# (benchmarks/run_multi_gpu.sh, for one).
set -uo pipefail
OUT=${OUT:-/tmp/mok-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/env.txt"
# SKIP_BUILD=1: no extension (about 85 s saved), for the standalone harnesses that nvcc builds themselves
if [ -z "${SKIP_BUILD:-}" ]; then
    start=$SECONDS
    MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || {
        tail -60 "$OUT/build.log"
        exit 1
    }
    echo "build: $((SECONDS - start)) s"
    python3 -c "import mok; print('cuda kernels:', mok.has_cuda_kernels())"
fi

# The GPU suite into $OUT/gpu_tests.txt, its last line and any failures printed (T0: the caller's start).
run_gpu_suite() {
    timeout 240 python3 -m pytest tests -q -m gpu -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1
    echo "GPU suite ($((SECONDS - ${T0:-0})) s): $(tail -1 "$OUT/gpu_tests.txt")"
    grep FAILED "$OUT/gpu_tests.txt" | head -20
}

# bench_quant.py (the quantisers against the copy bandwidth) into $OUT/bench_quant.md, its copy,
# rowcol and row-wise 1x128 rows printed.
run_bench_quant() {
    timeout 120 python3 benchmarks/bench_quant.py --out /tmp/mok_bench_quant.json > /tmp/mok_bench_quant.txt 2>&1
    cp /tmp/mok_bench_quant.md "$OUT/bench_quant.md" 2>/dev/null || tail -20 /tmp/mok_bench_quant.txt
    echo "bench_quant ($((SECONDS - ${T0:-0})) s):"
    grep -E "copy|rowcol|1x128 " "$OUT/bench_quant.md" | grep -v unfused | cut -c1-120
}
