"""examples/train_moe_lm.py's CPU smoke run, BF16 and the blockwise FP8 recipe: both train (the
loss falls) and write their summary."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("recipe", ["bf16", "blockwise"])
def test_train_example_quick_run_learns(tmp_path, recipe):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_moe_lm.py"), "--quick", "--steps", "20",
                          "--recipe", recipe, "--no-progress", "--device", "cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    for impl in ("mok", "baseline"):
        r = summary["results"][impl]
        assert r["final_loss"] < r["first_loss"] - 0.5, (impl, r)
    assert summary["args"]["recipe"] == recipe
