"""The routing plan's CUDA kernels (csrc/cuda/plan/plan_build.cuh) on the CPU: tests/emu/plan_emu.cpp runs them
through the CUDA emulation in their launcher's order and compares counts, offsets, row_of, src_of_row,
num_skipped and the error word with the C core's mok_plan_build, on random routings (uniform, one expert, a few),
T * K across the kernels' 256-pair chunks, E past a block's threads and the offsets kernel's 1024, several
tiles, spare capacity and invalid expert ids (skipped or reported). The GPU runs the same kernels in
test_plan.py's CUDA cases; this covers their indexing on every CI run."""
import pytest

import emu_build


@pytest.fixture(scope="module")
def plan_emu(tmp_path_factory):
    return emu_build.build(tmp_path_factory.mktemp("plan_emu"), "plan_emu", ("plan.c",))


def test_plan_kernels_match_c_core_under_emulation(plan_emu, _fresh_seed):
    emu_build.run(plan_emu, _fresh_seed)
