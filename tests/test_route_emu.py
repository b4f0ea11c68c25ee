"""The router's CUDA kernels (csrc/cuda/route/route_topk.cuh, forward and backward) on the CPU: tests/emu/
route_emu.cpp runs them through the CUDA emulation and compares indices, weights and the logits' gradient bit
for bit with the C core's mok_route_topk / _backward (float and double, softmax and sigmoid, bias, group-limited
top-k, renormalisation, E up to 512, ties and NaN logits, warps that take several tokens). The GPU runs the same
kernels in test_route.py's CUDA cases; this covers their logic, tie and NaN rules on every CI run."""
import pytest

import emu_build


@pytest.fixture(scope="module")
def route_emu(tmp_path_factory):
    return emu_build.build(tmp_path_factory.mktemp("route_emu"), "route_emu", ("route.c",))


def test_route_kernels_match_c_core_under_emulation(route_emu, _fresh_seed):
    emu_build.run(route_emu, _fresh_seed)
