"""benchmarks/bench_titan_experts.py's CPU smoke run: the three ways of feeding torchtitan's w1 / w3
are timed, and the pair gives the concatenation's bits (the benchmark exits non-zero otherwise)."""
from conftest import quick_benchmark_rows


def test_titan_experts_benchmark_quick_run(tmp_path):
    rows = quick_benchmark_rows("bench_titan_experts.py", tmp_path / "titan.json", "--device", "cpu")
    assert {r["impl"] for r in rows} == {"fused", "pair", "cat"}
    assert all(r["fwd_bwd_ms"] > 0 and r["fwd_ms"] > 0 for r in rows)
    assert all(r["same"] == "yes" for r in rows if r["impl"] == "pair")
