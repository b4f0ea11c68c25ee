"""benchmarks/bench_rows.py's CPU smoke run: every row-movement variant is timed, and the token walk
of gather_rows gives the per-row gather's bits (the benchmark exits non-zero otherwise)."""
from conftest import quick_benchmark_rows


def test_rows_benchmark_quick_run_times_every_variant(tmp_path):
    out = tmp_path / "rows.json"
    rows = quick_benchmark_rows("bench_rows.py", out, "--device", "cpu")
    impls = {r["impl"] for r in rows}
    assert {"copy x_rows", "gather by row", "gather by token", "gather w", "combine w"} <= impls
    assert all(r["ms"] > 0 for r in rows)
    assert all(r["same"] == "yes" for r in rows if r["impl"] == "gather by token")
