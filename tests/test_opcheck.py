"""torch.library.opcheck on every mok operator (schema, fake kernel, autograd registration,
aot dispatch). The list of operators is enforced: a new operator without a case fails here."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok._ops import ALL_OPS, ops
from shapes import MoECase, make_moe_inputs



def op_cases(device):
    case = MoECase(13, 12, 10, 4, 2, "empty_expert")
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.float32, device)
    plan = mok.functional.moe_plan(idx, case.E, tile=8)
    plan128 = mok.functional.moe_plan(idx, case.E, tile=128)
    R = plan.src_of_row.shape[0]
    rows = torch.randn(R, case.H, device=device)
    rows[plan.src_of_row < 0] = 0
    act = torch.randn(R, case.I, device=device)
    logits = torch.randn(case.T, case.E, device=device)
    grad = lambda t: t.clone().requires_grad_(True)  # noqa: E731
    gate, up = gate_up[:, :case.I].contiguous(), gate_up[:, case.I:].contiguous()  # torchtitan's w1, w3
    d_h = torch.randn(R, 2 * case.I, device=device)
    return {
        "route_topk": [(grad(logits), None, 2, 0, 1, 1, True, 1.0),
                       (grad(logits), torch.rand(4, device=device), 2, 1, 2, 1, True, 2.5)],
        "route_topk_backward": [(torch.randn(case.T, 2, device=device), logits,
                                 ops.route_topk(logits, None, 2, 0, 1, 1, True, 1.0)[1], 0, True, 1.0)],
        "moe_plan": [(idx.to(torch.int32), case.E, 8, False), (idx.to(torch.int32), case.E, 128, True)],
        "gather_rows": [(x, plan.src_of_row, w, case.K), (x, plan.src_of_row, None, case.K),
                        (x, plan.src_of_row, w, case.K, plan.row_of)],
        "combine": [(grad(rows), plan.row_of, plan.src_of_row, grad(w)), (grad(rows), plan.row_of, plan.src_of_row, None)],
        "combine_weight_grad": [(torch.randn(case.T, case.H, device=device), rows, plan.row_of)],
        "swiglu": [(grad(torch.randn(9, 16, device=device)),)],
        "swiglu_backward": [(torch.randn(9, 16, device=device), torch.randn(9, 8, device=device))],
        "swiglu_scaled_backward": [(torch.randn(R, 2 * case.I, device=device), torch.randn(R, case.I, device=device),
                                    plan.src_of_row, w.float())],
        "grouped_mm": [(grad(act), None, 1, grad(down), plan.offsets, True),
                       (grad(rows), None, 1, grad(down), plan.offsets, False)],
        "grouped_mm_swiglu": [(grad(x), plan.src_of_row, plan.row_of, case.K, grad(gate_up), plan.offsets),
                              (grad(x), plan.src_of_row, plan.row_of, case.K, grad(gate_up), plan.offsets,
                               ops.gather_rows(x, plan.src_of_row, None, case.K)),
                              (grad(x), plan.src_of_row, plan.row_of, case.K, grad(gate), plan.offsets, None,
                               grad(up))],
        "grouped_mm_wgrad": [(act, rows, None, 1, plan.offsets), (act, x, plan.src_of_row, case.K, plan.offsets)],
        "grouped_mm_gate_up_dgrad": [(d_h, gate, up, plan.offsets)],
        "grouped_mm_gate_up_wgrad": [(d_h, rows, None, 1, plan.offsets), (d_h, x, plan.src_of_row, case.K, plan.offsets)],
        "grouped_mm_mxfp8_a": [(act.bfloat16(), None, 1, down.bfloat16(), plan.offsets, True),
                               (rows.bfloat16(), None, 1, down.bfloat16(), plan.offsets, False),
                               (x.bfloat16(), plan.src_of_row, case.K, gate_up.bfloat16(), plan.offsets, True)],
        "grouped_mm_swiglu_mxfp8_a": [(x.bfloat16(), plan.src_of_row, case.K, gate_up.bfloat16(), plan.offsets)],
        "transpose_fp8_codes": [(mok.fp8.quantize(torch.randn(48, 128, device=device), "blockwise_1x128")[0].view(2, 48, 64),),
                                (torch.randint(0, 255, (3, 40, 24), dtype=torch.uint8, device=device),)],
        "quantize_fp8_weight_rowcol": [(torch.randn(2, 256, 200, device=device, dtype=dt),)
                                       for dt in (torch.bfloat16, torch.float32)]
                                      + [(torch.randn(2, 128, 256, device=device, dtype=torch.bfloat16),
                                          torch.randn(2, 128, 256, device=device, dtype=torch.bfloat16))],
        "quantize_fp8_weight": [(torch.randn(2, 256, 200, device=device, dtype=torch.bfloat16),),
                                (torch.randn(2, 128, 256, device=device, dtype=torch.bfloat16),
                                 torch.randn(2, 128, 256, device=device, dtype=torch.bfloat16))],
        "quantize_fp8": [(torch.randn(5, 200, device=device), r)
                         for r in ("blockwise_1x128", "blockwise_128x128", "mxfp8")],
        "dequantize_fp8": [(*ops.quantize_fp8(torch.randn(5, 200, device=device), r), r)
                           for r in ("blockwise_1x128", "blockwise_128x128", "mxfp8")],
        "quantize_fp8_rowcol": [(torch.randn(130, 40, device=device, dtype=dt), r, mn)
                                for r in ("blockwise_1x128", "mxfp8") for dt in (torch.bfloat16, torch.float32)
                                for mn in (False, True)]
                               + [(torch.randn(130, 40, device=device, dtype=torch.bfloat16), "blockwise_1x128", mn,
                                   "blockwise_128x128") for mn in (False, True)],
        "quantize_fp8_rowcol_gather": [(x.to(dt), plan.src_of_row, wt, case.K, r, mn)
                                       for r in ("blockwise_1x128", "mxfp8") for dt in (torch.bfloat16, torch.float32)
                                       for wt in (None, w.float()) for mn in (False, True)]
                                      + [(x, plan.src_of_row, w.float(), case.K, "blockwise_1x128", True,
                                          "blockwise_128x128")],
        "swiglu_quantize_fp8": [(torch.randn(130, 256, device=device, dtype=torch.bfloat16), None, True, True, False),
                                (torch.randn(130, 256, device=device, dtype=torch.bfloat16),
                                 torch.randn(130, 128, device=device, dtype=torch.bfloat16), True, False, True),
                                (torch.randn(9, 80, device=device), torch.randn(9, 40, device=device), False, True,
                                 True),
                                (torch.randn(130, 512, device=device, dtype=torch.bfloat16),
                                 torch.randn(130, 256, device=device, dtype=torch.bfloat16), True, True, False, True,
                                 "blockwise_128x128")],
        "swiglu_scaled_quantize_fp8": [(torch.randn(130, 256, device=device, dtype=torch.bfloat16), None,
                                        torch.rand(130, device=device), True, True),
                                       (torch.randn(130, 512, device=device, dtype=torch.bfloat16),
                                        torch.randn(130, 256, device=device, dtype=torch.bfloat16),
                                        torch.rand(130, device=device), True, True, True, "blockwise_128x128"),
                                       (torch.randn(9, 80, device=device), torch.randn(9, 40, device=device),
                                        torch.rand(9, device=device), False, True)],
        "grouped_mm_fp8": [fp8_gemm_case(device)],
        "grouped_mm_fp8_swiglu": [fp8_gemm_case(device)],  # b's 256 rows: [gate | up] of I = 128
        "grouped_mm_fp8_wgrad": [fp8_wgrad_case(device)],
        "grouped_mm_fp8_gate_up_wgrad": [fp8_wgrad_case(device)],  # a's 256 rows: [gate | up] of I = 128
        "qdq_mxfp8": [(torch.randn(96, 64, device=device, dtype=torch.bfloat16), None, True, False),
                      (torch.randn(96, 64, device=device, dtype=torch.bfloat16),
                       torch.tensor([0, 32, 32, 96], dtype=torch.int32, device=device), True, True)],
        # offsets of a 128-row plan: the CUDA column-wise copy needs 32-aligned segments
        "qdq_mxfp8_gather": [(x.to(torch.bfloat16), plan128.src_of_row, wt, case.K, offsets, want_rows, want_cols)
                             for wt in (None, w.float()) for offsets in (None, plan128.offsets)
                             for want_rows, want_cols in ((True, False), (True, True), (False, True))],
    }


def fp8_gemm_case(device):
    # 128-row plan tiles (the CUDA kernel needs them), K and N multiples of 128; more ragged cases
    # in tests/test_fp8_gemm.py.
    case = MoECase(13, 256, 128, 4, 2, "empty_expert")
    idx = make_moe_inputs(case, torch.float32, device)[1]
    plan = mok.functional.moe_plan(idx, case.E, tile=128)
    a = torch.randn(plan.src_of_row.shape[0], case.I, device=device)
    b = torch.randn(case.E, case.H, case.I, device=device)
    a_q, a_s = mok.fp8.quantize(a, "blockwise_1x128")
    b_q, b_s = mok.fp8_gemm.quantize_weight_blockwise(b)
    return a_q, a_s, b_q, b_s, plan.offsets


def fp8_wgrad_case(device):
    # column-wise copies of two [R, M] / [R, N] row blocks over a 128-row plan; M, N multiples of 128
    case = MoECase(13, 128, 128, 4, 2, "empty_expert")
    idx = make_moe_inputs(case, torch.float32, device)[1]
    plan = mok.functional.moe_plan(idx, case.E, tile=128)
    R = plan.src_of_row.shape[0]
    a_q, a_s = mok.fp8_gemm.quantize_colwise_blockwise(torch.randn(R, 256, device=device))
    b_q, b_s = mok.fp8_gemm.quantize_colwise_blockwise(torch.randn(R, 128, device=device))
    return a_q, a_s, b_q, b_s, plan.offsets


def test_every_op_has_a_case():
    registered = {name for name in ALL_OPS}
    assert set(op_cases("cpu")) == registered - {"device_errors"}, "add an opcheck case for each new op"
    for name in ALL_OPS:
        assert hasattr(ops, name), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for n in ALL_OPS if n != "device_errors"])
def test_opcheck(device, name):
    # NOTE: opcheck's schema test does arithmetic on the inputs, which float8 tensors do not support.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    fp8_out = ("transpose_fp8_codes", "dequantize_fp8", "swiglu_quantize_fp8", "swiglu_scaled_quantize_fp8", "grouped_mm_fp8",
               "grouped_mm_fp8_swiglu", "grouped_mm_fp8_wgrad", "grouped_mm_fp8_gate_up_wgrad")
    kw = {"test_utils": utils} if name in fp8_out else {}
    for args in op_cases(device)[name]:
        torch.library.opcheck(getattr(ops, name).default, args, **kw)


def test_device_errors_op_reads_zero_without_errors():
    assert ops.device_errors(False) in (0, 1)
    mok.check_errors()
    assert ops.device_errors(False) == 0
