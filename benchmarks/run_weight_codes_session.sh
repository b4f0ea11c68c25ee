#!/usr/bin/env bash
# Device calls for the FP8 weight codes (performance log v64-v66), in two parts that each fit one call
# (run part 2 right after part 1, on the still-warm machine: it reuses the build):
#
#   PART=1 bash benchmarks/run_weight_codes_session.sh   # build; GPU tests; the W^T codes' kernels timed
#   PART=2 bash benchmarks/run_weight_codes_session.sh   # the requantised FP8 step per way of making them
#   PART=all bash benchmarks/run_weight_codes_session.sh # both in one call (~8 minutes; when starts are scarce)
#
# Part 1: builds mok, runs the GPU tests (FULL_SUITE=1: the whole suite; else those of the weight codes, the
# transpose, the pair recipes and the FP8 experts), then times, per weight shape, torch's transpose of the
# codes, mok's byte transpose (v65), a plain copy, and the codes of W and W^T by the quantisation then the
# transpose against the fused kernel (mok::quantize_fp8_weight_rowcol, v66).
# Part 2: bench_titan_experts.py --recipe blockwise --fp8-backward all_tiled --requantise with the W^T codes
# made each way (--weight-codes torch, transpose, fused). SHAPES (default qwen3_30b_a3b,mixtral_8x7b,
# dsv3_ep8_slice), ROUNDS (default 2). Few files in $OUT (the device tool returns a limited number); tables last.
T0=$SECONDS
PART=${PART:-1}
if [ "$PART" = 2 ] && python3 -c "import mok, sys; sys.exit(0 if mok.has_cuda_kernels() else 1)" 2>/dev/null; then
    SKIP_BUILD=1  # the warm machine's build of part 1
fi
source "$(dirname "$0")/gpu_session.sh"
if [ "$PART" != 2 ]; then
    if [ -n "${FULL_SUITE:-}" ]; then
        run_gpu_suite
    else
        files="tests/test_weight_codes.py tests/test_transpose_codes.py tests/test_split_gate_up_recipes.py"
        [ "$PART" = all ] || files="$files tests/test_fp8_experts.py"
        timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider $files > "$OUT/weight_codes_tests.txt" 2>&1
        echo "tests ($((SECONDS - T0)) s): $(tail -1 "$OUT/weight_codes_tests.txt")"
        grep -E "^FAILED" "$OUT/weight_codes_tests.txt" | head -10
    fi
    timeout 90 python3 - <<'PY' 2>&1 | tee "$OUT/weight_codes_timing.txt"
import torch
import mok
from benchmarks import common
dev = torch.device("cuda")
bench = lambda fn: common.bench(fn, dev, iters=10, warmup=2, flush_l2=True)["median_ms"]  # noqa: E731
for name, shape in (("mixtral w1", (8, 28672, 4096)), ("mixtral w2", (8, 4096, 14336)), ("qwen3 w1", (128, 1536, 2048))):
    q = torch.randint(0, 255, shape, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    same = torch.equal(torch.ops.mok.transpose_fp8_codes(q).view(torch.uint8), q.view(torch.uint8).transpose(1, 2))
    cells = []
    for label, fn in (("copy", lambda i: q.clone()), ("mok", lambda i: torch.ops.mok.transpose_fp8_codes(q)),
                      ("torch", lambda i: q.transpose(1, 2).contiguous())):
        ms = bench(fn)
        cells.append(f"{label} {ms:.3f} ms ({2 * q.numel() / ms / 1e9:.2f} TB/s)")
    print(f"transpose {name} {tuple(shape)}: " + " | ".join(cells) + f" | same bytes: {same}", flush=True)
    w = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    q = None
    fused = torch.ops.mok.quantize_fp8_weight_rowcol(w)
    two = mok.fp8_gemm.quantize_weight_blockwise(w)
    two = two + (torch.ops.mok.transpose_fp8_codes(two[0]), two[1].transpose(1, 2).contiguous())
    same = all(torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a, b.view(torch.uint8) if
                           b.dtype != torch.float32 else b) for a, b in zip(fused, two))
    nbytes = 4 * w.numel()  # bf16 read, both codes written (scales negligible)
    cells = []
    for label, fn in (("quant", lambda i: mok.fp8_gemm.quantize_weight_blockwise(w)),
                      ("quant+torch", lambda i: mok.fp8_gemm.quantize_weight_blockwise(w)[0].transpose(1, 2).contiguous()),
                      ("quant+mok", lambda i: torch.ops.mok.transpose_fp8_codes(mok.fp8_gemm.quantize_weight_blockwise(w)[0])),
                      ("fused", lambda i: torch.ops.mok.quantize_fp8_weight_rowcol(w))):
        ms = bench(fn)
        cells.append(f"{label} {ms:.3f} ms ({nbytes / ms / 1e9:.2f})")
    print(f"weight codes {name}: " + " | ".join(cells) + f" | same bits: {same}", flush=True)
    w = fused = two = None
    torch.cuda.empty_cache()
PY
fi
if [ "$PART" != 1 ]; then
    SHAPES=${SHAPES:-qwen3_30b_a3b,mixtral_8x7b,dsv3_ep8_slice}
    ROUNDS=${ROUNDS:-2}
    for codes in torch transpose fused; do
        timeout 150 python3 benchmarks/bench_titan_experts.py --shapes "$SHAPES" --rounds "$ROUNDS" --recipe blockwise \
            --fp8-backward all_tiled --requantise --weight-codes $codes --out "/tmp/titan_$codes.json" \
            > "/tmp/titan_$codes.txt" 2>&1
        echo "== bench_titan_experts --weight-codes $codes ($((SECONDS - T0)) s)"
        cat "/tmp/titan_$codes.md" >> "$OUT/titan_weight_codes.md" 2>/dev/null || tail -5 "/tmp/titan_$codes.txt"
    done
    grep -E "^\| (qwen3|mixtral|dsv3)" "$OUT/titan_weight_codes.md" | cut -c1-120
fi
echo "done ($((SECONDS - T0)) s)"
