"""The routed experts under recipe="blockwise" (FP8 forward GEMMs, BF16 backward): outputs against
a float64 emulation of the recipe's numerics, gradients against the BF16 formulas evaluated at the
FP8 forward's activations, the weight cache, input errors, torch.compile."""
import pytest
import torch

import mok
from mok import reference as R

from conftest import DEVICES
from shapes import MoECase, make_moe_inputs, rel_err

CASES = [
    MoECase(0, 128, 128, 4, 2),  # no tokens
    MoECase(1, 128, 128, 4, 1),  # one token, K = 1
    MoECase(37, 256, 128, 6, 2, "empty_expert"),
    MoECase(53, 128, 256, 5, 1, "one_expert"),
    MoECase(150, 128, 384, 8, 3, "zipf"),
]
# The emulation rounds h and act to bf16 as the kernels do; what is left is the bf16 rounding of y
# and of the BF16 backward's tensors (measured 1.7e-3 for y, 2-4e-3 for the gradients on the CPU)
# and, rarely, an E4M3 code of act flipped by the GEMM's summation order. 1e-2 still fails on a
# wrong scale (~1e0), a wrong expert (~1.4e0) or a dropped K-block (~1e-1).
TOL_EMULATION = 1e-2
# FP8 against the float64 BF16 layer: 3 mantissa bits per operand, two GEMMs (measured ~0.065).
TOL_VS_BF16_MATH = 0.12


def _dq(t, recipe):
    """float64 dequantisation of t's quantisation by the recipe (the C core's rules)."""
    q, s = R.quantize_fp8(t.detach().double().cpu(), recipe)
    return R.dequantize_fp8(q, s, recipe).double()


def _dq_weight(w):
    E, N, K = w.shape
    return _dq(w.reshape(E * N, K), "blockwise_128x128").view(E, N, K)


def _emulate(x, idx, w, gate_up, down):
    """(y, float64 graph inputs) of the recipe: per (token, k) pair, h = bf16(q(x) Q(gate_up)^T),
    act = bf16(SwiGLU(h)), rows = bf16(q(act) Q(down)^T), y = sum_k w * rows. The returned y carries
    the BF16 backward's gradients (straight-through the FP8 rounding) in float64."""
    x64, gu64, dn64, w64 = (t.detach().double().cpu().requires_grad_(True) for t in (x, gate_up, down, w))
    idx = idx.long().cpu()
    T, K = idx.shape
    xq = _dq(x, "blockwise_1x128")
    gu_q, dn_q = _dq_weight(gate_up), _dq_weight(down)
    y = torch.zeros(T, x.shape[1], dtype=torch.float64)
    for k in range(K):
        e = idx[:, k]
        h_fp8 = torch.einsum("th,tnh->tn", xq, gu_q[e]).bfloat16().double()
        h_math = torch.einsum("th,tnh->tn", x64, gu64[e])
        h = h_math + (h_fp8 - h_math).detach()
        act_val = R.swiglu(h_fp8).bfloat16().double()  # mok's SwiGLU: exact, rounded once
        act_math = R.swiglu(h)
        act = act_math + (act_val - act_math).detach()
        rows_fp8 = torch.einsum("ti,thi->th", _dq(act_val, "blockwise_1x128"), dn_q[e]).bfloat16().double()
        rows_math = torch.einsum("ti,thi->th", act, dn64[e])
        rows = rows_math + (rows_fp8 - rows_math).detach()
        y = y + rows * w64[:, k : k + 1]
    return y, (x64, w64, gu64, dn64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_blockwise_experts_match_the_fp8_emulation(device, case):
    x, idx, w, gu, dn = make_moe_inputs(case, torch.bfloat16, device=device, requires_grad=True)
    y = mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
    y_ref, leaves = _emulate(x, idx, w, gu, dn)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert rel_err(y, y_ref) < TOL_EMULATION
    assert rel_err(y, R.moe_experts(*(t.detach().double().cpu() for t in (x, idx, w, gu, dn)))) < TOL_VS_BF16_MATH
    if case.T == 0:
        return
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, gu, dn), g)
    grads_ref = torch.autograd.grad(y_ref, leaves, g.double().cpu())
    for name, got, ref in zip(("x", "topk_w", "gate_up_proj", "down_proj"), grads, grads_ref):
        assert rel_err(got, ref) < TOL_EMULATION, name


def _swiglu_backward(h, d_act):
    """float64 SwiGLU backward of bf16 h, d_act (d_h = [d_gate | d_up])."""
    gate, up = h.chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    d_gate = d_act * up * sig * (1 + gate * (1 - sig))
    return torch.cat([d_gate, d_act * gate * sig], dim=-1)


def _emulate_fp8_dgrad(x, idx, w, gate_up, down, g):
    """Gradients (x, topk_w, gate_up, down) of the recipe with fp8_dgrad=True, in float64 with the
    kernels' bf16 roundings: d_rows = bf16(w g); d_act = bf16(q(d_rows) Q(down)); d_h =
    bf16(SwiGLU'(h, d_act)); d_x = sum_k bf16(q(d_h) Q(gate_up)); weight gradients in BF16 math."""
    bf = lambda t: t.bfloat16().double()  # noqa: E731
    x64, w64, gu64, dn64, g64 = (t.detach().double().cpu() for t in (x, w, gate_up, down, g))
    idx = idx.long().cpu()
    xq, gu_q, dn_q = _dq(x, "blockwise_1x128"), _dq_weight(gate_up), _dq_weight(down)
    d_x, d_w = torch.zeros_like(x64), torch.zeros_like(w64)
    d_gu, d_dn = torch.zeros_like(gu64), torch.zeros_like(dn64)
    for k in range(idx.shape[1]):
        e = idx[:, k]
        h = bf(torch.einsum("th,tnh->tn", xq, gu_q[e]))
        act = bf(R.swiglu(h))
        rows = bf(torch.einsum("ti,thi->th", _dq(act, "blockwise_1x128"), dn_q[e]))
        d_w[:, k] = (g64 * rows).sum(-1)
        d_rows = bf(g64 * w64[:, k : k + 1])
        d_act = bf(torch.einsum("th,thi->ti", _dq(d_rows, "blockwise_1x128"), dn_q[e]))
        d_h = bf(_swiglu_backward(h, d_act))
        d_x += bf(torch.einsum("tn,tnh->th", _dq(d_h, "blockwise_1x128"), gu_q[e]))
        d_dn.index_add_(0, e, torch.einsum("th,ti->thi", d_rows, act))
        d_gu.index_add_(0, e, torch.einsum("tn,th->tnh", d_h, x64))
    return d_x, d_w, d_gu, d_dn


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES[1:], ids=str)
def test_fp8_dgrad_matches_its_emulation(device, case):
    x, idx, w, gu, dn = make_moe_inputs(case, torch.bfloat16, device=device, requires_grad=True)
    y = mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise", fp8_dgrad=True)
    y_bf16_bwd = mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
    assert torch.equal(y, y_bf16_bwd)  # the forward does not change
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, gu, dn), g)
    for name, got, ref in zip(("x", "topk_w", "gate_up_proj", "down_proj"), grads, _emulate_fp8_dgrad(x, idx, w, gu,
                                                                                                        dn, g)):
        assert rel_err(got, ref) < TOL_EMULATION, name
    # and the dgrad really ran in FP8: d_x is off the BF16-backward one by about an E4M3 step
    d_x_bf16 = torch.autograd.grad(y_bf16_bwd, x, g)[0]
    assert 1e-2 < rel_err(grads[0], d_x_bf16) < 0.12


@pytest.mark.parametrize("device", DEVICES)
def test_blockwise_is_deterministic_and_compiles(device):
    case = MoECase(96, 128, 256, 8, 2)
    x, idx, w, gu, dn = make_moe_inputs(case, torch.bfloat16, device=device, requires_grad=True)

    def step(fn):
        y = fn(x, idx, w, gu, dn)
        return (y, *torch.autograd.grad(y, (x, w, gu, dn), torch.ones_like(y)))

    def eager(*a):
        return mok.functional.moe_experts(*a, recipe="blockwise")

    first, second = step(eager), step(eager)
    compiled = step(torch.compile(eager, fullgraph=True))
    for a, b, c in zip(first, second, compiled):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_weight_codes_are_cached_until_the_weight_changes():
    case = MoECase(16, 128, 128, 4, 2)
    x, idx, w, gu, dn = make_moe_inputs(case, torch.bfloat16)
    y0 = mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
    cached = gu._mok_fp8_blockwise
    mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
    assert gu._mok_fp8_blockwise is cached  # same version: reused
    with torch.no_grad():
        gu.mul_(2.0)  # an optimizer-like in-place update
    y1 = mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
    assert gu._mok_fp8_blockwise is not cached
    assert not torch.equal(y0, y1)


def test_blockwise_input_errors_name_the_argument():
    x, idx, w, gu, dn = make_moe_inputs(MoECase(8, 128, 128, 4, 2), torch.bfloat16)
    with pytest.raises(ValueError, match="recipe"):
        mok.functional.moe_experts(x, idx, w, gu, dn, recipe="fp4")
    with pytest.raises(ValueError, match="bfloat16"):
        mok.functional.moe_experts(x.float(), idx, w, gu.float(), dn.float(), recipe="blockwise")
    x, idx, w, gu, dn = make_moe_inputs(MoECase(8, 96, 128, 4, 2), torch.bfloat16)
    with pytest.raises(ValueError, match="multiples of 128"):
        mok.functional.moe_experts(x, idx, w, gu, dn, recipe="blockwise")
    with pytest.raises(ValueError, match="recipe"):
        mok.MoE(128, 128, 4, 2, recipe="mxfp4")
    with pytest.raises(ValueError, match="fp8_dgrad"):
        mok.functional.moe_experts(x, idx, w, gu, dn, fp8_dgrad=True)


@pytest.mark.parametrize("device", DEVICES)
def test_moe_layer_with_the_blockwise_recipe_trains(device):
    torch.manual_seed(0)
    layer = mok.MoE(128, 128, 8, 2, recipe="blockwise", device=device, dtype=torch.bfloat16)
    ref = mok.MoE(128, 128, 8, 2, device=device, dtype=torch.bfloat16)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(64, 128, device=device, dtype=torch.bfloat16)
    y, y_bf16 = layer(x), ref(x)
    assert rel_err(y, y_bf16) < TOL_VS_BF16_MATH
    y.float().square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters() if p.requires_grad)
