"""The MoE layer's row-movement kernels against the device copy ceiling, in one run on the same plan:
gather_rows (token rows to expert-sorted rows: the forward's x_rows, the combine backward's d_rows)
walked by output row and, for plain copies, walked by token (row_of given: x read once; the kernel
takes that walk for 4 <= K <= 32 only, so at Mixtral's K = 2 both rows time the same kernel), the
weighted gather, and combine (the forward's y; the backward of gather). TB/s of the bytes that must
move (each source row read once, each destination row written once) and that rate against a plain
copy (x_rows.clone()) of the same destination size.

    python benchmarks/bench_rows.py                      # Qwen3-30B-A3B, Mixtral, DeepSeek-V3 slice
    python benchmarks/bench_rows.py --quick              # CPU smoke test

The token walk's output is compared with the per-row gather's, bit for bit (the run fails on a
difference). Routing is balanced (bench_moe_layer.py's); the L2 is flushed between timed calls."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402,F401  (registers torch.ops.mok)
from benchmarks import common  # noqa: E402
from benchmarks.bench_moe_layer import SHAPES, Config, make_routing, selected_shapes  # noqa: E402

DEFAULT_SHAPES = ("qwen3_30b_a3b", "mixtral_8x7b", "dsv3_ep8_slice")
COLUMNS = [("shape", "shape", ""), ("impl", "impl", ""), ("T", "T", "d"), ("H", "H", "d"), ("K", "K", "d"),
           ("ms", "ms", ".3f"), ("tbps", "TB/s", ".2f"), ("vs_copy", "vs copy", ".2f"), ("same", "same bits", "")]


def run_shape(name, T, H, E, K, args, dev):
    g = torch.Generator(device=dev).manual_seed(args.seed)
    idx = make_routing(Config(name, T, H, 0, E, K, "balanced"), dev, g)
    x = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
    w = torch.softmax(torch.randn(T, K, device=dev, generator=g), dim=-1)
    plan = mok.functional.moe_plan(idx, E)
    ops = torch.ops.mok
    src, row_of = plan.src_of_row, plan.row_of
    R = src.shape[0]
    x_rows = ops.gather_rows(x, src, None, K)
    # bytes that must move: T source rows read, R rows written (gather); R rows read, T written (combine)
    move = 2 * H * (T + R)

    def timed(fn):
        return common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)["median_ms"]

    copy_ms = timed(lambda _i: x_rows.clone())
    copy_tbps = 4 * R * H / copy_ms / 1e9
    rows = [dict(shape=name, impl="copy x_rows", T=T, H=H, K=K, ms=copy_ms, tbps=copy_tbps, vs_copy=1.0, same="-")]
    variants = {
        "gather by row": (lambda _i: ops.gather_rows(x, src, None, K), x_rows),
        "gather by token": (lambda _i: ops.gather_rows(x, src, None, K, row_of), x_rows),
        "gather w": (lambda _i: ops.gather_rows(x, src, w, K), None),
        "combine w": (lambda _i: ops.combine(x_rows, row_of, src, w), None),
    }
    outs = {}
    bad = []
    for impl, (fn, want) in variants.items():
        outs[impl] = fn(0)
        ref = outs.get(want) if isinstance(want, str) else want
        same = "-" if ref is None else ("yes" if torch.equal(outs[impl], ref) else "NO")
        if same == "NO":
            bad.append(f"{name}/{impl}")
        ms = timed(fn)
        tbps = move / ms / 1e9
        rows.append(dict(shape=name, impl=impl, T=T, H=H, K=K, ms=ms, tbps=tbps, vs_copy=tbps / copy_tbps, same=same))
        print(f"   {name:16s} {impl:18s} {ms:8.3f} ms {tbps:6.2f} TB/s  x{tbps / copy_tbps:.2f} of copy  "
              f"same bits: {same}", flush=True)
    del outs
    common.free_memory(dev)
    return rows, bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"comma list from {', '.join(SHAPES)}")
    p.add_argument("--seed", type=int, default=0)
    common.add_common_args(p, "bench_rows", iters=20, warmup=3)
    args = p.parse_args(argv)
    dev, env = common.start_run(args)
    rows, bad = [], []
    for name, (T, H, _I, E, K) in selected_shapes(args):
        r, b = run_shape(name, T, H, E, K, args, dev)
        rows += r
        bad += b
    print("\n" + common.format_table(rows, COLUMNS))
    notes = ["TB/s = 2 bytes x H x (T + R) / time (each token row and each expert row once); the copy moves "
             "2 x R x H bytes each way. 'same bits': equal to the per-row gather. "
             f"L2 flush between timed calls: {args.flush_l2}; iters {args.iters}."]
    common.write_results(args.out, env, rows, COLUMNS, "Row movement: gather_rows and combine", notes)
    if bad:
        print("DIFFERENT BITS in " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
