"""torchtitan's expert weights (w1 gate and w3 up as two tensors) through mok, in one run on the
same inputs: the (w1, w3) pair that MokTitanGroupedExperts now passes (the BF16 kernels read the
halves and write their gradients where they are), the concatenation per call it made before
(torch.cat([w1, w3], 1): a copy of both weights in the forward and of their gradients in the
backward, made contiguous when autograd stores them in .grad), and mok's own [E, 2I, H] layout (a
single weight tensor: the bound). fwd and fwd+bwd ms (a training step's backward() into .grad),
and the pair's and the concatenation's outputs compared bit for bit (the run fails on a difference).
Under the FP8 / MXFP8 recipes the weights' codes are cached per version: the cat per call defeats that
cache (a new tensor each call), the pair and the single weight keep it. --requantise drops the cached
codes before every timed call, as an optimizer step between calls would (one quantisation per step);
without it the codes are reused, as in the micro-batches of gradient accumulation.

    python benchmarks/bench_titan_experts.py                   # Qwen3-30B-A3B, Mixtral, DeepSeek-V3 slice
    python benchmarks/bench_titan_experts.py --recipe blockwise --fp8-backward all_tiled [--requantise]
        [--weight-codes {torch,transpose,fused}]
    python benchmarks/bench_titan_experts.py --quick           # CPU smoke test

Routing is balanced (bench_moe_layer.py's); the L2 is flushed between timed calls."""
import argparse
import functools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.bench_moe_layer import SHAPES, Config, make_routing, selected_shapes  # noqa: E402

DEFAULT_SHAPES = ("qwen3_30b_a3b", "mixtral_8x7b", "dsv3_ep8_slice")
COLUMNS = [("shape", "shape", ""), ("recipe", "recipe", ""), ("impl", "impl", ""), ("fwd_ms", "fwd ms", ".3f"),
           ("fwd_bwd_ms", "fwd+bwd ms", ".3f"), ("vs_cat", "vs cat per call", ".3f"),
           ("vs_fused", "vs one [E, 2I, H] weight", ".3f"), ("same", "same bits as cat", "")]
IMPLS = ("fused", "pair", "cat")
# --fp8-backward: the blockwise recipe's backward options (mok.functional.moe_experts' fp8_dgrad, fp8_wgrad)
FP8_BACKWARD = {"none": {}, "dgrad": dict(fp8_dgrad=True), "wgrad": dict(fp8_wgrad=True),
                "all": dict(fp8_dgrad=True, fp8_wgrad=True), "all_tiled": dict(fp8_dgrad=True, fp8_wgrad="tiled")}
# the recipes' shape rules (whole scale blocks along H and I)
RECIPE_BLOCK = {"bf16": 1, "blockwise": 128, "mxfp8": 32}
# --weight-codes: how the weights' W^T codes for the FP8 dgrad are made (mok._fp8_experts' TRANSPOSE_KERNEL and
# FUSED_WEIGHT_CODES)
WEIGHT_CODES = ("torch", "transpose", "fused")


def recipe_options(args):
    """moe_experts' keyword options for --recipe and --fp8-backward."""
    options = dict(recipe=args.recipe)
    if args.recipe == "blockwise":
        options.update(FP8_BACKWARD[args.fp8_backward])
    return options


def recipe_label(args):
    return args.recipe + (f"/{args.fp8_backward}" if args.recipe == "blockwise" else "") + \
        ("/requantise" if args.requantise else "") + (f"/codes-{args.weight_codes}" if args.weight_codes else "")


def run_shape(name, T, H, I, E, K, args, dev):
    g = torch.Generator(device=dev).manual_seed(args.seed)
    bf16 = dict(device=dev, dtype=torch.bfloat16)
    idx = make_routing(Config(name, T, H, I, E, K, "balanced"), dev, g)
    x = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16).requires_grad_()
    w = torch.softmax(torch.randn(T, K, device=dev, generator=g), dim=-1).requires_grad_()
    gate_up = (torch.randn(E, 2 * I, H, device=dev, generator=g) * H ** -0.5).to(torch.bfloat16).requires_grad_()
    w1 = gate_up.detach()[:, :I].contiguous().requires_grad_()
    w3 = gate_up.detach()[:, I:].contiguous().requires_grad_()
    w2 = (torch.randn(E, H, I, device=dev, generator=g) * I ** -0.5).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(T, H, **bf16)
    experts = functools.partial(mok.functional.moe_experts, **recipe_options(args))
    calls = {
        "fused": (lambda: experts(x, idx, w, gate_up, w2), [x, w, gate_up, w2]),
        "pair": (lambda: experts(x, idx, w, (w1, w3), w2), [x, w, w1, w3, w2]),
        "cat": (lambda: experts(x, idx, w, torch.cat([w1, w3], dim=1), w2), [x, w, w1, w3, w2]),
    }

    weights = (gate_up, w1, w3, w2)

    def timed(fn):
        if args.requantise:  # codes remade in every call, as after an optimizer step
            def fn(i, call=fn):
                mok._fp8_experts.drop_cached_codes(*weights)
                return call(i)
        return common.bench(fn, dev, iters=args.iters, warmup=args.warmup, flush_l2=args.flush_l2)["median_ms"]

    outs, times = {}, {impl: ([], []) for impl in IMPLS}
    for impl in IMPLS:
        fwd, params = calls[impl]
        y = fwd()
        outs[impl] = [y.detach()] + [t.detach() for t in torch.autograd.grad(y, params, dy)]
        del y
    # rounds interleave the impls (every other round in reverse order), so clock drift under the
    # power limit falls on all of them alike; the medians are reported
    for rnd in range(args.rounds):
        for impl in (IMPLS if rnd % 2 == 0 else IMPLS[::-1]):
            fwd, params = calls[impl]

            def step(_i, fwd=fwd, params=params):
                # as a training step does: backward() into fresh .grad tensors, which autograd makes
                # contiguous (the concatenation's gradient halves are strided views: copied there)
                for t in params:
                    t.grad = None
                fwd().backward(dy)

            times[impl][0].append(timed(lambda _i, fwd=fwd: fwd()))
            times[impl][1].append(timed(step))
    rows = [dict(shape=name, recipe=recipe_label(args), impl=impl, fwd_ms=statistics.median(times[impl][0]),
                 fwd_bwd_ms=statistics.median(times[impl][1])) for impl in IMPLS]
    same = len(outs["pair"]) == len(outs["cat"]) and all(torch.equal(a, b) for a, b in zip(outs["pair"], outs["cat"]))
    cat_ms = rows[IMPLS.index("cat")]["fwd_bwd_ms"]
    fused_ms = rows[IMPLS.index("fused")]["fwd_bwd_ms"]
    for r in rows:
        r["vs_cat"] = cat_ms / r["fwd_bwd_ms"]
        r["vs_fused"] = fused_ms / r["fwd_bwd_ms"]
        r["same"] = ("yes" if same else "NO") if r["impl"] == "pair" else "-"
        print(f"   {name:16s} {r['impl']:6s} fwd {r['fwd_ms']:8.3f} ms  fwd+bwd {r['fwd_bwd_ms']:8.3f} ms  "
              f"x{r['vs_cat']:.3f} of cat  same bits: {r['same']}", flush=True)
    del outs
    common.free_memory(dev)
    return rows, same


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"comma list from {', '.join(SHAPES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (medians reported)")
    p.add_argument("--recipe", choices=tuple(RECIPE_BLOCK), default="bf16")
    p.add_argument("--fp8-backward", choices=tuple(FP8_BACKWARD), default="none",
                   help="with --recipe blockwise: which backward GEMMs run in FP8 (all_tiled: fp8_wgrad='tiled')")
    p.add_argument("--requantise", action="store_true",
                   help="drop the weights' cached codes before every timed call (one quantisation per step)")
    p.add_argument("--weight-codes", choices=WEIGHT_CODES, default=None,
                   help="how the FP8 dgrad's W^T codes are made (default: the library's, fused): torch (quantise, "
                        "torch's transpose), transpose (mok's byte transpose, v65), fused (one kernel makes both, v66)")
    common.add_common_args(p, "bench_titan_experts", iters=20, warmup=3)
    args = p.parse_args(argv)
    if args.weight_codes is not None:
        mok._fp8_experts.TRANSPOSE_KERNEL = args.weight_codes == "transpose"
        mok._fp8_experts.FUSED_WEIGHT_CODES = args.weight_codes == "fused"
    dev, env = common.start_run(args)
    rows, bad = [], []
    block = RECIPE_BLOCK[args.recipe]
    for name, dims in selected_shapes(args):
        _T, H, I, _E, _K = dims
        if H % block or I % block:
            print(f"   {name}: skipped (recipe={args.recipe} needs H and I multiples of {block})")
            continue
        r, same = run_shape(name, *dims, args, dev)
        rows += r
        if not same:
            bad.append(name)
    print("\n" + common.format_table(rows, COLUMNS))
    notes = ["fused: one [E, 2I, H] weight (mok's own layout); pair: functional.moe_experts(..., (w1, w3), ...), "
             "what MokTitanGroupedExperts runs; cat: torch.cat([w1, w3], 1) per call, what it ran before. "
             "Ratios are of fwd+bwd. 'same bits': y and every gradient of the pair equal the concatenation's. "
             f"Medians of {args.rounds} interleaved rounds; L2 flush between timed calls: {args.flush_l2}; "
             f"iters {args.iters}. recipe {recipe_label(args)}: "
             + ("the weights' cached codes dropped before every timed call (one quantisation per step)."
                if args.requantise else "cached codes reused between calls (the cat remakes them every call).")]
    common.write_results(args.out, env, rows, COLUMNS, "torchtitan's w1 / w3 through mok", notes)
    if bad:
        print("DIFFERENT BITS in " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
