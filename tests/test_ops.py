"""Each operator against its float64 reference in mok.reference, on ragged plans."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok import reference
from mok._ops import ops
from shapes import TOL, MoECase, enumerate_moe_cases, make_moe_inputs, make_routing, rel_err

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
CASES = enumerate_moe_cases()


def plan_for(case, device, tile=128):
    idx = make_routing(case.T, case.K, case.E, case.routing)
    return idx, mok.functional.moe_plan(idx.to(device), case.E, tile=tile), reference.moe_plan(idx, case.E, tile)


def filled_rows(plan, H, dtype, device):
    """Rows with random values where the plan has a pair, zeros in padding rows (the invariant)."""
    rows = torch.randn(plan.src_of_row.shape[0], H, dtype=torch.float64)
    rows[plan.src_of_row.cpu() < 0] = 0
    return rows.to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("trans_b", [True, False], ids=["nt", "nn"])
def test_grouped_mm(device, dtype, case, trans_b):
    _, plan, _ = plan_for(case, device)
    R, Kd, N = plan.src_of_row.shape[0], case.H, case.I
    a = filled_rows(plan, Kd, dtype, device)
    b = torch.randn(case.E, *((N, Kd) if trans_b else (Kd, N)), dtype=torch.float64).to(device, dtype)
    out = ops.grouped_mm(a, None, 1, b, plan.offsets, trans_b)
    ref = reference.grouped_mm(a.double().cpu(), b.double().cpu(), plan.offsets.cpu(), trans_b)
    assert out.shape == (R, N)
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_grouped_mm_swiglu_gathers_token_rows(device, dtype, case):
    x, idx, _, gate_up, _ = make_moe_inputs(case, dtype, device)
    plan = mok.functional.moe_plan(idx, case.E)
    act, h = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, case.K, gate_up, plan.offsets)
    ref_h = reference.grouped_mm(x.double().cpu(), gate_up.double().cpu(), plan.offsets.cpu(), True,
                                 a_gather=plan.src_of_row.cpu(), a_gather_div=case.K)
    assert rel_err(h, ref_h) < TOL[dtype]
    assert rel_err(act, reference.swiglu(ref_h)) < TOL[dtype]
    # act is SwiGLU of the rounded h, exactly (the epilogue works on the stored values).
    torch.testing.assert_close(act, ops.swiglu(h), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_grouped_mm_swiglu_on_gathered_rows_is_bitwise_the_same(device, dtype, case):
    """x_rows (a gathered copy of x) changes how GEMM1 reads its rows and what the weight
    gradient reads, not a single bit of the outputs or of the gradients."""
    x, idx, _, gate_up, _ = make_moe_inputs(case, dtype, device)
    plan = mok.functional.moe_plan(idx, case.E)
    outs = []
    for use_rows in (False, True):
        xg, gu = x.clone().requires_grad_(True), gate_up.clone().requires_grad_(True)
        x_rows = ops.gather_rows(x, plan.src_of_row, None, case.K) if use_rows else None
        act, h = ops.grouped_mm_swiglu(xg, plan.src_of_row, plan.row_of, case.K, gu, plan.offsets, x_rows)
        d_act = torch.linspace(-1, 1, act.numel(), device=device, dtype=dtype).reshape(act.shape)
        grads = torch.autograd.grad(act, (xg, gu), d_act)
        outs.append((act, h) + grads)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("gather", [False, True])
def test_grouped_mm_wgrad(device, dtype, case, gather):
    _, plan, _ = plan_for(case, device)
    a = filled_rows(plan, case.I, dtype, device)
    if gather:
        b = torch.randn(case.T, case.H, dtype=torch.float64).to(device, dtype)
        out = ops.grouped_mm_wgrad(a, b, plan.src_of_row, case.K, plan.offsets)
        ref = reference.grouped_mm_wgrad(a.double().cpu(), b.double().cpu(), plan.offsets.cpu(),
                                         plan.src_of_row.cpu(), case.K)
    else:
        b = filled_rows(plan, case.H, dtype, device)
        out = ops.grouped_mm_wgrad(a, b, None, 1, plan.offsets)
        ref = reference.grouped_mm_wgrad(a.double().cpu(), b.double().cpu(), plan.offsets.cpu())
    assert out.shape == (case.E, case.I, case.H)
    assert rel_err(out, ref) < TOL[dtype]
    empty = (plan.counts.cpu() == 0)
    assert out.cpu()[empty].abs().sum() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_combine_gather_and_weight_grad(device, dtype, case):
    _, plan, _ = plan_for(case, device)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    rows = filled_rows(plan, case.H, dtype, device)
    w = torch.rand(case.T, case.K, dtype=acc, device=device)
    y = ops.combine(rows, plan.row_of, plan.src_of_row, w)
    assert rel_err(y, reference.combine(rows.double().cpu(), plan.row_of.cpu(), w.double().cpu())) < TOL[dtype]
    y1 = ops.combine(rows, plan.row_of, plan.src_of_row, None)
    assert rel_err(y1, reference.combine(rows.double().cpu(), plan.row_of.cpu())) < TOL[dtype]
    dy = torch.randn(case.T, case.H, dtype=torch.float64).to(device, dtype)
    g = ops.gather_rows(dy, plan.src_of_row, w, case.K)
    assert rel_err(g, reference.gather_rows(dy.double().cpu(), plan.src_of_row.cpu(), case.K,
                                            w.double().cpu())) < TOL[dtype]
    dw = ops.combine_weight_grad(dy, rows, plan.row_of)
    ref_dw = (dy.double().cpu()[:, None, :] * rows.double().cpu()[plan.row_of.cpu().long().clamp(min=0)]).sum(-1)
    ref_dw[plan.row_of.cpu() < 0] = 0
    assert dw.dtype == acc and rel_err(dw, ref_dw) < TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
# + no tokens at K = 4, and K = 8, 32 (the token walk's bounds) and 33 (past them: the row walk)
@pytest.mark.parametrize("case", CASES + [MoECase(0, 32, 16, 8, 4), MoECase(200, 64, 16, 40, 8),
                                          MoECase(40, 64, 16, 40, 32), MoECase(40, 64, 16, 40, 33)], ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["copy", "weighted"])
def test_gather_rows_by_token_is_bitwise_the_per_row_gather(device, case, weighted):
    # row_of only changes how the CUDA kernel walks (by token, x read once); the rows must be the
    # same bits, also when row_of disagrees with src_of_row (the rows it misses are copied per row)
    _, plan, _ = plan_for(case, device)
    H = 8 * max(1, -(-case.H // 8))  # bf16 rows of 16-byte vectors take the token walk
    x = torch.randn(case.T, H, device=device).to(torch.bfloat16)
    w = torch.rand(case.T, case.K, device=device) if weighted else None
    per_row = ops.gather_rows(x, plan.src_of_row, w, case.K)
    assert torch.equal(ops.gather_rows(x, plan.src_of_row, w, case.K, plan.row_of), per_row)
    R = plan.src_of_row.shape[0]
    wrong = plan.row_of.flatten().roll(1)
    if wrong.numel() > 2:
        wrong[0], wrong[1] = -1, R + 5
    wrong = wrong.reshape(plan.row_of.shape).contiguous()
    assert torch.equal(ops.gather_rows(x, plan.src_of_row, w, case.K, wrong), per_row)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("I", [45, 96])  # the scalar kernels, and bf16's 8-wide vectors
def test_swiglu_forward_backward(device, dtype, I):
    h = 2 * torch.randn(77, 2 * I, dtype=torch.float64)
    d_act = torch.randn(77, I, dtype=torch.float64)
    href = h.clone().requires_grad_(True)
    reference.swiglu(href).backward(d_act)
    act = ops.swiglu(h.to(device, dtype))
    d_h = ops.swiglu_backward(h.to(device, dtype), d_act.to(device, dtype))
    assert rel_err(act, reference.swiglu(h)) < TOL[dtype]
    assert rel_err(d_h, href.grad) < TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("I", [45, 96])  # the scalar kernel, and bf16's 8-wide vectors
def test_swiglu_scaled_backward(device, dtype, case, I):
    _, plan, _ = plan_for(case, device)
    R = plan.src_of_row.shape[0]
    h = 2 * torch.randn(R, 2 * I, dtype=torch.float64)
    d_z = torch.randn(R, I, dtype=torch.float64)
    w = torch.rand(case.T, case.K, dtype=torch.float64)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    args = (h.to(device, dtype), d_z.to(device, dtype), plan.src_of_row, w.to(device, acc))
    d_h, z, d_s = ops.swiglu_scaled_backward(*args)
    assert d_h.shape == (R, 2 * I) and z.shape == (R, I) and d_s.shape == (R,) and d_s.dtype == acc
    ref = reference.swiglu_scaled_backward(h.to(dtype), d_z.to(dtype), plan.src_of_row.cpu(), w.to(acc))
    for got, want in zip((d_h, z, d_s), ref):
        assert rel_err(got, want) < TOL[dtype]
    pad = plan.src_of_row < 0  # padding rows: s = 0
    assert not z[pad].any() and not d_h[pad].any()
    again = ops.swiglu_scaled_backward(*args)
    assert all(torch.equal(a, b) for a, b in zip((d_h, z, d_s), again))  # deterministic


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_ops(device):
    case = MoECase(9, 6, 5, 4, 2, "empty_expert")
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.float64, device, requires_grad=True)
    plan = mok.functional.moe_plan(idx, case.E, tile=4)

    def gemm1(x, gu):
        act, h = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, case.K, gu, plan.offsets)
        return act, h

    assert torch.autograd.gradcheck(gemm1, (x, gate_up))
    # x_rows must be the gathered x: rebuilt from x, so that gradcheck's perturbations reach it
    assert torch.autograd.gradcheck(
        lambda x, gu: ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, case.K, gu, plan.offsets,
                                            ops.gather_rows(x.detach(), plan.src_of_row, None, case.K)),
        (x, gate_up))
    act = gemm1(x, gate_up)[0].detach().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, d: ops.grouped_mm(a, None, 1, d, plan.offsets, True), (act, down))
    rows = torch.randn(act.shape[0], case.H, dtype=torch.float64, device=device)
    rows[plan.src_of_row < 0] = 0
    rows.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda r, ww: ops.combine(r, plan.row_of, plan.src_of_row, ww), (rows, w))
    h = torch.randn(7, 8, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(ops.swiglu, (h,))
    b_nn = torch.randn(case.E, case.I, case.H, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ops.grouped_mm(a, None, 1, b, plan.offsets, False), (act, b_nn))
