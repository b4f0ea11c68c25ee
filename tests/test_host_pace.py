"""benchmarks/host_pace.py (the host's time to issue a step against the GPU's): on the CPU both are the
host's, so the smoke test checks the plumbing (every impl asked for gets a row, unknown impls are an
error) and pace() times what it is given."""
import os
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import host_pace  # noqa: E402


def test_pace_times_the_step_it_is_given():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.002)

    host_ms, device_ms = host_pace.pace(step, torch.device("cpu"), steps=4)
    assert len(calls) == 3 + 4  # 3 warm-up steps, then the timed ones
    assert 2.0 <= host_ms < 50.0 and device_ms == host_ms


def test_quick_run_prints_a_row_per_impl(capsys):
    host_pace.main(["--quick", "--impls", "mok,eager", "--steps", "2", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "tiny mok: host" in out and "tiny eager: host" in out and "host / device" in out


def test_unknown_impl_and_bad_steps_are_errors(capsys):
    with pytest.raises(SystemExit):
        host_pace.main(["--quick", "--impls", "mok,nope", "--device", "cpu"])
    assert "--impls: unknown nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        host_pace.main(["--quick", "--steps", "0", "--device", "cpu"])
    assert "--steps: expected at least 1" in capsys.readouterr().err
