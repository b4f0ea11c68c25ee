"""The README's first command, `python -m mok` (mok/__main__.py), on the CPU with fewer steps: it checks mok
against the float64 reference, trains, and fails (SystemExit) when an error is out of bounds or the loss does
not fall."""
import subprocess
import sys

import pytest

import mok
import mok.__main__ as demo


def test_demo_runs_and_passes_its_checks(capsys):
    demo.main(["--steps", "20", "--ref-steps", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert out.count("(ok)") == 2, out  # output and gradient against the float64 reference
    assert "tokens/s, mok" in out and "loss, step 1 -> step 20" in out


def test_demo_is_the_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "mok", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--steps" in r.stdout


def test_demo_refuses_a_gpu_it_cannot_use():
    import torch

    if torch.cuda.is_available() and mok.has_cuda_kernels():
        pytest.skip("this build can run the demo on the GPU")
    with pytest.raises(SystemExit):
        demo.main(["--steps", "1", "--device", "cuda"])
