"""Peak memory of the experts' backward: GEMM1 + SwiGLU run as one fused kernel but two autograd
nodes (mok/_gate_up.py), so that h and d_act are freed before GEMM1's dgrad and weight gradient
allocate. Checked by counting the bytes of live tensors through a dispatch mode (CPU), against the
same layer wired as one node; both wirings give the same bits (CPU and CUDA)."""
import contextlib
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mok
import mok.functional as functional
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


def one_node(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows=None):
    """The op's own autograd: h and d_act stay alive through GEMM1's backward."""
    return ops.grouped_mm_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows)[0]


def fwd_bwd(case, device, dtype, wiring, monkeypatch, track=False):
    torch.manual_seed(0)
    x, idx, w, gate_up, down = make_moe_inputs(case, dtype, device)
    leaves = [t.detach().requires_grad_(True) for t in (x, w, gate_up, down)]
    gy = torch.randn(case.T, case.H, device=device, dtype=dtype)
    monkeypatch.setattr(functional, "gate_up_swiglu", wiring)
    mode = LiveBytes() if track else None
    with mode if track else contextlib.nullcontext():
        y = mok.functional.moe_experts(leaves[0], idx, leaves[1], leaves[2], leaves[3])
        grads = torch.autograd.grad(y, leaves, gy)
        del y
    return grads, (mode.peak if track else None)


@pytest.mark.parametrize("device", DEVICES)
def test_two_node_wiring_is_bitwise_the_one_node_wiring(device, monkeypatch):
    case = MoECase(300, 128, 96, 8, 2, "zipf")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, _ = fwd_bwd(case, device, dtype, one_node, monkeypatch)
    b, _ = fwd_bwd(case, device, dtype, gate_up_swiglu, monkeypatch)
    for ga, gb in zip(a, b):
        assert torch.equal(ga, gb)


def test_backward_frees_h_and_d_act_before_gemm1(monkeypatch):
    # Mixtral's proportions: the weight gradient of gate_up ([E, 2I, H], E * H > rows) is the
    # largest allocation of the backward, so the peak is reached during GEMM1's backward, where
    # the one-node wiring still holds h [rows, 2I] and d_act [rows, I]. (Where the weight gradient
    # is small, the peak is the SwiGLU backward itself, the same in both wirings.)
    case = MoECase(512, 256, 512, 8, 2, "random")
    _, peak_one = fwd_bwd(case, "cpu", torch.float32, one_node, monkeypatch, track=True)
    _, peak_two = fwd_bwd(case, "cpu", torch.float32, gate_up_swiglu, monkeypatch, track=True)
    plan = mok.functional.moe_plan(make_moe_inputs(case, torch.float32, "cpu")[1], case.E)
    rows = plan.src_of_row.shape[0]
    h_and_d_act = rows * 3 * case.I * 4
    assert peak_two <= peak_one - h_and_d_act, (peak_one, peak_two, h_and_d_act)
