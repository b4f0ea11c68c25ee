"""mok.functional.moe_experts and mok.MoE against the float64 per-expert-loop reference,
forward and backward, on the ragged cases of tests/shapes.py."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok import reference
from shapes import TOL, MoECase, enumerate_moe_cases, make_moe_inputs, rel_err

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def reference_grads(x, idx, w, gate_up, down, gy, dtype=torch.float64):
    """Output and input gradients of mok.reference.moe_experts on the CPU in `dtype`."""
    w_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # router weights stay fp32
    leaves = [t.detach().cpu().to(d).requires_grad_(True)
              for t, d in ((x, dtype), (w, w_dtype), (gate_up, dtype), (down, dtype))]
    rx, rw, rgu, rd = leaves
    y = reference.moe_experts(rx, idx.cpu(), rw, rgu, rd)
    y.backward(gy.to(dtype).cpu())
    return y.detach(), [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", enumerate_moe_cases(), ids=str)
def test_moe_experts_forward_backward(device, dtype, case):
    """Tolerance rule (FlashAttention-3's): mok's error against float64 is at most twice the error
    of the PyTorch reference computed in the same dtype, plus the dtype's tolerance."""
    x, idx, w, gate_up, down = make_moe_inputs(case, dtype, device, requires_grad=True)
    y = mok.functional.moe_experts(x, idx, w, gate_up, down)
    gy = torch.randn(case.T, case.H, dtype=torch.float64).to(device, dtype)
    y.backward(gy)
    ref_y, ref_grads = reference_grads(x, idx, w, gate_up, down, gy)
    same_y, same_grads = reference_grads(x, idx, w, gate_up, down, gy, dtype)
    assert y.dtype == dtype and y.shape == (case.T, case.H)
    assert rel_err(y, ref_y) <= 2 * rel_err(same_y, ref_y) + TOL[dtype]
    for name, t, g, g_same in zip(("x", "topk_w", "gate_up_proj", "down_proj"), (x, w, gate_up, down), ref_grads,
                                  same_grads):
        assert t.grad is not None, name
        if name == "topk_w":
            # d_w[t, k] = <gy[t], MLP_e(x[t])> is a dot product that may cancel (one token: one scalar):
            # measure its error against the size of its terms, not of the sum
            scale = topk_w_grad_scale(x, idx, gate_up, down, gy)
            err = lambda a: float((a.detach().double().cpu() - g).norm() / scale)  # noqa: E731
            assert err(t.grad) <= 2 * err(g_same) + TOL[dtype], name
            continue
        assert rel_err(t.grad, g) <= 2 * rel_err(g_same, g) + TOL[dtype], name


def topk_w_grad_scale(x, idx, gate_up, down, gy):
    """|| sum_h |gy[t, h]| |MLP_e(x[t])[h]| || over the pairs (t, k): the size of the terms of the
    router-weight gradient, in float64."""
    f64 = [t.detach().double().cpu() for t in (x, gate_up, down)]
    T, K = idx.shape
    terms = torch.zeros(T, K, dtype=torch.float64)
    for k in range(K):
        rows = reference.moe_experts(f64[0], idx[:, k : k + 1].cpu(), torch.ones(T, 1, dtype=torch.float64), *f64[1:])
        terms[:, k] = (gy.double().cpu().abs() * rows.abs()).sum(-1)
    return max(float(terms.norm()), 1e-300)


@pytest.mark.parametrize("device", DEVICES)
def test_moe_experts_gradcheck(device):
    case = MoECase(11, 7, 5, 5, 2, "one_expert")
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.float64, device, requires_grad=True)
    f = lambda x, w, gu, d: mok.functional.moe_experts(x, idx, w, gu, d)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, gate_up, down))


@pytest.mark.parametrize("device", DEVICES)
def test_skip_invalid_ids(device):
    case = MoECase(20, 16, 8, 4, 2)
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.float64, device)
    idx = idx.clone()
    idx[3, 1] = 4  # the transformers EP sentinel: "expert on another rank"
    idx[7, 0] = -1
    y = mok.functional.moe_experts(x, idx, w, gate_up, down, skip_invalid=True)
    ref = reference.moe_experts(x.cpu(), idx.cpu(), w.cpu(), gate_up.cpu(), down.cpu(), skip_invalid=True)
    assert rel_err(y, ref) < 1e-10


def make_layer_pair(device, dtype, **kw):
    torch.manual_seed(0)
    layer = mok.MoE(64, 48, 8, 2, device=device, dtype=dtype, **kw)
    return layer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [
    dict(),
    dict(score_func="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5, num_shared_experts=1,
         selection_bias=True),
    dict(norm_topk_prob=False, shared_intermediate_size=40),
], ids=["softmax", "deepseek", "olmoe-shared"])
def test_moe_layer_matches_reference(device, kw):
    layer = make_layer_pair(device, torch.float64, **kw)
    if layer.router.e_score_correction_bias is not None:
        layer.router.e_score_correction_bias.copy_(torch.rand(8) * 0.01)
    x = torch.randn(3, 17, 64, dtype=torch.float64, device=device, requires_grad=True)
    y = layer(x)
    shared = None
    if layer.shared_experts is not None:
        s = layer.shared_experts
        shared = (s.gate_proj.weight.cpu(), s.up_proj.weight.cpu(), s.down_proj.weight.cpu())
    r = layer.router
    ref = reference.moe_layer(x.detach().cpu(), r.weight.detach().cpu(), layer.experts.gate_up_proj.detach().cpu(),
                              layer.experts.down_proj.detach().cpu(), 2,
                              bias=None if r.e_score_correction_bias is None else r.e_score_correction_bias.cpu(),
                              score_func=r.score_func, n_group=r.n_group, topk_group=r.topk_group,
                              renormalize=r.norm_topk_prob, scaling=r.routed_scaling_factor,
                              shared=None if shared is None else tuple(t.detach() for t in shared))
    assert rel_err(y, ref) < 1e-10
    y.sum().backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0
    assert layer.router_logits.shape == (51, 8)
    assert int(layer.tokens_per_expert.sum()) == 51 * 2


def test_update_selection_bias_moves_towards_balance():
    layer = mok.MoE(16, 8, 4, 1, selection_bias=True)
    layer.tokens_per_expert.copy_(torch.tensor([10.0, 0.0, 5.0, 5.0]))
    layer.update_selection_bias(0.1)
    bias = layer.router.e_score_correction_bias
    assert bias[1] > bias[2] > bias[0] and abs(float(bias.sum())) < 1e-6
    assert layer.tokens_per_expert.sum() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_backward(device):
    torch._dynamo.reset()
    layer = mok.MoE(64, 32, 8, 2, num_shared_experts=1, device=device)
    x = torch.randn(2, 40, 64, device=device, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x)
    y.square().sum().backward()
    gx, gw = x.grad.clone(), layer.experts.gate_up_proj.grad.clone()
    x.grad = None
    layer.zero_grad()
    y_eager = layer(x)
    y_eager.square().sum().backward()
    assert rel_err(y, y_eager) < 1e-6
    assert rel_err(gx, x.grad) < 1e-5 and rel_err(gw, layer.experts.gate_up_proj.grad) < 1e-5
    explanation = torch._dynamo.explain(layer)(x)
    assert explanation.graph_break_count == 0
