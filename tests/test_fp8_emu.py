"""The bf16 FP8 tile kernels (csrc/cuda/quant/quantize_bf16_tile.cuh and swiglu_quantize_tile.cuh) on
the CPU: tests/emu/ runs them through a small CUDA emulation (coroutine threads, shuffles, barriers,
shared memory) and compares every code and scale with the C core, for the row-wise kernels of the
three recipes, the fused row-wise + column-wise kernel, the SwiGLU + quantisation kernels and the MXFP8
quantise-dequantise kernel (csrc/cuda/quant/qdq_mxfp8.cuh: plans, misaligned plans, gathered rows), on
ragged shapes, edge blocks and misaligned pointers.

It checks the kernels' indexing and data flow where there is no GPU; the device arithmetic itself
is covered by the exhaustive proof in csrc/core/tests/fp8_fast_forms.c and by the GPU tests in
test_fp8.py. Needs a C/C++ compiler and the CUDA toolkit's headers (skipped without them)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cuda_include():
    candidates = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
        with open(nvcc, "rb") as f:  # a wrapper script that execs the real nvcc
            for word in f.read(4096).split():
                if word.endswith(b"/bin/nvcc"):
                    candidates.append(os.path.dirname(os.path.dirname(word.decode())))
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "include", "cuda_fp8.h")):
            return os.path.join(c, "include")
    return None


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory):
    inc = _cuda_include()
    if inc is None or not shutil.which("gcc") or not shutil.which("g++"):
        pytest.skip("needs gcc, g++ and the CUDA toolkit's headers")
    out = tmp_path_factory.mktemp("emu")
    objs = []
    for src in ("quantize.c", "convert.c"):
        obj = str(out / (src + ".o"))
        subprocess.run(["gcc", "-std=c11", "-O2", "-ffp-contract=off", "-c", os.path.join(ROOT, "csrc/core", src),
                        "-o", obj], check=True)
        objs.append(obj)
    exe = str(out / "quant_emu")
    subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas", "-Werror",
                    "-I", os.path.join(ROOT, "tests/emu"), "-I", os.path.join(ROOT, "csrc/cuda"),
                    "-I", os.path.join(ROOT, "csrc/core"), "-I", inc, os.path.join(ROOT, "tests/emu/quant_emu.cpp"),
                    *objs, "-o", exe], check=True)
    return exe


def test_tile_kernels_match_c_core_under_emulation(emu_binary, _fresh_seed):
    r = subprocess.run([emu_binary, str(_fresh_seed)], capture_output=True, text=True, timeout=600)
    print(r.stdout[-4000:])
    assert r.returncode == 0, f"seed {_fresh_seed}:\n{r.stdout[-4000:]}{r.stderr[-2000:]}"
    assert r.stdout.strip().splitlines()[-1].endswith("0 failed")
