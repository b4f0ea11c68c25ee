"""benchmarks/bench_gemm.py's CPU smoke run: every pass (forward, dgrad, weight gradient) of mok's
grouped GEMM agrees with torch._grouped_mm on the same problem (the benchmark exits non-zero on a
mismatch), and every row of the table is timed."""
from conftest import quick_benchmark_rows


def test_gemm_benchmark_quick_run_covers_every_pass(tmp_path):
    out = tmp_path / "gemm.json"
    rows = quick_benchmark_rows("bench_gemm.py", out, "--device", "cpu", "--passes", "fwd,dgrad,wgrad")
    for gpass in ("fwd", "dgrad", "wgrad"):
        mok_rows = [r for r in rows if r["gpass"] == gpass and r["impl"] == "mok"]
        assert mok_rows, gpass
        for r in mok_rows:
            # Both sides give bf16 outputs from fp32 sums taken in different orders, and which order torch's
            # CPU kernel takes depends on the host's vector units. So a few sums round to the neighbouring bf16
            # value, each worth ~3e-5 of the norm on these shapes (8.8e-5 on a Xeon with AMX, 0 elsewhere). A
            # wrong row, expert or K block gives 1e-2 or more.
            assert r["err"] < 1e-3 and r["ms"] > 0, r
