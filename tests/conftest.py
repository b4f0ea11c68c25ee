import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


# Devices every op test runs on: the CPU always, the GPU when there is one (marked "gpu").
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def _fresh_seed():
    # Fresh random inputs each run; the seed is printed on failure so a case can be replayed.
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed


def capture_step(step, warmup=2, before_capture=None):
    """Runs step() `warmup` times on a side stream (allocations and lazy set-up happen outside the
    graph), calls before_capture() if given, then captures one call of step() in a CUDA graph.
    Returns (graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def single_ctas_and_pairs(monkeypatch, run):
    """run() with the sm_90a GEMMs on single CTAs (MOK_SM90_CLUSTER=1) and on CTA pairs sharing B by
    multicast (=2); asserts that every output is the same bit for bit; returns the single CTAs' list."""
    monkeypatch.setenv("MOK_SM90_CLUSTER", "1")
    single = run()
    monkeypatch.setenv("MOK_SM90_CLUSTER", "2")
    pairs = run()
    assert len(single) == len(pairs)
    for a, b in zip(single, pairs):
        assert torch.equal(a, b)
    return single


def run_quick_benchmark(script, *args, timeout=300):
    """benchmarks/<script> --quick with one timed iteration and no warm-up, CUDA hidden (the CPU smoke run
    of a benchmark); the finished process, its exit status asserted 0 (a benchmark exits non-zero when
    an implementation leaves its tolerance)."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--quick", "--iters", "1",
                          "--warmup", "0", *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def quick_benchmark_rows(script, out, *args, timeout=300):
    """The result rows run_quick_benchmark(script, ..., "--out", out) wrote to the JSON file out."""
    run_quick_benchmark(script, *args, "--out", str(out), timeout=timeout)
    return json.loads(out.read_text())["results"]
