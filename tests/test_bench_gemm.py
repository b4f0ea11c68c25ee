"""benchmarks/bench_gemm.py's CPU smoke run: every pass (forward, dgrad, weight gradient) of mok's
grouped GEMM agrees with torch._grouped_mm on the same problem (the benchmark exits non-zero on a
mismatch), and every row of the table is timed."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gemm_benchmark_quick_run_covers_every_pass(tmp_path):
    out = tmp_path / "gemm.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_gemm.py"), "--quick", "--device",
                          "cpu", "--passes", "fwd,dgrad,wgrad", "--iters", "1", "--warmup", "0", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    for gpass in ("fwd", "dgrad", "wgrad"):
        mok_rows = [r for r in rows if r["gpass"] == gpass and r["impl"] == "mok"]
        assert mok_rows, gpass
        for r in mok_rows:
            # Both sides give bf16 outputs from fp32 sums taken in different orders, and which order torch's
            # CPU kernel takes depends on the host's vector units. So a few sums round to the neighbouring bf16
            # value, each worth ~3e-5 of the norm on these shapes (8.8e-5 on a Xeon with AMX, 0 elsewhere). A
            # wrong row, expert or K block gives 1e-2 or more.
            assert r["err"] < 1e-3 and r["ms"] > 0, r
