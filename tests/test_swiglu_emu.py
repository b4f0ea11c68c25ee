"""The stand-alone SwiGLU CUDA kernels (csrc/cuda/swiglu/swiglu_kernels.cuh: forward, backward, row-scaled backward,
chosen as the launcher chooses them) on the CPU: tests/emu/swiglu_emu.cpp runs them through the CUDA emulation
against the C core, bit for bit (the per-row sums of the scaled backward within rounding, and bit for bit run to
run), every dtype, bf16's vector and scalar paths, padding and out-of-range rows, small grids. The emulation's fast
exp and division are IEEE operations: the device's approximations are test_ops.py's GPU cases' to check."""
import pytest

import emu_build


@pytest.fixture(scope="module")
def swiglu_emu(tmp_path_factory):
    return emu_build.build(tmp_path_factory.mktemp("swiglu_emu"), "swiglu_emu", ("swiglu.c", "convert.c"))


def test_swiglu_kernels_match_c_core_under_emulation(swiglu_emu, _fresh_seed):
    emu_build.run(swiglu_emu, _fresh_seed)
