"""benchmarks/bench_quant.py's CPU smoke run: every quantiser row is timed, including the gathered passes
(plain, weighted, MXFP8 qdq) that the layer runs, and none reports outputs that differ."""
from conftest import quick_benchmark_rows


def test_quant_benchmark_quick_run_times_every_quantiser(tmp_path):
    out = tmp_path / "quant.json"
    rows = quick_benchmark_rows("bench_quant.py", out, "--device", "cpu")
    impls = {r["impl"] for r in rows}
    assert {"copy", "rowcol blockwise_1x128", "rowcol gather band default", "rowcol gather weighted band default",
            "qdq mxfp8 gather rows+cols band default"} <= impls, impls
    assert all(r["ms"] > 0 for r in rows)
    assert not any("DIFFER" in r["impl"] for r in rows)
