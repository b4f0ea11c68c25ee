"""SwiGLU with its result quantised in the same pass (torch.ops.mok.swiglu_quantize_fp8, the FP8 layer's
path between its two GEMMs) against the two ops it replaces (swiglu / swiglu_backward, then
quantize_fp8_rowcol or quantize_fp8), and a plain copy of h for the memory's ceiling, in one run on the
same inputs: h [R, 2I] and d_act [R, I] of each layer shape (R = T * K rows).

    python benchmarks/bench_swiglu_quant.py            # on the GPU
    python benchmarks/bench_swiglu_quant.py --quick    # CPU smoke test

Rows: fwd (act's row-wise and column-wise codes: the all-FP8 layer's forward), fwd rows+bf16 (act's
row-wise codes and act: the layer with BF16 weight gradients), bwd (d_h's row- and column-wise codes),
bwd rows+bf16 (FP8 dgrad, BF16 weight gradient); fwd scaled / bwd scaled: the row-scaled op
swiglu_scaled_quantize_fp8 as the all-FP8 node calls it (v53: z's column-wise codes forward, d_h's codes
and the d_s sums backward, MN-major scales), whose "two ops" column is the unscaled one-kernel op in the
same configuration, so its speed-up is the cost of the row scales and sums (below 1). "speed-up" is the
two ops' time over the fused op's;
TB/s counts the fused op's bytes (h, d_act, codes, scales, the bf16 result where kept). The L2 is
flushed between timed calls."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import common  # noqa: E402

ops = torch.ops.mok
RECIPE = "blockwise_1x128"
# name -> (R, I): the rows and intermediate size of bench_moe_layer.py's shapes
SHAPES = {"qwen3_30b_a3b": (16384 * 8, 768), "mixtral_8x7b": (8192 * 2, 14336), "dsv3_ep8_slice": (8192 * 8, 2048)}
QUICK_SHAPES = {"tiny": (300, 256)}
COLUMNS = [("shape", "shape", ""), ("case", "case", ""), ("fused_ms", "fused ms", ".3f"),
           ("two_ops_ms", "two ops ms", ".3f"), ("speedup", "speed-up", ".2f"), ("tbps", "fused TB/s", ".2f"),
           ("vs_copy", "vs copy", ".2f")]


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p, "bench_swiglu_quant", iters=20, warmup=3)
    args = p.parse_args(argv)
    dev, env = common.start_run(args)
    rows = []
    for name, (R, I) in (QUICK_SHAPES if args.quick else SHAPES).items():
        h = torch.randn(R, 2 * I, device=dev, dtype=torch.bfloat16)
        d_act = torch.randn(R, I, device=dev, dtype=torch.bfloat16)
        row_scale = torch.rand(R, device=dev)
        timed = lambda fn: common.bench(fn, dev, iters=args.iters, warmup=args.warmup,  # noqa: E731
                                        flush_l2=args.flush_l2)["median_ms"]
        copy_ms = timed(lambda _i: h.clone())
        copy_tbps = 2 * nbytes([h]) / copy_ms / 1e9
        cases = {
            "fwd": (None, True, True, False,
                    lambda _i: ops.quantize_fp8_rowcol(ops.swiglu(h), RECIPE)),
            "fwd rows+bf16": (None, True, False, True,
                              lambda _i: ops.quantize_fp8(ops.swiglu(h), RECIPE)),
            "bwd": (d_act, True, True, False,
                    lambda _i: ops.quantize_fp8_rowcol(ops.swiglu_backward(h, d_act), RECIPE)),
            "bwd rows+bf16": (d_act, True, False, True,
                              lambda _i: ops.quantize_fp8(ops.swiglu_backward(h, d_act), RECIPE)),
        }
        scaled = {
            "fwd scaled": (None, lambda _i: ops.swiglu_quantize_fp8(h, None, True, True, False, True)),
            "bwd scaled": (d_act, lambda _i: ops.swiglu_quantize_fp8(h, d_act, True, True, False, True)),
        }
        for case, (da, unscaled) in scaled.items():
            cases[case] = (da, True, True, False, unscaled)
        for case, (da, r, c, keep, two_ops) in cases.items():
            if case in scaled:
                fused = lambda _i, da=da: ops.swiglu_scaled_quantize_fp8(h, da, row_scale, True, True, True)  # noqa: E731
            else:
                fused = lambda _i, da=da, r=r, c=c, keep=keep: ops.swiglu_quantize_fp8(h, da, r, c, keep)  # noqa: E731
            moved = nbytes([h] + ([da] if da is not None else []) + list(fused(0)))
            fused_ms, two_ms = timed(fused), timed(two_ops)
            tbps = moved / fused_ms / 1e9
            rows.append(dict(shape=name, case=case, fused_ms=fused_ms, two_ops_ms=two_ms, speedup=two_ms / fused_ms,
                             tbps=tbps, vs_copy=tbps / copy_tbps))
        h = d_act = row_scale = None  # (not del: pyflakes reads the lambdas above as using deleted names)
        common.free_memory(dev)
    print("\n" + common.format_table(rows, COLUMNS))
    common.write_results(args.out, env, rows, COLUMNS, "SwiGLU + FP8 quantisation: one op against two",
                         ["fused: torch.ops.mok.swiglu_quantize_fp8; two ops: swiglu(_backward) then "
                          "quantize_fp8_rowcol (or quantize_fp8). Scaled rows: swiglu_scaled_quantize_fp8 against "
                          "the unscaled fused op (MN-major scales both).",
                          "TB/s: the fused op's bytes (h, d_act, codes, scales, the kept bf16 result) / time; "
                          "vs copy: against h.clone()'s TB/s."])


if __name__ == "__main__":
    main()
