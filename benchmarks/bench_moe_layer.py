"""Routed-expert MLP of one MoE layer, forward and backward: mok.functional.moe_experts against the
torchtitan-style torch._grouped_mm experts (eager and torch.compile'd) and the naive per-expert loop,
on the same inputs (x, weights, routing) in one run. 'mok_fp8' is mok with recipe="blockwise" (FP8
forward GEMMs, BF16 backward; H and I multiples of 128), 'mok_fp8_dgrad' the same with the two dgrad
GEMMs of the backward in FP8 too, 'mok_fp8_all' with the two weight-gradient GEMMs in FP8 as well
(fp8_dgrad=True, fp8_wgrad=True: every expert GEMM in FP8), 'mok_fp8_all_tiled' the same with
fp8_wgrad="tiled" (the activations' column-wise copies in 128 x 128 tiles, v50: the weight gradients'
cheaper promotion); both as one autograd node from x to y by default (SwiGLU with its result's FP8
copies in one kernel both ways, v52), 'mok_fp8_all_3nodes' and 'mok_fp8_all_tiled_3nodes' the same as
three nodes (mok._fp8_experts.FUSED_MLP_COMBINE=False; same bits), 'mok_fp8_all_rgs' and
'mok_fp8_all_tiled_rgs' the one node with the router-weight gradient from d_z's side in SwiGLU's backward
instead of combine_weight_grad over the rows (ROUTER_GRAD_IN_SWIGLU=True, v53, opt-in);
'mok_fp8_all_tiled_pertile' the tiled one node with SwiGLU's kernels per tile instead of streamed
(MOK_SWIGLU_STREAM=0, v54/v55; same bits), 'mok_fp8_all_tiled_fwdstream' with the forward's streamed and the
backward's per tile (MOK_SWIGLU_STREAM=fwd, v54's default), 'mok_fp8_all_tiled_rcstream' with the experimental streamed rowcol
quantiser for x_rows' and d_rows' copies (MOK_QUANT_ROWCOL_STREAM=1; same bits);
'mok_fp8_all_bf16_gather' the same with
x_rows' and d_rows' FP8 copies made from the bf16 gathers instead of straight from x and dy
(GATHER_QUANT=False, v45/v46; same bits), 'mok_fp8_all_fused' the same with the
forward's GEMM1 as the fused SwiGLU GEMM instead of the plain FP8 GEMM then the SwiGLU op (same bits),
'mok_fp8_dgrad_swq' and 'mok_fp8_all_swq' with the opt-in one-node path whose SwiGLU quantises its
result in the same kernel both ways, 'mok_fp8_all_swq_fwd' in the forward only
(mok._fp8_experts.FUSED_SWIGLU_QUANT, v39; same bits), 'mok_mxfp8' recipe="mxfp8" (every GEMM
on MXFP8-rounded operands, run on the BF16 kernels), 'mok_mxfp8_bf16_gather' the same with x_rows' and
d_rows' qdq copies made from bf16 gathers (mok._mxfp8_experts.GATHER_QDQ=False, v48; same bits),
'mok_mxfp8_qdq_gemm' the same with the row-wise qdq of x_rows, act and d_h made by the GEMMs as they load
them (mok._mxfp8_experts.QDQ_IN_GEMM=True, v59; same bits), all
compared with the BF16 layers at the FP8 tolerance; 'vs mok' is mok's BF16 fwd+bwd time over the row's.

    python benchmarks/bench_moe_layer.py                       # every shape, balanced and skewed routing
    python benchmarks/bench_moe_layer.py --shapes qwen3_30b_a3b --routing balanced --iters 50
    python benchmarks/bench_moe_layer.py --quick               # tiny shapes, CPU smoke test
    python benchmarks/bench_moe_layer.py --rounds 3            # fwd+bwd timed 3 times, interleaved

The H200 runs these layers at its power limit, and its clock drifts within a run (RESULTS v8, v10):
one sweep's ratio can move by 5-10% between runs. --rounds R repeats the fwd+bwd timing of every
impl R times in turn (rounds 2, 4, ... in the reverse order) and reports the median and the range of
the per-round ratios to eager.

bf16 activations and weights, fp32 routing weights. Times are medians of CUDA-event timings after
warm-up, with a 256 MB L2 flush between timed calls. fwd is a forward with autograd recording (as in
training); fwd+bwd is forward plus torch.autograd.grad for x, topk_w and both weights; bwd is their
difference. TFLOP/s counts 3x the forward expert-GEMM FLOPs of the T*K real rows over fwd+bwd.
Peak GiB is the memory one fwd+bwd allocates beyond the inputs and weights."""
import argparse
import contextlib
import functools
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import baselines, common  # noqa: E402

# name -> (T tokens, H hidden, I expert intermediate, E experts, K top-k)
SHAPES = {
    "qwen3_30b_a3b": (16384, 2048, 768, 128, 8),
    "mixtral_8x7b": (8192, 4096, 14336, 8, 2),
    "dsv3_ep8_slice": (8192, 7168, 2048, 32, 8),
    "olmoe": (16384, 2048, 1024, 64, 8),
    "gpt_oss_20b_like": (8192, 2880, 2880, 32, 4),
}
QUICK_SHAPES = {
    "tiny": (64, 64, 32, 4, 2),
    "tiny_h128": (64, 128, 128, 4, 2),  # whole 128-wide FP8 scale blocks
    "tiny_e8": (96, 64, 48, 8, 3),
}
ROUTINGS = ("balanced", "skewed")
ZIPF_EXPONENT = 1.2
# eager first: the reference for errors and ratios
IMPLS = ("eager", "mok", "mok_fp8", "mok_fp8_dgrad", "mok_fp8_all", "mok_fp8_all_tiled", "mok_fp8_all_3nodes",
         "mok_fp8_all_tiled_3nodes", "mok_fp8_all_rgs", "mok_fp8_all_tiled_rgs", "mok_fp8_all_tiled_pertile",
         "mok_fp8_all_tiled_fwdstream", "mok_fp8_all_tiled_rcstream", "mok_fp8_all_bf16_gather", "mok_fp8_all_fused", "mok_fp8_dgrad_swq",
         "mok_fp8_all_swq", "mok_fp8_all_swq_fwd", "mok_mxfp8", "mok_mxfp8_bf16_gather", "mok_mxfp8_qdq_gemm", "compiled", "naive")
NAIVE_MAX_S = 1.0  # --naive auto: time the naive loop only if one fwd+bwd takes less than this
ERR_TOL = 2e-2
ERR_TOL_FP8 = 0.12  # E4M3 operands in both forward GEMMs: ~0.065 against the BF16 layer (tests/test_fp8_experts.py)


@dataclass(frozen=True)
class Config:
    shape: str
    T: int
    H: int
    I: int
    E: int
    K: int
    routing: str


@dataclass(frozen=True)
class Result:
    shape: str
    routing: str
    impl: str
    fwd_ms: float
    bwd_ms: float
    fwd_bwd_ms: float
    fwd_tflops: float
    tflops: float  # fwd+bwd
    peak_gib: float
    saved_gib: float  # held from the forward to the backward (autograd graph and y)
    speedup: float  # eager fwd+bwd ms / this fwd+bwd ms
    vs_mok: float  # mok (bf16) fwd+bwd ms / this fwd+bwd ms
    err_y: float  # ||y - y_eager|| / ||y_eager||
    err_grad: float  # max over x, topk_w, gate_up_proj, down_proj of the same for the gradient
    note: str = ""
    # --rounds R > 1: fwd_bwd_ms is the median over R interleaved rounds; the smallest and largest
    # per-round 'vs eager' ratios (each round times every impl once; even rounds in reverse order)
    speedup_lo: float = math.nan
    speedup_hi: float = math.nan


def selected_shapes(args) -> List[tuple]:
    """(name, (T, H, I, E, K)) for a script's --shapes comma list, or every quick shape with --quick;
    an unknown name exits with the known ones."""
    table = QUICK_SHAPES if args.quick else SHAPES
    names = list(QUICK_SHAPES) if args.quick else args.shapes.split(",")
    for name in names:
        if name not in table:
            raise SystemExit(f"unknown shape {name!r}; choose from {', '.join(table)}")
    return [(name, table[name]) for name in names]


def get_configs(shapes: List[str], routings: List[str], quick: bool) -> List[Config]:
    table = QUICK_SHAPES if quick else SHAPES
    if quick and shapes == list(SHAPES):
        shapes = list(QUICK_SHAPES)
    for s in shapes:
        if s not in table:
            raise SystemExit(f"unknown shape {s!r}; choose from {', '.join(table)}")
    for r in routings:
        if r not in ROUTINGS:
            raise SystemExit(f"unknown routing {r!r}; choose from {', '.join(ROUTINGS)}")
    return [Config(s, *table[s], r) for s in shapes for r in routings]


def make_routing(cfg: Config, device, gen) -> torch.Tensor:
    """topk_idx [T, K] int32, K distinct experts per token, sampled on the device in one shot:
    Gumbel top-k = sampling K experts without replacement from p. balanced: p uniform; skewed:
    p_e proportional to 1 / (e + 1)^1.2 (expert 0 the hottest)."""
    T, E, K = cfg.T, cfg.E, cfg.K
    u = torch.rand(T, E, device=device, generator=gen).clamp_(1e-20, 1.0)
    if cfg.routing == "balanced":
        scores = u  # top-k of i.i.d. uniforms: a uniform random K-subset
    else:
        logp = -ZIPF_EXPONENT * torch.log(torch.arange(1, E + 1, device=device, dtype=torch.float32))
        scores = logp - torch.log(-torch.log(u))  # + Gumbel noise
    return scores.topk(K, dim=-1).indices.to(torch.int32)


def make_inputs(cfg: Config, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    bf16 = dict(device=device, dtype=torch.bfloat16, generator=g)
    T, H, I, E, K = cfg.T, cfg.H, cfg.I, cfg.E, cfg.K
    x = torch.randn(T, H, **bf16).requires_grad_()
    gate_up = torch.randn(E, 2 * I, H, **bf16).mul_(H ** -0.5).requires_grad_()
    down = torch.randn(E, H, I, **bf16).mul_(I ** -0.5).requires_grad_()
    idx = make_routing(cfg, device, g)
    w = torch.softmax(torch.randn(T, K, device=device, generator=g), dim=-1).requires_grad_()  # fp32
    dy = torch.randn(T, H, **bf16)
    return (x, idx, w, gate_up, down), dy


def expert_load(idx: torch.Tensor, E: int) -> str:
    counts = torch.bincount(idx.reshape(-1).long(), minlength=E).float()
    return f"tokens/expert min {counts.min().item():.0f} mean {counts.mean().item():.0f} max {counts.max().item():.0f}"


@contextlib.contextmanager
def _env(settings: Dict[str, str]):
    """The environment variables set while the block runs (the kernel launchers' switches)."""
    old = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def step_fns(fn: Callable, inputs, dy):
    """(fwd, fwd_bwd) of one implementation on the inputs, as common.bench takes them; an impl with an
    `env` attribute (_with_env) runs forward and backward with those environment variables set."""
    x, idx, w, gate_up, down = inputs
    params = [x, w, gate_up, down]
    env = getattr(fn, "env", {})

    def fwd(_i=0):
        with _env(env):
            return fn(x, idx, w, gate_up, down)

    def fwd_bwd(_i=0):
        with _env(env):
            return torch.autograd.grad(fn(x, idx, w, gate_up, down), params, dy)

    return fwd, fwd_bwd


def layer_steps(dev, shapes: List[str], routing: str, impls: List[str], quick: bool = False):
    """(cfg, impl, step) per shape and impl, for the scripts that look inside a step (trace_moe_layer.py,
    host_pace.py): step() is one fwd+bwd as this bench times it (step_fns: autograd.grad for x, topk_w and
    both weights, an impl's environment switches set). quick: the first tiny shape instead of `shapes`. Each
    shape's inputs are freed once its impls are done."""
    table = impl_table(dev)
    for cfg in get_configs(list(QUICK_SHAPES)[:1] if quick else shapes, [routing], quick):
        inputs, dy = make_inputs(cfg, dev)
        for impl in impls:
            yield cfg, impl, step_fns(table[impl], inputs, dy)[1]
        inputs = dy = None
        common.free_memory(dev)


def add_step_args(p, default_impls: str):
    """The options of the scripts built on layer_steps(): --shapes, --routing, --impls, --device, --quick."""
    p.add_argument("--shapes", default="qwen3_30b_a3b", help=f"comma list from {', '.join(SHAPES)}")
    p.add_argument("--routing", default="balanced", choices=ROUTINGS)
    p.add_argument("--impls", default=default_impls,
                   help=f"comma list from {', '.join(n for n in IMPLS if n != 'compiled')}")
    p.add_argument("--device", default=None)
    p.add_argument("--quick", action="store_true", help="tiny shapes, for a CPU smoke test")


def steps_of_args(p, args, dev):
    """layer_steps() for add_step_args()'s options; an impl not in IMPLS (or 'compiled') is the parser's error."""
    impls = args.impls.split(",")
    unknown = [n for n in impls if n not in IMPLS or n == "compiled"]
    if unknown:
        p.error(f"--impls: unknown {', '.join(unknown)} (known: {', '.join(IMPLS)}, not compiled)")
    return layer_steps(dev, args.shapes.split(","), args.routing, impls, args.quick)


def measure(cfg: Config, name: str, fn: Callable, inputs, dy, args, ref: Optional[Dict]) -> Dict:
    """Times one implementation; returns the Result fields (no ratios yet) and its outputs."""
    x, idx, w, gate_up, down = inputs
    params = [x, w, gate_up, down]
    dev = x.device
    fwd, fwd_bwd = step_fns(fn, inputs, dy)

    flops = common.moe_fwd_flops(cfg.T, cfg.H, cfg.I, cfg.K)
    row = dict(shape=cfg.shape, routing=cfg.routing, impl=name, fwd_ms=math.nan, bwd_ms=math.nan,
               fwd_bwd_ms=math.nan, fwd_tflops=math.nan, tflops=math.nan, peak_gib=math.nan, saved_gib=math.nan, speedup=math.nan, vs_mok=math.nan,
               err_y=math.nan, err_grad=math.nan, note="")
    iters, warmup = args.iters, args.warmup
    if name == "naive":
        t = common.time_once_s(fwd_bwd, dev)  # also its warm-up
        if args.naive == "auto" and t > NAIVE_MAX_S:
            row["note"] = f"skipped: {t:.1f} s per fwd+bwd (--naive on to time it)"
            return row
        iters, warmup = min(iters, 3), 0

    # correctness first (one call), then the timings
    y = fwd()
    grads = torch.autograd.grad(y, params, dy)
    out = {"y": y.detach(), "grads": [g.detach() for g in grads]}
    if ref is not None:
        row["err_y"] = common.rel_err(out["y"], ref["y"])
        row["err_grad"] = max(common.rel_err(a, b) for a, b in zip(out["grads"], ref["grads"]))
    del y, grads
    if name != "naive":
        row["fwd_ms"] = common.bench(fwd, dev, iters=iters, warmup=warmup, flush_l2=args.flush_l2)["median_ms"]
    row["fwd_bwd_ms"] = common.bench(fwd_bwd, dev, iters=iters, warmup=warmup, flush_l2=args.flush_l2)["median_ms"]
    row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
    row["fwd_tflops"] = common.tflops(flops, row["fwd_ms"])
    row["tflops"] = common.tflops(3 * flops, row["fwd_bwd_ms"])
    row["peak_gib"] = common.peak_memory_gib(fwd_bwd, dev)
    row["saved_gib"] = common.held_after_gib(fwd, dev)
    row["_out"] = out
    return row


def run(cfg: Config, impls: Dict[str, Callable], args) -> List[Result]:
    dev = common.pick_device(args.device)
    inputs, dy = make_inputs(cfg, dev, seed=args.seed)
    print(f"== {cfg.shape} {cfg.routing}: T={cfg.T} H={cfg.H} I={cfg.I} E={cfg.E} K={cfg.K}; "
          f"{expert_load(inputs[1], cfg.E)}", flush=True)
    rows, ref = [], None
    for name, fn in impls.items():
        try:
            row = measure(cfg, name, fn, inputs, dy, args, ref)
        except Exception as e:  # record and go on: one failing peer must not lose the others
            row = dict(shape=cfg.shape, routing=cfg.routing, impl=name, note=f"error: {e!r}"[:160])
            common.free_memory(dev)
        out = row.pop("_out", None)
        if name == "eager":
            ref = out
        rows.append(row)
        fwd_ms, fb_ms, tf = (row.get(k, math.nan) for k in ("fwd_ms", "fwd_bwd_ms", "tflops"))
        print(f"   {name:9s} fwd {fwd_ms:9.3f} ms  fwd+bwd {fb_ms:9.3f} ms  {tf:7.1f} TFLOP/s  {row.get('note', '')}",
              flush=True)
        del out
    if args.rounds > 1:
        more_rounds(rows, impls, inputs, dy, args, dev)
    base = next((r.get("fwd_bwd_ms") for r in rows if r["impl"] == "eager"), None)
    base_mok = next((r.get("fwd_bwd_ms") for r in rows if r["impl"] == "mok"), None)
    results = []
    for r in rows:
        full = {f: r.get(f, math.nan) for f in Result.__dataclass_fields__}
        full["note"] = r.get("note", "")
        if full["fwd_bwd_ms"] and not math.isnan(full["fwd_bwd_ms"]):
            if base:
                full["speedup"] = base / full["fwd_bwd_ms"]
            if base_mok and not math.isnan(base_mok):
                full["vs_mok"] = base_mok / full["fwd_bwd_ms"]
        results.append(Result(**full))
    for r in results:
        if r.impl != "eager" and not math.isnan(r.err_y):
            tol = err_tol(r.impl)
            ok = r.err_y < tol and r.err_grad < tol
            print(f"   check {r.impl} vs eager: rel err y {r.err_y:.2e}, grads (max) {r.err_grad:.2e} "
                  f"-> {'OK' if ok else 'MISMATCH'} (tol {tol:g})", flush=True)
    del inputs, dy
    common.free_memory(dev)
    return results


def more_rounds(rows: List[Dict], impls: Dict[str, Callable], inputs, dy, args, dev) -> None:
    """Rounds 2..R of fwd+bwd timings, every timed impl once per round (the board's power state drifts
    within a run: interleaving gives each impl the same share of it), the even rounds in the reverse
    order of the first, the odd ones in its order, so that no impl always runs right after the same
    other one (v26 left an order effect open between two impls timed back to back). Sets each row's
    fwd_bwd_ms to the median over the rounds (bwd_ms and tflops follow) and the range of its per-round
    ratio to eager."""
    timed = [r for r in rows if r["impl"] != "naive" and not math.isnan(r.get("fwd_bwd_ms", math.nan))]
    per_round = {r["impl"]: [r["fwd_bwd_ms"]] for r in timed}
    for k in range(2, args.rounds + 1):
        order = list(reversed(timed)) if k % 2 == 0 else timed
        print(f"   round {k} order: " + ", ".join(r["impl"] for r in order), flush=True)
        for r in order:
            _fwd, fwd_bwd = step_fns(impls[r["impl"]], inputs, dy)
            per_round[r["impl"]].append(common.bench(fwd_bwd, dev, iters=args.iters, warmup=args.warmup,
                                                     flush_l2=args.flush_l2)["median_ms"])
    eager = per_round.get("eager")
    for r in timed:
        ms = per_round[r["impl"]]
        r["fwd_bwd_ms"] = statistics.median(ms)
        r["bwd_ms"] = r["fwd_bwd_ms"] - r["fwd_ms"]
        r["tflops"] = r["tflops"] * ms[0] / r["fwd_bwd_ms"]
        if eager:
            ratios = [e / t for e, t in zip(eager, ms)]
            r["speedup_lo"], r["speedup_hi"] = min(ratios), max(ratios)
        print(f"   {r['impl']:9s} fwd+bwd per round: " + ", ".join(f"{t:.3f}" for t in ms) + " ms", flush=True)


COLUMNS = [
    ("shape", "shape", ""), ("routing", "routing", ""), ("impl", "impl", ""),
    ("fwd_ms", "fwd ms", ".3f"), ("bwd_ms", "bwd ms", ".3f"), ("fwd_bwd_ms", "fwd+bwd ms", ".3f"),
    ("tflops", "TFLOP/s", ".1f"), ("peak_gib", "peak GiB", ".2f"),
    ("saved_gib", "saved GiB", ".2f"), ("speedup", "vs eager", ".2f"),
    ("speedup_lo", "lo", ".2f"), ("speedup_hi", "hi", ".2f"), ("vs_mok", "vs mok", ".2f"),
    ("err_y", "err y", ".1e"), ("err_grad", "err grad", ".1e"), ("note", "note", ""),
]


def err_tol(impl: str) -> float:
    return ERR_TOL_FP8 if impl.startswith(("mok_fp8", "mok_mxfp8")) else ERR_TOL


def _with_setting(fn, name, value, module=None):
    """fn with <module>.<name> (default mok._fp8_experts) set to value while it runs (settings that keep
    the same bits)."""
    module = module or mok._fp8_experts

    def run(*args, **kwargs):
        old = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(module, name, old)
    return run


def _with_env(fn, name, value):
    """fn run with the environment variable name=value in its forward and backward (step_fns reads the
    attribute: the launchers read their switches on every call, the backward's after fn returns)."""
    def run(*args, **kwargs):
        return fn(*args, **kwargs)
    run.env = {name: value}
    return run


def _fused_gate_up(fn):
    """fn with the FP8 forward's GEMM1 as the fused SwiGLU kernel instead of the plain FP8 GEMM then the
    SwiGLU op (mok._fp8_experts.FUSED_GATE_UP; the same bits)."""
    return _with_setting(fn, "FUSED_GATE_UP", True)


def _swiglu_quant(fn, backward=True):
    """fn with the opt-in one-node path: SwiGLU fused with the quantisation of act (forward) and, with
    backward, of d_h (mok._fp8_experts.FUSED_SWIGLU_QUANT(_BACKWARD); v39; the same bits). With
    FUSED_MLP_COMBINE off: that node would take the all-FP8 path first."""
    fn = _with_setting(_with_setting(fn, "FUSED_SWIGLU_QUANT_BACKWARD", backward), "FUSED_SWIGLU_QUANT", True)
    return _with_setting(fn, "FUSED_MLP_COMBINE", False)


def impl_table(dev, compiled=False):
    """The routed-expert functions by --impls name (same signature: x, topk_idx, topk_w, gate_up, down);
    'compiled' only when asked (it compiles on first use)."""
    table = {"eager": baselines.grouped_mm_experts, "mok": mok.functional.moe_experts,
             "mok_fp8": functools.partial(mok.functional.moe_experts, recipe="blockwise"),
             "mok_fp8_dgrad": functools.partial(mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True),
             "mok_fp8_all": functools.partial(mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True,
                                              fp8_wgrad=True),
             "mok_fp8_all_tiled": functools.partial(mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True,
                                                    fp8_wgrad="tiled"),
             "mok_fp8_all_3nodes": _with_setting(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True), "FUSED_MLP_COMBINE",
                 False),
             "mok_fp8_all_tiled_3nodes": _with_setting(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"),
                 "FUSED_MLP_COMBINE", False),
             "mok_fp8_all_tiled_pertile": _with_env(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"),
                 "MOK_SWIGLU_STREAM", "0"),
             "mok_fp8_all_tiled_fwdstream": _with_env(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"),
                 "MOK_SWIGLU_STREAM", "fwd"),
             "mok_fp8_all_tiled_rcstream": _with_env(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"),
                 "MOK_QUANT_ROWCOL_STREAM", "1"),
             "mok_fp8_all_rgs": _with_setting(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True),
                 "ROUTER_GRAD_IN_SWIGLU", True),
             "mok_fp8_all_tiled_rgs": _with_setting(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"),
                 "ROUTER_GRAD_IN_SWIGLU", True),
             "mok_fp8_all_bf16_gather": _with_setting(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True), "GATHER_QUANT", False),
             "mok_fp8_all_fused": _fused_gate_up(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True)),
             "mok_fp8_dgrad_swq": _swiglu_quant(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True)),
             "mok_fp8_all_swq": _swiglu_quant(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True)),
             "mok_fp8_all_swq_fwd": _swiglu_quant(functools.partial(
                 mok.functional.moe_experts, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True), backward=False),
             "mok_mxfp8": functools.partial(mok.functional.moe_experts, recipe="mxfp8"),
             "mok_mxfp8_bf16_gather": _with_setting(functools.partial(mok.functional.moe_experts, recipe="mxfp8"),
                                                    "GATHER_QDQ", False, mok._mxfp8_experts),
             "mok_mxfp8_qdq_gemm": _with_setting(functools.partial(mok.functional.moe_experts, recipe="mxfp8"),
                                                 "QDQ_IN_GEMM", True, mok._mxfp8_experts),
             "naive": baselines.naive_experts}
    if compiled:
        table["compiled"] = baselines.compiled_grouped_mm_experts(dev.type, torch.bfloat16)
    return table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list from {', '.join(SHAPES)}")
    p.add_argument("--routing", default=",".join(ROUTINGS), help="comma list from balanced, skewed")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma list from {', '.join(IMPLS)}")
    p.add_argument("--naive", choices=("auto", "on", "off"), default="auto",
                   help=f"auto: time the naive loop only where one fwd+bwd takes < {NAIVE_MAX_S:g} s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every impl's fwd+bwd this many times, interleaved; report the median and the "
                        "range of the per-round 'vs eager' ratios (columns lo, hi)")
    common.add_common_args(p, "bench_moe_layer")
    args = p.parse_args(argv)
    dev, env = common.start_run(args)
    configs = get_configs(args.shapes.split(","), args.routing.split(","), args.quick)

    wanted = args.impls.split(",")
    unknown = [n for n in wanted if n not in IMPLS]
    if unknown:
        p.error(f"--impls: unknown {', '.join(unknown)} (known: {', '.join(IMPLS)})")
    if args.naive == "off" and "naive" in wanted:
        wanted.remove("naive")
    if "eager" not in wanted:
        wanted.insert(0, "eager")  # the reference for errors and ratios
    table = impl_table(dev, compiled="compiled" in wanted)
    impls = {n: table[n] for n in IMPLS if n in wanted}
    if not baselines.grouped_mm_available(dev.type, torch.bfloat16):
        print("# NOTE: torch._grouped_mm does not run here: 'eager' and 'compiled' are the naive loop\n")

    results = [r for cfg in configs for r in run(cfg, impls, args)]

    rows = [asdict(r) for r in results]
    print("\n" + common.format_table(rows, COLUMNS))
    notes = [f"fwd+bwd FLOPs = 3 x (2*T*K*H*2I + 2*T*K*I*H); 'vs eager' = eager fwd+bwd ms / impl fwd+bwd ms; "
             f"'err y' = ||y - y_eager|| / ||y_eager|| (tolerance {ERR_TOL:g}, FP8 rows {ERR_TOL_FP8:g}); peak GiB above inputs and weights; saved GiB: held from the forward to the backward, y included; "
             f"L2 flush between timed calls: {args.flush_l2}; iters {args.iters}, warm-up {args.warmup}; "
             f"rounds {args.rounds} (fwd+bwd: median over the rounds; lo / hi: the per-round 'vs eager' range)."]
    common.write_results(args.out, env, rows, COLUMNS, "MoE experts layer, fwd / bwd", notes)
    bad = [r for r in results if r.impl != "eager" and not math.isnan(r.err_y)
           and not (r.err_y < err_tol(r.impl) and r.err_grad < err_tol(r.impl))]
    if bad:
        print(f"MISMATCH vs eager in {len(bad)} case(s): " + ", ".join(f"{r.shape}/{r.routing}/{r.impl}" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
