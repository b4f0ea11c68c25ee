"""The SIMT grouped GEMM kernels (csrc/cuda/gemm/grouped_gemm_simt.cuh: NT and NN over the plan's rows with
gather-on-load, and the ragged-contraction weight gradient, launched as the library launches them) on the CPU:
tests/emu/gemm_simt_emu.cpp runs them through the CUDA emulation and compares bit for bit with their documented
arithmetic (fused multiply-adds in increasing k from zero, rounded once) and with the C core within rounding, every
dtype, NT and NN, gathered rows, empty and all-taking experts, unused rows, K = 0, small grids. These are the
kernels that serve every dtype but bf16 NT, NN, and unaligned shapes on the GPU."""
import pytest

import emu_build


@pytest.fixture(scope="module")
def gemm_simt_emu(tmp_path_factory):
    return emu_build.build(tmp_path_factory.mktemp("gemm_simt_emu"), "gemm_simt_emu", ("grouped_gemm.c", "convert.c"))


def test_simt_grouped_gemms_match_their_arithmetic_and_the_c_core_under_emulation(gemm_simt_emu, _fresh_seed):
    emu_build.run(gemm_simt_emu, _fresh_seed)
