"""benchmarks/bench_ep_layer.py's CPU smoke run (W = 2, gloo): mok's ExpertParallel and the
torchtitan-style EP baseline the benchmark compares it with give the same layer output."""
from conftest import run_quick_benchmark


def _quick_rows(*extra):
    run = run_quick_benchmark("bench_ep_layer.py", *extra)
    rows = [line for line in run.stdout.splitlines() if line.startswith("| quick |")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows], run.stdout


def test_ep_layer_benchmark_quick_run_agrees_with_its_baseline():
    rows, out = _quick_rows()
    assert len(rows) == 1, out
    cells = rows[0]
    assert cells[1] == "2" and cells[7] == "torch" and cells[8] == "bf16"  # W, mok's exchange on the CPU, recipe
    assert float(cells[-1]) < 1e-5  # fp32 on both sides: the same sums in a different order


def test_ep_layer_benchmark_quick_run_with_fp8_recipes():
    # bf16 on the CPU: the local experts in FP8 (every GEMM) and MXFP8 against the BF16 baseline, within
    # the layer tests' FP8 tolerance (0.12)
    rows, out = _quick_rows("--recipes", "blockwise_all,mxfp8")
    assert [r[8] for r in rows] == ["blockwise_all", "mxfp8"], out
    for cells in rows:
        assert 1e-3 < float(cells[-1]) < 0.12, cells
