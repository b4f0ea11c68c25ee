"""Grouped expert GEMMs alone: mok's grouped GEMM (torch.ops.mok.grouped_mm on the plan row space)
against torch._grouped_mm on the same problem and against one cuBLAS dense GEMM of equal FLOPs
(torch.mm), for GEMM1 (N = 2I, K = H) and GEMM2 (N = H, K = I) of each MoE shape, in the three
passes of training:

    fwd    out [rows, N] = A [rows, K] @ W[e]^T        (W [E, N, K]: "NT")
    dgrad  dA [rows, K] = dOut [rows, N] @ W[e]        ("NN": what the backward runs)
    wgrad  dW [E, N, K] = dOut_e^T @ A_e               (contraction over each expert's rows)

    python benchmarks/bench_gemm.py                  # every shape, both GEMMs, forward
    python benchmarks/bench_gemm.py --passes fwd,dgrad,wgrad
    python benchmarks/bench_gemm.py --shapes mixtral_8x7b --iters 100
    python benchmarks/bench_gemm.py --quick          # tiny shapes, CPU smoke test

Routing is exactly balanced (pair t*K + k goes to expert (t*K + k) mod E, so every expert gets
T*K/E rows), and the plan comes from mok.functional.moe_plan. FLOPs are 2 * rows * N * K with
rows = T*K real rows (plan padding not counted). 'mok_gather' (GEMM1 only) reads token rows of
x [T, H] through the plan's src_of_row instead of a permuted copy, as mok's forward does.
Times are medians of CUDA-event timings with a 256 MB L2 flush between calls."""
import argparse
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import baselines, common  # noqa: E402
from benchmarks.bench_moe_layer import QUICK_SHAPES, SHAPES  # noqa: E402

GEMMS = ("gemm1", "gemm2")
PASSES = ("fwd", "dgrad", "wgrad")
ERR_TOL = 1e-2  # same bf16 inputs, fp32 accumulation: only summation order differs


@dataclass(frozen=True)
class Config:
    shape: str
    gemm: str
    T: int
    E: int
    top_k: int
    N: int
    K: int
    gpass: str = "fwd"

    @property
    def rows(self) -> int:
        return self.T * self.top_k


@dataclass(frozen=True)
class Result:
    shape: str
    gemm: str
    gpass: str
    impl: str
    rows: int
    N: int
    K: int
    E: int
    ms: float
    tflops: float
    vs_cublas: float  # this TFLOP/s / cuBLAS TFLOP/s
    err: float  # ||out - torch._grouped_mm out|| / ||.|| on the real rows
    note: str = ""


def get_configs(shapes: List[str], gemms: List[str], quick: bool, passes=("fwd",),
                quick_shapes=QUICK_SHAPES) -> List[Config]:
    table = quick_shapes if quick else SHAPES
    if quick and shapes == list(SHAPES):
        shapes = list(quick_shapes)
    out = []
    for s in shapes:
        if s not in table:
            raise SystemExit(f"unknown shape {s!r}; choose from {', '.join(table)}")
        T, H, I, E, K = table[s]
        for g in gemms:
            if g not in GEMMS:
                raise SystemExit(f"unknown gemm {g!r}; choose from {', '.join(GEMMS)}")
            N, Kd = (2 * I, H) if g == "gemm1" else (H, I)
            for ps in passes:
                if ps not in PASSES:
                    raise SystemExit(f"unknown pass {ps!r}; choose from {', '.join(PASSES)}")
                out.append(Config(s, g, T, E, K, N, Kd, ps))
    return out


def make_problem(cfg: Config, device, seed=0):
    """The same GEMM in the three layouts: token rows x [T, K] (gather source), plan rows [R, K]
    (expert-ordered, zero padding), sorted rows [T*K, K] (no padding), weights [E, N, K]."""
    g = torch.Generator(device=device).manual_seed(seed)
    bf16 = dict(device=device, dtype=torch.bfloat16, generator=g)
    T, E, k = cfg.T, cfg.E, cfg.top_k
    pair = torch.arange(T * k, device=device, dtype=torch.int32)
    topk_idx = (pair % E).view(T, k)  # exactly balanced, distinct experts per token (k <= E)
    plan = mok.functional.moe_plan(topk_idx, E)
    src = plan.src_of_row.long()
    real = src >= 0
    x = torch.randn(T, cfg.K, **bf16)  # GEMM1: tokens; GEMM2: stands in for the activation rows
    if cfg.gemm == "gemm1":
        a_plan = torch.where(real[:, None], x[src.clamp(min=0) // k], torch.zeros((), dtype=x.dtype, device=device))
    else:
        a_plan = torch.randn(src.shape[0], cfg.K, **bf16) * real[:, None]
    a_sorted = a_plan[real].contiguous()  # setup only: the mask costs a host sync
    w = torch.randn(E, cfg.N, cfg.K, **bf16).mul_(cfg.K ** -0.5)
    offs = torch.cumsum(plan.counts, 0, dtype=torch.int32)  # END offsets, on the device
    w_dense = torch.randn(cfg.N, cfg.K, **bf16).mul_(cfg.K ** -0.5)
    P = dict(x=x, plan=plan, real=real, a_plan=a_plan, a_sorted=a_sorted, w=w, offs=offs, w_dense=w_dense)
    if cfg.gpass != "fwd":
        # the incoming gradient of the pass's output, in the plan rows and sorted
        P["d_plan"] = torch.randn(src.shape[0], cfg.N, **bf16) * real[:, None]
        P["d_sorted"] = P["d_plan"][real].contiguous()
    return P


def pass_impls(cfg: Config, P):
    """name -> callable for the pass; the first is cuBLAS at equal FLOPs, the second the reference."""
    ops, plan = torch.ops.mok, P["plan"]
    if cfg.gpass == "fwd":
        impls = {
            "cublas": lambda: torch.mm(P["a_sorted"], P["w_dense"].t()),
            "torch_grouped_mm": lambda: torch._grouped_mm(P["a_sorted"], P["w"].transpose(-2, -1), offs=P["offs"]),
            "mok": lambda: ops.grouped_mm(P["a_plan"], None, 1, P["w"], plan.offsets, True),
        }
        if cfg.gemm == "gemm1":
            impls["mok_gather"] = lambda: ops.grouped_mm(P["x"], plan.src_of_row, cfg.top_k, P["w"], plan.offsets,
                                                         True)
        return impls
    if cfg.gpass == "dgrad":
        return {
            "cublas": lambda: torch.mm(P["d_sorted"], P["w_dense"]),
            "torch_grouped_mm": lambda: torch._grouped_mm(P["d_sorted"], P["w"], offs=P["offs"]),
            "mok": lambda: ops.grouped_mm(P["d_plan"], None, 1, P["w"], plan.offsets, False),
        }
    return {
        "cublas": lambda: torch.mm(P["d_sorted"].t(), P["a_sorted"]),
        # what torch's own backward of _grouped_mm runs for the weight: the contraction over rows
        "torch_grouped_mm": lambda: torch._grouped_mm(P["d_sorted"].t(), P["a_sorted"], offs=P["offs"]),
        "mok": lambda: ops.grouped_mm_wgrad(P["d_plan"], P["a_plan"], None, 1, plan.offsets),
    }


def real_rows(cfg: Config, out, P):
    """The part of an output that the reference has: plan rows -> real rows; weights as they are."""
    return out if cfg.gpass == "wgrad" else out[P["real"]]


def run(cfg: Config, args) -> List[Result]:
    dev = common.pick_device(args.device)
    P = make_problem(cfg, dev, args.seed)
    impls = pass_impls(cfg, P)
    flops = 2 * cfg.rows * cfg.N * cfg.K
    rows, ref = [], None
    with torch.no_grad():
        for name, fn in impls.items():
            row = dict(shape=cfg.shape, gemm=cfg.gemm, gpass=cfg.gpass, impl=name, rows=cfg.rows, N=cfg.N, K=cfg.K, E=cfg.E,
                       ms=math.nan, tflops=math.nan, vs_cublas=math.nan, err=math.nan, note="")
            try:
                if name == "torch_grouped_mm" and not baselines.grouped_mm_available(dev.type, torch.bfloat16):
                    raise RuntimeError("torch._grouped_mm does not run here")
                out = fn()
                if name == "torch_grouped_mm":
                    ref = out
                elif name.startswith("mok") and ref is not None:
                    row["err"] = common.rel_err(real_rows(cfg, out, P), ref)
                del out
                row["ms"] = common.bench(lambda _i: fn(), dev, iters=args.iters, warmup=args.warmup,
                                         flush_l2=args.flush_l2)["median_ms"]
                row["tflops"] = common.tflops(flops, row["ms"])
            except Exception as e:  # record and go on
                row["note"] = f"error: {e!r}"[:160]
            rows.append(row)
    base = rows[0]["tflops"]  # cublas
    for r in rows:
        if base and not math.isnan(base):
            r["vs_cublas"] = r["tflops"] / base
    del P
    common.free_memory(dev)
    results = [Result(**r) for r in rows]
    for r in results:
        print(f"   {r.shape:18s} {r.gemm} {r.gpass:5s} {r.impl:17s} {r.ms:8.3f} ms {r.tflops:7.1f} TFLOP/s "
              f"x{r.vs_cublas:.2f} of cuBLAS {r.note}", flush=True)
    return results


COLUMNS = [
    ("shape", "shape", ""), ("gemm", "gemm", ""), ("gpass", "pass", ""), ("impl", "impl", ""), ("rows", "rows", "d"), ("N", "N", "d"),
    ("K", "K", "d"), ("E", "E", "d"), ("ms", "ms", ".3f"), ("tflops", "TFLOP/s", ".1f"),
    ("vs_cublas", "vs cuBLAS", ".2f"), ("err", "err", ".1e"), ("note", "note", ""),
]


def parse_args(argv, doc: str, script: str):
    """The command line of the GEMM benchmarks (this one and bench_gemm_fp8.py)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list from {', '.join(SHAPES)}")
    p.add_argument("--gemms", default=",".join(GEMMS), help="comma list from gemm1, gemm2")
    p.add_argument("--passes", default="fwd", help="comma list from fwd, dgrad, wgrad")
    p.add_argument("--seed", type=int, default=0)
    common.add_common_args(p, script, iters=50, warmup=10)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv, __doc__, "bench_gemm")
    dev, env = common.start_run(args)
    results: List[Result] = []
    for cfg in get_configs(args.shapes.split(","), args.gemms.split(","), args.quick, args.passes.split(",")):
        results += run(cfg, args)
    rows: List[Dict] = [asdict(r) for r in results]
    print("\n" + common.format_table(rows, COLUMNS))
    notes = ["FLOPs = 2 * rows * N * K over the T*K real rows; 'vs cuBLAS' = TFLOP/s over torch.mm's at equal "
             f"FLOPs; 'err' vs torch._grouped_mm on the real rows (tolerance {ERR_TOL:g}); L2 flush: {args.flush_l2}; "
             f"iters {args.iters}, warm-up {args.warmup}."]
    common.write_results(args.out, env, rows, COLUMNS, "Grouped expert GEMMs (bf16)", notes)
    bad = [r for r in results if not math.isnan(r.err) and r.err >= ERR_TOL]
    if bad:
        print("MISMATCH vs torch._grouped_mm: " + ", ".join(f"{r.shape}/{r.gemm}/{r.gpass}/{r.impl}" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
