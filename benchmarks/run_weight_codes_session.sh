#!/usr/bin/env bash
# One device call for the FP8 weight codes (performance log v64, v65): builds mok, runs the GPU tests of the
# (w1, w3) pair under the recipes and of the byte-transpose kernel (mok::transpose_fp8_codes), times the
# transpose against torch's copy and a plain copy, then bench_titan_experts.py with the codes remade before
# every call (one optimizer step per call), with and without the kernel (TRANSPOSE_KERNEL). Few files in $OUT
# (the device tool returns a limited number); a short table last. Run from the repo root on the GPU machine:
#
#   bash benchmarks/run_weight_codes_session.sh
#
# SHAPES (default qwen3_30b_a3b,mixtral_8x7b,dsv3_ep8_slice), ROUNDS (default 3).
T0=$SECONDS
source "$(dirname "$0")/gpu_session.sh"
SHAPES=${SHAPES:-qwen3_30b_a3b,mixtral_8x7b,dsv3_ep8_slice}
ROUNDS=${ROUNDS:-3}
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_transpose_codes.py \
    tests/test_split_gate_up_recipes.py tests/test_fp8_experts.py > "$OUT/weight_codes_tests.txt" 2>&1
echo "tests ($((SECONDS - T0)) s): $(tail -1 "$OUT/weight_codes_tests.txt")"
grep -E "^FAILED" "$OUT/weight_codes_tests.txt" | head -10
timeout 60 python3 - <<'PY' 2>&1 | tee "$OUT/transpose_codes.txt"
import torch
from benchmarks import common
dev = torch.device("cuda")
for name, shape in (("mixtral w1", (8, 28672, 4096)), ("mixtral w2", (8, 4096, 14336)), ("qwen3 w1", (128, 1536, 2048))):
    q = torch.randint(0, 255, shape, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    same = torch.equal(torch.ops.mok.transpose_fp8_codes(q).view(torch.uint8), q.view(torch.uint8).transpose(1, 2))
    cells = []
    for label, fn in (("copy", lambda i: q.clone()), ("mok", lambda i: torch.ops.mok.transpose_fp8_codes(q)),
                      ("torch", lambda i: q.transpose(1, 2).contiguous())):
        ms = common.bench(fn, dev, iters=10, warmup=2, flush_l2=True)["median_ms"]
        cells.append(f"{label} {ms:.3f} ms ({2 * q.numel() / ms / 1e9:.2f} TB/s)")
    print(f"transpose {name} {tuple(shape)}: " + " | ".join(cells) + f" | same bytes: {same}", flush=True)
PY
for kernel in "" "--transpose-kernel"; do
    name=requant${kernel:+_kernel}
    timeout 200 python3 benchmarks/bench_titan_experts.py --shapes "$SHAPES" --rounds "$ROUNDS" --recipe blockwise \
        --fp8-backward all_tiled --requantise $kernel --out "/tmp/titan_$name.json" > "/tmp/titan_$name.txt" 2>&1
    echo "== bench_titan_experts $name ($((SECONDS - T0)) s)"
    cat "/tmp/titan_$name.md" >> "$OUT/titan_weight_codes.md" 2>/dev/null || tail -5 "/tmp/titan_$name.txt"
done
grep -E "^\| (qwen3|mixtral|dsv3)" "$OUT/titan_weight_codes.md" | cut -c1-110
echo "done ($((SECONDS - T0)) s)"
