"""benchmarks/bench_ep_layer.py's CPU smoke run (W = 2, gloo): mok's ExpertParallel and the
torchtitan-style EP baseline the benchmark compares it with give the same layer output."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ep_layer_benchmark_quick_run_agrees_with_its_baseline():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_ep_layer.py"), "--quick",
                          "--iters", "1", "--warmup", "0"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| quick |")]
    assert len(rows) == 1, run.stdout
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "2" and cells[7] == "torch"  # W, mok's exchange backend on the CPU
    assert float(cells[-1]) < 1e-5  # fp32 on both sides: the same sums in a different order
