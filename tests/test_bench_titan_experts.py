"""benchmarks/bench_titan_experts.py's CPU smoke run: the three ways of feeding torchtitan's w1 / w3
are timed, and the pair gives the concatenation's bits (the benchmark exits non-zero otherwise)."""
from conftest import quick_benchmark_rows


def test_titan_experts_benchmark_quick_run(tmp_path):
    rows = quick_benchmark_rows("bench_titan_experts.py", tmp_path / "titan.json", "--device", "cpu")
    assert {r["impl"] for r in rows} == {"fused", "pair", "cat"}
    assert all(r["fwd_bwd_ms"] > 0 and r["fwd_ms"] > 0 for r in rows)
    assert all(r["same"] == "yes" for r in rows if r["impl"] == "pair")


def test_titan_experts_benchmark_fp8_recipe_quick_run(tmp_path):
    # the blockwise recipe with every GEMM in FP8, codes remade (by the fused weight-codes op) before every
    # timed call: only the shape with whole 128-wide scale blocks runs, and the pair still gives the
    # concatenation's bits
    rows = quick_benchmark_rows("bench_titan_experts.py", tmp_path / "titan_fp8.json", "--device", "cpu",
                                "--recipe", "blockwise", "--fp8-backward", "all", "--requantise",
                                "--weight-codes", "fused")
    assert {r["shape"] for r in rows} == {"tiny_h128"}
    assert {r["recipe"] for r in rows} == {"blockwise/all/requantise/codes-fused"}
    assert all(r["same"] == "yes" for r in rows if r["impl"] == "pair")
