"""benchmarks/wgrad_tiles_error.py's CPU run: both column-copy recipes of the FP8 weight gradient stay at
E4M3's rounding level against float64 on every activation kind (a mis-scaled copy would be off by ~1e0),
and the table has a row per kind."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wgrad_tiles_error_table():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "wgrad_tiles_error.py"), "--rows", "512",
                          "--m", "128", "--n", "256", "--seed", "3"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "e-" in line]
    kinds = [r[0].strip() for r in rows]
    assert kinds == ["gaussian", "channels x100", "channels x1000", "channels x10000", "tokens x100", "swiglu"]
    for r in rows:
        errs = [float(v) for v in r[1:5]]
        assert all(1e-2 < e < 0.08 for e in errs), r
