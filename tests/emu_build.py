"""Builds a CPU emulation program of tests/emu/ (a CUDA kernel header run through cuda_emu.h, linked with the C
core files it is compared with) for tests/test_fp8_emu.py and tests/test_plan_emu.py. Needs gcc, g++ and the CUDA
toolkit's headers; build() skips the calling test without them."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_include():
    """The CUDA toolkit's include folder (CUDA_HOME, CUDA_PATH, /usr/local/cuda, or where nvcc lives), or None."""
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


def build(out_dir, program, core_sources):
    """Compiles tests/emu/<program>.cpp with the C core's `core_sources` (file names in csrc/core) into out_dir;
    returns the executable's path."""
    inc = cuda_include()
    if inc is None or not shutil.which("gcc") or not shutil.which("g++"):
        pytest.skip("needs gcc, g++ and the CUDA toolkit's headers")
    objs = []
    for src in core_sources:
        obj = os.path.join(str(out_dir), src + ".o")
        subprocess.run(["gcc", "-std=c11", "-O2", "-ffp-contract=off", "-c", os.path.join(ROOT, "csrc/core", src),
                        "-o", obj], check=True)
        objs.append(obj)
    exe = os.path.join(str(out_dir), program)
    subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas", "-Werror",
                    "-I", os.path.join(ROOT, "tests/emu"), "-I", os.path.join(ROOT, "csrc/cuda"),
                    "-I", os.path.join(ROOT, "csrc/core"), "-I", inc, os.path.join(ROOT, "tests/emu", program + ".cpp"),
                    *objs, "-o", exe], check=True)
    return exe


def run(exe, seed):
    """Runs the program with a seed; asserts it passed every case (its last line: "N passed, 0 failed")."""
    r = subprocess.run([exe, str(seed)], capture_output=True, text=True, timeout=600)
    print(r.stdout[-4000:])
    assert r.returncode == 0, f"seed {seed}:\n{r.stdout[-4000:]}{r.stderr[-2000:]}"
    assert r.stdout.strip().splitlines()[-1].endswith(" 0 failed")
