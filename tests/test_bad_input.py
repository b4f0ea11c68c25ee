"""Every kind of bad input raises ValueError (or RuntimeError) naming the argument."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import mok
from mok._ops import ops
from shapes import MoECase, make_moe_inputs

CASE = MoECase(10, 16, 8, 4, 2)


def inputs(dtype=torch.float32):
    return list(make_moe_inputs(CASE, dtype))


def call(args, **kw):
    return mok.functional.moe_experts(*args, **kw)


def replaced(i, value):
    args = inputs()
    args[i] = value(args[i]) if callable(value) else value
    return args


BAD = {
    "x_dtype": (replaced(0, lambda x: x.to(torch.int64)), r"\bx\b.*(bfloat16|dtype)"),
    "x_shape": (replaced(0, lambda x: x[None]), r"\bx\b.*2-D"),
    "topk_idx_dtype": (replaced(1, lambda i: i.float()), r"topk_idx.*int32 or int64"),
    "topk_idx_shape": (replaced(1, lambda i: i[:5]), r"topk_idx.*shape"),
    "topk_w_shape": (replaced(2, lambda w: w[:, :1]), r"topk_w.*shape"),
    "topk_w_dtype": (replaced(2, lambda w: w.to(torch.int32)), r"topk_w.*floating"),
    "gate_up_dims": (replaced(3, lambda g: g[0]), r"gate_up_proj.*3-D"),
    "gate_up_hidden": (replaced(3, lambda g: g[:, :, :8].contiguous()), r"gate_up_proj.shape\[2\]"),
    "gate_up_odd": (replaced(3, lambda g: g[:, :15].contiguous()), r"gate_up_proj.shape\[1\].*even"),
    "down_mismatch": (replaced(4, lambda d: d[:, :, :4].contiguous()), r"down_proj.*shape"),
    "weight_dtype": (replaced(4, lambda d: d.double()), r"down_proj.*dtype"),
    "weight_layout": (replaced(3, lambda g: g.transpose(1, 2).contiguous().transpose(1, 2)), r"gate_up_proj.*contiguous"),
    "k_gt_e": (None, r"top_k.*num_experts"),
    "expert_id_range": (replaced(1, lambda i: torch.where(i == 3, torch.full_like(i, 4), i)), r"topk_idx.*expert id"),
    "negative_expert_id": (replaced(1, lambda i: torch.where(i == 1, torch.full_like(i, -1), i)), r"topk_idx.*expert id"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_argument(case):
    args, pattern = BAD[case]
    if case == "k_gt_e":
        x, _, _, gate_up, down = inputs()
        args = [x, torch.zeros(10, 5, dtype=torch.int64), torch.ones(10, 5), gate_up, down]
    with pytest.raises((ValueError, RuntimeError), match=pattern):
        call(args)


def test_device_mismatch_is_named():
    args = inputs()
    args[1] = args[1].to("meta")
    with pytest.raises(ValueError, match=r"topk_idx.*device"):
        call(args)


@pytest.mark.parametrize("bad,pattern", [
    (lambda: ops.grouped_mm(torch.randn(4, 3), None, 1, torch.randn(2, 5, 4), torch.zeros(3, dtype=torch.int32),
                            True), r"\ba\.shape\[1\]"),
    (lambda: ops.grouped_mm(torch.randn(4, 3), None, 1, torch.randn(2, 5, 3), torch.zeros(2, dtype=torch.int32),
                            True), r"offsets"),
    (lambda: ops.grouped_mm(torch.randn(4, 3), None, 1, torch.randn(2, 5, 3).double(),
                            torch.zeros(3, dtype=torch.int32), True), r"same dtype"),
    (lambda: ops.grouped_mm(torch.randn(4, 3), None, 1, torch.randn(2, 5, 3), torch.zeros(3), True),
     r"offsets must be Int"),
    (lambda: ops.combine(torch.randn(8, 3), torch.zeros(2, 2, dtype=torch.int32), torch.zeros(7, dtype=torch.int32),
                         None), r"src_of_row"),
    (lambda: ops.swiglu(torch.randn(3, 5)), r"\bh\b.*even"),
    # row_of (gather_rows' inverse-map hint) must be [T, top_k] int32
    (lambda: ops.gather_rows(torch.randn(4, 8), torch.zeros(8, dtype=torch.int32), None, 2,
                             torch.zeros(4, 3, dtype=torch.int32)), r"row_of"),
    (lambda: ops.gather_rows(torch.randn(4, 8), torch.zeros(8, dtype=torch.int32), None, 2,
                             torch.zeros(4, 2, dtype=torch.int64)), r"row_of must be Int"),
    (lambda: ops.route_topk(torch.randn(3, 4).half(), None, 2, 0, 1, 1, True, 1.0), r"logits.*float32"),
    (lambda: ops.route_topk(torch.randn(3, 4), None, 5, 0, 1, 1, True, 1.0), r"top_k"),
    (lambda: ops.route_topk(torch.randn(3, 6), None, 2, 0, 4, 1, True, 1.0), r"n_group"),
    (lambda: ops.route_topk(torch.randn(3, 4), None, 2, 3, 1, 1, True, 1.0), r"score_func"),
    (lambda: ops.route_topk(torch.randn(3, 4), torch.randn(5), 2, 0, 1, 1, True, 1.0), r"bias"),
    (lambda: ops.moe_plan(torch.zeros(3, 2, dtype=torch.int64), 4, 128, False), r"topk_idx must be Int"),
    (lambda: ops.grouped_mm(torch.randn(4, 6)[:, ::2], None, 1, torch.randn(2, 5, 3),
                            torch.zeros(3, dtype=torch.int32), True), r"\ba must be contiguous"),
    # x_rows must have one row per row of the plan (src_of_row) and x's hidden size
    (lambda: ops.grouped_mm_swiglu(torch.randn(4, 3), torch.zeros(8, dtype=torch.int32),
                                   torch.zeros(4, 2, dtype=torch.int32), 2, torch.randn(2, 6, 3),
                                   torch.tensor([0, 4, 8], dtype=torch.int32), torch.randn(7, 3)), r"x_rows"),
    (lambda: ops.grouped_mm_swiglu(torch.randn(4, 3), torch.zeros(8, dtype=torch.int32),
                                   torch.zeros(4, 2, dtype=torch.int32), 2, torch.randn(2, 6, 3),
                                   torch.tensor([0, 4, 8], dtype=torch.int32), torch.randn(8, 5)), r"x_rows"),
    # swiglu_scaled_backward: d_z half the width of h, one src_of_row entry per row, w in the
    # accumulation type, src_of_row inside w (the CPU kernel reports it)
    (lambda: ops.swiglu_scaled_backward(torch.randn(4, 6), torch.randn(4, 2), torch.zeros(4, dtype=torch.int32),
                                        torch.rand(2, 2)), r"d_z\.shape\[1\]"),
    (lambda: ops.swiglu_scaled_backward(torch.randn(4, 6), torch.randn(4, 3), torch.zeros(5, dtype=torch.int32),
                                        torch.rand(2, 2)), r"src_of_row\.shape\[0\]"),
    (lambda: ops.swiglu_scaled_backward(torch.randn(4, 6), torch.randn(4, 3), torch.zeros(4, dtype=torch.int32),
                                        torch.rand(2, 2).double()), r"\bw must be Float"),
    (lambda: ops.swiglu_scaled_backward(torch.randn(4, 6), torch.randn(4, 3), torch.full((4,), 4, dtype=torch.int32),
                                        torch.rand(2, 2)), r"src_of_row\[0\] = 4 is not a pair of w"),
])
def test_op_level_checks(bad, pattern):
    with pytest.raises((ValueError, RuntimeError), match=pattern):
        bad()


def test_router_and_layer_arguments():
    with pytest.raises(ValueError, match="top_k"):
        mok.MoE(16, 8, 4, 5)
    with pytest.raises(ValueError, match="score_func"):
        mok.MoE(16, 8, 4, 2, score_func="relu")
    with pytest.raises(ValueError, match="n_group"):
        mok.MoE(16, 8, 6, 2, n_group=4)
    with pytest.raises(ValueError, match="hidden_size"):
        mok.MoE(16, 8, 4, 2)(torch.randn(3, 12))
    with pytest.raises(ValueError, match="score_func"):
        mok.functional.route_topk(torch.randn(3, 4), 2, score_func="tanh")


# ---------------------------------------------------------------- the C++ runtime of the extension


def _needed_libraries(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None,
                    reason="needs Linux and readelf")
def test_extension_links_the_shared_cxx_runtime():
    # A toolchain that links libstdc++.a (the H200 machine's /opt/gcc g++) gave the extension a private,
    # partly initialised copy of the C++ runtime: an error message that formats a number crashed the
    # process (segmentation fault) instead of raising. setup.py links torch's libstdc++.so explicitly.
    so = glob.glob(os.path.join(os.path.dirname(mok.__file__), "_C*.so"))
    assert so, "no mok/_C*.so next to the package"
    assert any(lib.startswith("libstdc++.so") for lib in _needed_libraries(so[0])), _needed_libraries(so[0])


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_an_error_that_formats_numbers_raises(device):
    # K = 100 is printed as a number (the crash above happened exactly here)
    e4m3 = torch.float8_e4m3fn
    a, b = torch.zeros(256, 100, device=device).to(e4m3), torch.zeros(2, 128, 100, device=device).to(e4m3)
    offsets = torch.tensor([0, 128, 256], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"K \(a.shape\[1\]\) must be a multiple of 128 .*got 100"):
        ops.grouped_mm_fp8(a, torch.ones(256, 1, device=device), b, torch.ones(2, 1, 1, device=device), offsets)
