"""SM clock and board power while one implementation runs back to back for a few seconds, with
nvidia-smi sampling clocks.sm and power.draw (read-only queries; nothing is set).

Two modes:
- layer (default): each implementation's MoE-layer fwd+bwd. Why: mok's expert GEMMs run as fast as
  torch._grouped_mm's alone (bench_gemm.py, every pass), yet inside the layer the baseline's six
  GEMMs take less time than mok's. The baseline spends a third of its step in memory-bound kernels,
  at lower power; if the board is at its power limit during mok's GEMM-dense step, the SM clock is
  lower there, and so is every GEMM (performance log v17).
- gemm (--gemm gemm1 or gemm2): one grouped GEMM of a layer shape, mok BF16, mok FP8 blockwise and
  torch._scaled_grouped_mm (row-wise FP8) on the same problem as bench_gemm_fp8.py. Why: mok's FP8
  GEMM stays near 1050 TFLOP/s whatever the ring depth, L2 bytes or prefetching (performance log
  v24), while torch's row-wise one reaches ~1200; if both sit at the power limit, the clock and the
  TFLOP/s per GHz tell whether mok's kernel loses cycles or joules.

    python benchmarks/clock_probe.py --shapes mixtral_8x7b --impls eager,mok --seconds 4
    python benchmarks/clock_probe.py --gemm gemm1 --shapes dsv3_ep8_slice,mixtral_8x7b \\
        --impls mok_bf16,mok_fp8,torch_scaled_grouped_mm --seconds 4
"""
import argparse
import datetime
import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import baselines, common  # noqa: E402
from benchmarks.bench_moe_layer import Config, SHAPES, make_inputs  # noqa: E402

LAYER_IMPLS = {
    "eager": lambda: baselines.grouped_mm_experts,
    "mok": lambda: mok.functional.moe_experts,
    "mok_fp8": lambda: (lambda *a: mok.functional.moe_experts(*a, recipe="blockwise")),
}

# (shape, impl, window start, window end, ms per step, FLOPs per step)
Window = Tuple[str, str, float, float, float, float]


def sampler(path):
    """nvidia-smi writing (timestamp, SM MHz, W) every 50 ms to path."""
    f = open(path, "w")
    cmd = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"]
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL), f


def read_samples(path) -> List[Tuple[float, float, float]]:
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((ts, float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return out


def summarize(windows: Sequence[Window], samples: Sequence[Tuple[float, float, float]]) -> List[Dict]:
    """One row per window: ms per step, TFLOP/s, the samples' mean and min SM clock and mean power,
    and TFLOP/s per GHz of the mean clock (what the kernel does per cycle, whatever the clock)."""
    rows = []
    for shape, name, a, b, ms, flops in windows:
        s = [(c, w) for t, c, w in samples if a <= t <= b]
        row = dict(shape=shape, impl=name, ms=ms, tflops=common.tflops(flops, ms) if flops else float("nan"),
                   mhz=float("nan"), min_mhz=float("nan"), watts=float("nan"), tflops_per_ghz=float("nan"),
                   samples=len(s))
        if s:
            row["mhz"] = sum(c for c, _ in s) / len(s)
            row["min_mhz"] = min(c for c, _ in s)
            row["watts"] = sum(w for _, w in s) / len(s)
            if row["mhz"] > 0:
                row["tflops_per_ghz"] = row["tflops"] / (row["mhz"] / 1000.0)
        rows.append(row)
    return rows


def run_phase(step: Callable[[], object], seconds: float) -> float:
    """step() back to back for about `seconds` after one warm-up call; ms per step (CUDA events)."""
    step()
    torch.cuda.synchronize()
    steps, t0 = 0, time.time()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    while time.time() - t0 < seconds:
        for _ in range(5):
            step()
            steps += 1
        torch.cuda.synchronize()
    ev1.record()
    torch.cuda.synchronize()
    return ev0.elapsed_time(ev1) / steps


def layer_phases(args, windows: List[Window]) -> None:
    for shape in args.shapes.split(","):
        layer_phases_of_shape(args, shape, windows)
        torch.cuda.empty_cache()  # the shape's tensors went with the call's frame


def layer_phases_of_shape(args, shape: str, windows: List[Window]) -> None:
    cfg = Config(shape, *SHAPES[shape], "balanced")
    (x, idx, w, gu, dn), dy = make_inputs(cfg, torch.device("cuda"))
    leaves = [x, w, gu, dn]
    flops = 3 * common.moe_fwd_flops(cfg.T, cfg.H, cfg.I, cfg.K)
    for name in args.impls.split(","):
        fn = LAYER_IMPLS[name]()
        t0 = time.time()
        ms = run_phase(lambda: torch.autograd.grad(fn(x, idx, w, gu, dn), leaves, dy), args.seconds)
        windows.append((shape, name, t0 + 0.5, time.time(), ms, flops))
        time.sleep(1.5)  # let the board settle between phases


def gemm_phases(args, windows: List[Window]) -> None:
    from benchmarks import bench_gemm_fp8

    for cfg in bench_gemm_fp8.get_configs(args.shapes.split(","), [args.gemm], False, ["fwd"]):
        gemm_phases_of_config(args, cfg, windows)
        torch.cuda.empty_cache()


def gemm_phases_of_config(args, cfg, windows: List[Window]) -> None:
    from benchmarks import bench_gemm, bench_gemm_fp8

    P = bench_gemm.make_problem(cfg, torch.device("cuda"), 0)
    impls = bench_gemm_fp8.pass_impls(cfg, P, bench_gemm_fp8.quantized_operands(cfg, P))
    flops = 2 * cfg.rows * cfg.N * cfg.K
    with torch.no_grad():
        for name in args.impls.split(","):
            if name not in impls:
                raise SystemExit(f"--impls: {name!r} is not one of {sorted(impls)} (gemm mode)")
            t0 = time.time()
            ms = run_phase(impls[name], args.seconds)
            windows.append((f"{cfg.shape} {cfg.gemm}", name, t0 + 0.5, time.time(), ms, flops))
            time.sleep(1.5)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="mixtral_8x7b,dsv3_ep8_slice")
    p.add_argument("--impls", default=None,
                   help="layer mode: eager,mok,mok_fp8 (default eager,mok); gemm mode: mok_bf16,mok_fp8,"
                        "torch_scaled_grouped_mm,scaled_mm_dense,cublas_bf16 (default the first three)")
    p.add_argument("--gemm", choices=["gemm1", "gemm2"], default=None, help="gemm mode: this forward GEMM alone")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--out", default="/tmp/clock_probe.csv", help="raw nvidia-smi samples")
    args = p.parse_args(argv)
    if args.impls is None:
        args.impls = "mok_bf16,mok_fp8,torch_scaled_grouped_mm" if args.gemm else "eager,mok"
    if not torch.cuda.is_available():
        raise SystemExit("clock_probe.py needs a CUDA GPU")
    proc, f = sampler(args.out)
    time.sleep(1.0)
    windows: List[Window] = []
    try:
        (gemm_phases if args.gemm else layer_phases)(args, windows)
    finally:
        time.sleep(0.3)
        proc.terminate()
        f.close()
    print(f"{'shape':22s} {'impl':24s} {'ms/step':>8s} {'TFLOP/s':>8s} {'SM MHz':>7s} {'min MHz':>7s} {'W':>5s} "
          f"{'TFLOP/s/GHz':>11s} {'samples':>7s}")
    for r in summarize(windows, read_samples(args.out)):
        print(f"{r['shape']:22s} {r['impl']:24s} {r['ms']:8.3f} {r['tflops']:8.1f} {r['mhz']:7.0f} {r['min_mhz']:7.0f} "
              f"{r['watts']:5.0f} {r['tflops_per_ghz']:11.1f} {r['samples']:7d}")


if __name__ == "__main__":
    main()
