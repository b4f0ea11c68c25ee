"""benchmarks/bench_moe_layer.py's CPU smoke run: mok (BF16, and the blockwise FP8 recipe with a BF16
backward, with FP8 dgrad, and with FP8 dgrad and wgrad; the MXFP8 recipe) against the eager baseline on a tiny shape;
the benchmark exits non-zero when an implementation's output or gradients leave their tolerance,
and every row is timed."""
import json

from conftest import quick_benchmark_rows, run_quick_benchmark


def test_layer_benchmark_quick_run_checks_every_impl(tmp_path):
    out = tmp_path / "layer.json"
    impls = ["eager", "mok", "mok_fp8", "mok_fp8_dgrad", "mok_fp8_all", "mok_mxfp8"]
    rows = {r["impl"]: r for r in quick_benchmark_rows("bench_moe_layer.py", out, "--shapes", "tiny_h128", "--routing",
                                                       "balanced", "--impls", ",".join(impls), "--naive", "off",
                                                       "--device", "cpu", timeout=600)}
    assert sorted(rows) == sorted(impls)
    for name, r in rows.items():
        assert r["fwd_bwd_ms"] > 0 and not r["note"], (name, r)
    assert rows["mok"]["err_y"] < 2e-2 and 1e-2 < rows["mok_fp8"]["err_y"] < 0.12  # FP8 really quantised
    assert 1e-3 < rows["mok_mxfp8"]["err_y"] < 0.12  # MXFP8-rounded operands: not the BF16 result


def test_layer_benchmark_rounds_report_a_median_and_its_range(tmp_path):
    out = tmp_path / "layer_rounds.json"
    run = run_quick_benchmark("bench_moe_layer.py", "--shapes", "tiny", "--routing", "balanced", "--impls", "eager,mok",
                              "--naive", "off", "--rounds", "2", "--device", "cpu", "--out", str(out), timeout=600)
    assert run.stdout.count("fwd+bwd per round") == 2
    assert "round 2 order: mok, eager" in run.stdout  # the second round reversed: no fixed neighbours
    rows = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    mok_row = rows["mok"]
    # two rounds: the ratio of the medians (means) lies between the two rounds' ratios
    assert mok_row["speedup_lo"] <= mok_row["speedup"] * (1 + 1e-9)
    assert mok_row["speedup"] <= mok_row["speedup_hi"] * (1 + 1e-9)
    assert rows["eager"]["speedup_lo"] == rows["eager"]["speedup_hi"] == 1.0
