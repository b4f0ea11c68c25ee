"""SM clock and board power while a layer runs: each implementation's fwd+bwd back to back for a
few seconds, with nvidia-smi sampling clocks.sm and power.draw (read-only queries; nothing is set).

Why: mok's expert GEMMs run as fast as torch._grouped_mm's alone (bench_gemm.py, every pass), yet
inside the layer the baseline's six GEMMs take less time than mok's. The baseline spends a third
of its step in memory-bound kernels, at lower power; if the board is at its power limit during
mok's GEMM-dense step, the SM clock is lower there, and so is every GEMM. This measures that.

    python benchmarks/clock_probe.py --shapes mixtral_8x7b --impls eager,mok --seconds 4
"""
import argparse
import datetime
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import mok  # noqa: E402
from benchmarks import baselines  # noqa: E402
from benchmarks.bench_moe_layer import Config, SHAPES, make_inputs  # noqa: E402

IMPLS = {
    "eager": lambda: baselines.grouped_mm_experts,
    "mok": lambda: mok.functional.moe_experts,
    "mok_fp8": lambda: (lambda *a: mok.functional.moe_experts(*a, recipe="blockwise")),
}


def sampler(path):
    """nvidia-smi writing (timestamp, SM MHz, W) every 50 ms to path."""
    f = open(path, "w")
    cmd = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"]
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL), f


def read_samples(path):
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="mixtral_8x7b,dsv3_ep8_slice")
    p.add_argument("--impls", default="eager,mok")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--out", default="/tmp/clock_probe.csv", help="raw nvidia-smi samples")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("clock_probe.py needs a CUDA GPU")
    proc, f = sampler(args.out)
    time.sleep(1.0)
    windows = []
    try:
        for shape in args.shapes.split(","):
            (x, idx, w, gu, dn), dy = make_inputs(Config(shape, *SHAPES[shape], "balanced"), torch.device("cuda"))
            leaves = [x, w, gu, dn]
            for name in args.impls.split(","):
                fn = IMPLS[name]()
                y = fn(x, idx, w, gu, dn)  # warm-up
                torch.autograd.grad(y, leaves, dy)
                torch.cuda.synchronize()
                steps, t0 = 0, time.time()
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
                while time.time() - t0 < args.seconds:
                    for _ in range(5):
                        y = fn(x, idx, w, gu, dn)
                        torch.autograd.grad(y, leaves, dy)
                        steps += 1
                    torch.cuda.synchronize()
                ev1.record()
                torch.cuda.synchronize()
                windows.append((shape, name, t0 + 0.5, time.time(), ev0.elapsed_time(ev1) / steps))
                del y
                time.sleep(1.5)  # let the board settle between phases
            del x, idx, w, gu, dn, dy, leaves
            torch.cuda.empty_cache()
    finally:
        time.sleep(0.3)
        proc.terminate()
        f.close()
    samples = read_samples(args.out)
    print(f"{'shape':16s} {'impl':8s} {'ms/step':>8s} {'SM MHz':>8s} {'min MHz':>8s} {'W':>6s} {'samples':>7s}")
    for shape, name, a, b, ms in windows:
        s = [(c, w) for t, c, w in samples if a <= t <= b]
        if not s:
            print(f"{shape:16s} {name:8s} {ms:8.3f}        -        -      -       0")
            continue
        mhz = sum(c for c, _ in s) / len(s)
        watts = sum(w for _, w in s) / len(s)
        print(f"{shape:16s} {name:8s} {ms:8.3f} {mhz:8.0f} {min(c for c, _ in s):8.0f} {watts:6.0f} {len(s):7d}")


if __name__ == "__main__":
    main()
