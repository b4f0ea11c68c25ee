"""The bf16 FP8 tile kernels (csrc/cuda/quant/quantize_bf16_tile.cuh and swiglu_quantize_tile.cuh) on
the CPU: tests/emu/ runs them through a small CUDA emulation (coroutine threads, shuffles, barriers,
shared memory) and compares every code and scale with the C core, for the row-wise kernels of the
three recipes, the fused row-wise + column-wise kernel, the SwiGLU + quantisation kernels and the MXFP8
quantise-dequantise kernel (csrc/cuda/quant/qdq_mxfp8.cuh: plans, misaligned plans, gathered rows), on
ragged shapes, edge blocks and misaligned pointers.

It checks the kernels' indexing and data flow where there is no GPU; the device arithmetic itself
is covered by the exhaustive proof in csrc/core/tests/fp8_fast_forms.c and by the GPU tests in
test_fp8.py. Needs a C/C++ compiler and the CUDA toolkit's headers (skipped without them)."""
import pytest

import emu_build


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory):
    return emu_build.build(tmp_path_factory.mktemp("emu"), "quant_emu", ("quantize.c", "convert.c"))


def test_tile_kernels_match_c_core_under_emulation(emu_binary, _fresh_seed):
    emu_build.run(emu_binary, _fresh_seed)
