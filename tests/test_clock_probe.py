"""benchmarks/clock_probe.py's summary (the GPU run itself needs nvidia-smi): each window keeps only
its own samples, and TFLOP/s per GHz divides by the window's mean clock."""
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import clock_probe  # noqa: E402


def test_summary_assigns_samples_to_their_window_and_normalises_by_clock():
    # two windows of 1 s each; samples (t, MHz, W) inside, between and after them
    windows = [("s", "a", 10.0, 11.0, 2.0, 2e12), ("s", "b", 20.0, 21.0, 4.0, 2e12), ("s", "c", 30.0, 31.0, 1.0, 0)]
    samples = [(9.9, 1980, 100), (10.2, 1500, 600), (10.8, 1700, 700), (15.0, 1980, 90), (20.5, 1000, 650)]
    a, b, c = clock_probe.summarize(windows, samples)
    assert a["samples"] == 2 and a["mhz"] == 1600 and a["min_mhz"] == 1500 and a["watts"] == 650
    assert math.isclose(a["tflops"], 1000.0) and math.isclose(a["tflops_per_ghz"], 1000.0 / 1.6)
    assert b["samples"] == 1 and b["mhz"] == 1000 and math.isclose(b["tflops_per_ghz"], 500.0)
    # no samples, no FLOPs: NaN, not zero
    assert c["samples"] == 0 and math.isnan(c["mhz"]) and math.isnan(c["tflops"]) and math.isnan(c["tflops_per_ghz"])
