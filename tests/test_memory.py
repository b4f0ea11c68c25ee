"""Memory of the experts' training step, counted by the bytes of live tensors through a dispatch
mode (CPU), against the op-by-op autograd of the same kernels (mok/_ops.py):
- GEMM1 + SwiGLU run as one fused kernel but two autograd nodes (mok/_gate_up.py), so that h and
  d_act are freed before GEMM1's dgrad and weight gradient allocate;
- GEMM2 + the weighted combine are one node (mok/_down_combine.py) that keeps only h from the
  forward to the backward: neither act [rows, I] nor the GEMM2 rows [rows, H].
Both wirings give the same results (the gate_up nodes the same bits; the layer, whose router-weight
gradient takes the other side of GEMM2, within rounding)."""
import contextlib
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mok
from conftest import DEVICES
from mok._gate_up import gate_up_swiglu
from mok._ops import ops
from shapes import MoECase, make_moe_inputs


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that ops create inside the mode and that are still alive; peak kept."""

    def __init__(self):
        super().__init__()
        self.live, self.cur, self.peak = {}, 0, 0

    def _free(self, key):
        self.cur -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.cur += storage.nbytes()
                    self.peak = max(self.peak, self.cur)
                    weakref.finalize(t, self._free, key)
        return out


def op_autograd(x, w, gate_up, down, plan, top_k, gate_up_wiring=None):
    """The experts through the operators' own autograd formulas: GEMM1 + SwiGLU one node (h and
    d_act alive through GEMM1's backward), GEMM2 and the combine their own nodes (act and rows
    saved); or GEMM1 + SwiGLU through gate_up_wiring."""
    if gate_up_wiring is None:
        act = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, top_k, gate_up, plan.offsets)[0]
    else:
        act = gate_up_wiring(x, plan.src_of_row, plan.row_of, top_k, gate_up, plan.offsets)
    rows = ops.grouped_mm(act, None, 1, down, plan.offsets, True)
    return ops.combine(rows, plan.row_of, plan.src_of_row, w.to(rows.dtype if rows.dtype == torch.float64
                                                                  else torch.float32))


def layer(x, w, gate_up, down, plan, top_k):
    return mok.functional.moe_experts(x, plan.src_of_row.new_zeros(x.shape[0], top_k), w, gate_up, down, plan=plan)


def fwd_bwd(case, device, dtype, experts, track=False, skip_first=False, **kw):
    """Gradients of (x, w, gate_up, down), the peak of live bytes and the bytes alive between the
    forward and the backward (tracked on request)."""
    torch.manual_seed(0)
    x, idx, w, gate_up, down = make_moe_inputs(case, dtype, device)
    if skip_first:  # one pair routed to no expert: row_of -1
        idx = idx.clone()
        idx[0, 0] = case.E
    plan = mok.functional.moe_plan(idx, case.E, skip_invalid=skip_first)
    leaves = [t.detach().requires_grad_(True) for t in (x, w, gate_up, down)]
    gy = torch.randn(case.T, case.H, device=device, dtype=dtype)
    mode = LiveBytes() if track else None
    with mode if track else contextlib.nullcontext():
        y = experts(*leaves, plan, case.K, **kw)
        saved = mode.cur if track else None
        grads = torch.autograd.grad(y, leaves, gy)
        del y
    return grads, (mode.peak if track else None), saved, plan


@pytest.mark.parametrize("device", DEVICES)
def test_two_node_gate_up_is_bitwise_the_one_node(device):
    case = MoECase(300, 128, 96, 8, 2, "zipf")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = fwd_bwd(case, device, dtype, op_autograd)[0]
    b = fwd_bwd(case, device, dtype, op_autograd, gate_up_wiring=gate_up_swiglu)[0]
    for ga, gb in zip(a, b):
        assert torch.equal(ga, gb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("skip_first", [False, True])
def test_layer_wiring_matches_op_autograd(device, skip_first):
    # The router-weight gradient comes from d_act's side (d_z . act over I) instead of dy . rows
    # over H, and down's weight gradient from (w * act) and dy instead of act and (w * dy): equal
    # in exact arithmetic. float64 on the CPU (rounding only), bf16 on CUDA (bf16 rounding of the
    # intermediate tensors, both sides).
    case = MoECase(300, 128, 96, 8, 4, "zipf")
    dtype = torch.bfloat16 if device == "cuda" else torch.float64
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-12
    a = fwd_bwd(case, device, dtype, op_autograd, skip_first=skip_first)[0]
    b = fwd_bwd(case, device, dtype, layer, skip_first=skip_first)[0]
    for name, ga, gb in zip(("x", "w", "gate_up", "down"), a, b):
        err = ((ga.double() - gb.double()).norm() / ga.double().norm()).item()
        assert err < tol, (name, err)
    if skip_first:
        assert b[1][0, 0] == 0  # the skipped pair has no gradient


def test_backward_frees_h_and_d_act_before_gemm1():
    # Mixtral's proportions: the weight gradient of gate_up ([E, 2I, H], E * H > rows) is the
    # largest allocation of the backward, so the peak is reached during GEMM1's backward, where
    # the one-node wiring still holds h [rows, 2I] and d_act [rows, I]. (Where the weight gradient
    # is small, the peak is the SwiGLU backward itself.)
    case = MoECase(512, 256, 512, 8, 2, "random")
    _, peak_one, _, plan = fwd_bwd(case, "cpu", torch.float32, op_autograd, track=True)
    _, peak_layer, _, _ = fwd_bwd(case, "cpu", torch.float32, layer, track=True)
    rows = plan.src_of_row.shape[0]
    h_and_d_act = rows * 3 * case.I * 4
    assert peak_layer <= peak_one - h_and_d_act, (peak_one, peak_layer, h_and_d_act)


def saved_bytes(case, experts):
    """Bytes of the storages the autograd graph saves for the backward, besides the leaves (inputs
    and weights, held by the caller anyway) and the plan."""
    torch.manual_seed(0)
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.float32, "cpu")
    plan = mok.functional.moe_plan(idx, case.E)
    leaves = [t.detach().requires_grad_(True) for t in (x, w, gate_up, down)]
    held = {t.untyped_storage().data_ptr() for t in (*leaves, *plan)}
    saved = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in held:
            saved[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        experts(*leaves, plan, case.K)
    return sum(saved.values()), plan.src_of_row.shape[0]


def test_forward_keeps_neither_act_nor_rows_for_backward():
    case = MoECase(512, 256, 128, 8, 4, "random")
    saved_ops, rows = saved_bytes(case, op_autograd)
    saved_layer, _ = saved_bytes(case, layer)
    act_and_rows = rows * (case.I + case.H) * 4
    h = rows * 2 * case.I * 4
    assert saved_ops >= h + act_and_rows, (saved_ops, h, act_and_rows)  # the measure sees them
    assert saved_layer <= saved_ops - act_and_rows, (saved_ops, saved_layer, act_and_rows)


@pytest.mark.parametrize("dims", [(256, 128, 512, 4, 2), (512, 256, 128, 8, 4)], ids=["mixtral_like", "qwen_like"])
def test_fp8_one_node_peak_is_no_higher_than_three_nodes(monkeypatch, dims):
    # every GEMM in FP8 (v52): the one node (FUSED_MLP_COMBINE) drops rows, act's codes and h during its
    # backward as the three nodes free theirs node by node, so its peak of live bytes is not higher
    case = MoECase(*dims, "random")

    def fp8_all(x, w, gate_up, down, plan, top_k):
        return mok.functional.moe_experts(x, plan.src_of_row.new_zeros(x.shape[0], top_k), w, gate_up, down,
                                          plan=plan, recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True)

    # and with the v53 router-weight gradient (ROUTER_GRAD_IN_SWIGLU, the default) rows [R, H] is dropped
    # after the forward's combine, while the row scales s [R] (fp32) live until SwiGLU's backward: no
    # higher than the one node that keeps rows for combine_weight_grad but s's 4 bytes a row (where the
    # peak comes after combine_weight_grad, rows is gone there too)
    peaks = {}
    for fused, scaled in ((True, True), (True, False), (False, False)):
        monkeypatch.setattr(mok._fp8_experts, "FUSED_MLP_COMBINE", fused)
        monkeypatch.setattr(mok._fp8_experts, "ROUTER_GRAD_IN_SWIGLU", scaled)
        _, peaks[fused, scaled], _, _ = fwd_bwd(case, "cpu", torch.bfloat16, fp8_all, track=True)
    rows = case.T * case.K
    assert peaks[True, True] <= peaks[True, False] + 4 * rows and peaks[True, False] <= peaks[False, False], peaks
