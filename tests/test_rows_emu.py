"""The row-movement CUDA kernels (csrc/cuda/rows/rows.cuh: gather_rows, combine, combine_weight_grad, chosen as the
launcher chooses them) on the CPU: tests/emu/rows_emu.cpp runs them through the CUDA emulation against the C core
(gather and combine bit for bit, the weight gradient within rounding and bit for bit run to run), every dtype,
bf16's 16-byte and scalar paths, weights, padding and out-of-range indices, the token walk with a consistent or a
garbage inverse map, grids whose blocks take several rows. The GPU runs the same kernels in test_ops.py's CUDA
cases; this covers their indexing on every CI run."""
import pytest

import emu_build


@pytest.fixture(scope="module")
def rows_emu(tmp_path_factory):
    return emu_build.build(tmp_path_factory.mktemp("rows_emu"), "rows_emu", ("rows.c", "convert.c"))


def test_rows_kernels_match_c_core_under_emulation(rows_emu, _fresh_seed):
    emu_build.run(rows_emu, _fresh_seed)
