"""benchmarks/bench_rows.py's CPU smoke run: every row-movement variant is timed, and the token walk
of gather_rows gives the per-row gather's bits (the benchmark exits non-zero otherwise)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rows_benchmark_quick_run_times_every_variant(tmp_path):
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_rows.py"), "--quick",
                          "--device", "cpu", "--iters", "1", "--warmup", "0", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    impls = {r["impl"] for r in rows}
    assert {"copy x_rows", "gather by row", "gather by token", "gather w", "combine w"} <= impls
    assert all(r["ms"] > 0 for r in rows)
    assert all(r["same"] == "yes" for r in rows if r["impl"] == "gather by token")
