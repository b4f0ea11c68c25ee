"""benchmarks/bench_quant.py's CPU smoke run: every quantiser row is timed, including the gathered passes
(plain, weighted, MXFP8 qdq) that the layer runs, and none reports outputs that differ."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quant_benchmark_quick_run_times_every_quantiser(tmp_path):
    out = tmp_path / "quant.json"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_quant.py"), "--quick",
                          "--device", "cpu", "--iters", "1", "--warmup", "0", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    impls = {r["impl"] for r in rows}
    assert {"copy", "rowcol blockwise_1x128", "rowcol gather band default", "rowcol gather weighted band default",
            "qdq mxfp8 gather rows+cols band default"} <= impls, impls
    assert all(r["ms"] > 0 for r in rows)
    assert not any("DIFFER" in r["impl"] for r in rows)
