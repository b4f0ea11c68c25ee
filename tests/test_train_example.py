"""examples/train_moe_lm.py's CPU smoke run: mok (BF16, and the blockwise FP8 recipe) and the
baseline train (the loss falls; FP8 with the dgrad GEMMs in FP8 (default), forward only, and every GEMM) and the summary compares them."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("flags, impls", [
    (["--recipe", "bf16"], ("mok", "baseline")),
    (["--recipe", "blockwise"], ("mok", "baseline")),
    (["--recipe", "blockwise", "--fp8-backward", "bf16"], ("mok", "baseline")),
    (["--recipe", "blockwise", "--fp8-backward", "all"], ("mok", "baseline")),
    (["--recipe", "blockwise", "--fp8-backward", "all_tiled"], ("mok", "baseline")),
    (["--impl", "all"], ("mok", "mok_fp8", "baseline")),
], ids=["bf16", "blockwise", "blockwise_fp8_fwd_only", "blockwise_fp8_all", "blockwise_fp8_all_tiled", "all"])
def test_train_example_quick_run_learns(tmp_path, flags, impls):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_moe_lm.py"), "--quick", "--steps", "20",
                          "--no-progress", "--device", "cpu", "--out", str(tmp_path), *flags],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert tuple(summary["results"]) == impls
    for impl in impls:
        r = summary["results"][impl]
        assert r["final_loss"] < r["first_loss"] - 0.2, (impl, r)  # a model that does not learn stays flat
    if "mok_fp8" in impls:
        assert summary["final_loss_rel_diff_fp8_vs_bf16"] < 0.1  # 20 steps of a tiny model: loose
