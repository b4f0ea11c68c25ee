"""benchmarks/bench_gemm_fp8.py's CPU smoke run: in every pass (forward, dgrad, weight gradient) mok's
FP8 blockwise grouped GEMM agrees with mok's BF16 one up to the E4M3 rounding of its operands (the
benchmark exits non-zero on a larger error), and every mok row is timed."""
import sys

from conftest import ROOT, quick_benchmark_rows


def test_fp8_gemm_benchmark_quick_run_covers_every_pass(tmp_path):
    out = tmp_path / "gemm_fp8.json"
    rows = quick_benchmark_rows("bench_gemm_fp8.py", out, "--device", "cpu", "--passes", "fwd,dgrad,wgrad")
    for gpass in ("fwd", "dgrad", "wgrad"):
        fp8 = [r for r in rows if r["gpass"] == gpass and r["impl"] == "mok_fp8"]
        assert fp8 and all(r["impl"] != "mok_bf16" or r["vs_bf16"] == 1.0 for r in rows), gpass
        for r in fp8:
            # E4M3 operands against the bf16 GEMM: a few percent, not zero (it did run in FP8)
            assert 1e-2 < r["err"] < 0.08 and r["ms"] > 0 and r["vs_bf16"] > 0, r


def test_fp8_gemm_benchmark_skips_shapes_without_whole_scale_blocks(capsys):
    # the default shape list holds gpt-oss-20b-like (H = I = 2880): the run goes on without it
    sys.path.insert(0, ROOT)
    from benchmarks import bench_gemm_fp8
    configs = bench_gemm_fp8.get_configs(["gpt_oss_20b_like", "mixtral_8x7b"], ["gemm1"], False, ["fwd"])
    assert [c.shape for c in configs] == ["mixtral_8x7b"]
    assert "'gpt_oss_20b_like' skipped" in capsys.readouterr().out
    try:
        bench_gemm_fp8.get_configs(["gpt_oss_20b_like"], ["gemm1"], False, ["fwd"])
    except SystemExit as e:
        assert "no shape left" in str(e)
    else:
        raise AssertionError("a run with no FP8-capable shape must stop")
