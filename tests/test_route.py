"""Fused top-k routing against mok.reference.route_topk (float64)."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok import reference
from shapes import rel_err

CONFIGS = [
    dict(score_func="softmax", renormalize=True),
    dict(score_func="softmax", renormalize=False),
    dict(score_func="sigmoid", renormalize=True, scaling=2.5),
    dict(score_func="sigmoid", renormalize=True, bias=True, n_group=4, topk_group=2, scaling=2.5),
    dict(score_func="softmax", renormalize=True, bias=True),
]


def separated_logits(T, E, dtype, device):
    """Centred logits whose scores are far apart (also after a sigmoid, which flattens large
    logits), so every precision selects the same experts."""
    step = min(0.37, 6.0 / E)
    perms = [torch.randperm(E).double() for _ in range(T)] or [torch.zeros(0, E, dtype=torch.float64)]
    base = (torch.stack(perms).view(T, E) - E / 2) * step
    return (base + 0.02 * step * torch.rand(T, E, dtype=torch.float64)).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("T,E,K", [(0, 8, 2), (1, 8, 1), (33, 16, 4), (70, 64, 8), (5, 8, 8)])
def test_route_topk_matches_reference(device, dtype, cfg, T, E, K):
    cfg = dict(cfg)
    if cfg.get("n_group", 1) > 1 and K > cfg["topk_group"] * E // cfg["n_group"]:
        pytest.skip("top_k exceeds the experts of the kept groups")
    bias = None
    if cfg.pop("bias", False):
        bias = (torch.rand(E, dtype=torch.float64) * 0.05).to(device=device, dtype=dtype)
    logits = separated_logits(T, E, dtype, device)
    idx, w = mok.functional.route_topk(logits, K, bias=bias, **cfg)
    ridx, rw = reference.route_topk(logits.double().cpu(), K, bias=None if bias is None else bias.double().cpu(),
                                    **cfg)
    assert idx.dtype == torch.int32 and w.dtype == dtype
    assert torch.equal(idx.cpu().long(), ridx)
    assert rel_err(w, rw) < (1e-12 if dtype == torch.float64 else 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_lower_expert_id(device):
    logits = torch.zeros(3, 6, device=device)
    logits[1, 4] = logits[1, 2] = 1.0
    idx, _ = mok.functional.route_topk(logits, 3)
    assert idx.cpu().tolist() == [[0, 1, 2], [2, 4, 0], [0, 1, 2]]


@pytest.mark.parametrize("device", DEVICES)
def test_bias_changes_selection_not_weights(device):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], device=device)
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0], device=device)
    idx, w = mok.functional.route_topk(logits, 2, bias=bias, score_func="sigmoid", renormalize=False)
    assert idx.cpu().tolist() == [[3, 0]]
    torch.testing.assert_close(w.cpu(), torch.sigmoid(torch.tensor([[-1.0, 2.0]])))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_topk_gradcheck(device, score_func, renormalize):
    logits = separated_logits(6, 8, torch.float64, device).requires_grad_(True)

    def weights(lg):
        return mok.functional.route_topk(lg, 3, score_func=score_func, renormalize=renormalize, scaling=1.5)[1]

    assert torch.autograd.gradcheck(weights, (logits,), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("device", DEVICES)
def test_route_topk_gradient_matches_reference(device):
    # A narrow spread, so sigmoid(1 - sigmoid) stays well resolved in float32.
    logits = (separated_logits(40, 32, torch.float64, device) * 0.1).float().requires_grad_(True)
    ref_logits = logits.detach().double().cpu().requires_grad_(True)
    g = torch.randn(40, 4)
    _, w = mok.functional.route_topk(logits, 4, score_func="sigmoid", scaling=2.0)
    _, rw = reference.route_topk(ref_logits, 4, score_func="sigmoid", scaling=2.0)
    (w * g.to(device)).sum().backward()
    (rw * g.double()).sum().backward()
    assert rel_err(logits.grad, ref_logits.grad) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [dict(score_func="sigmoid", renormalize=False),
                                 dict(score_func="sigmoid", renormalize=True, bias=True, n_group=4, topk_group=2),
                                 dict(score_func="softmax", renormalize=True)],
                         ids=["sigmoid", "sigmoid-grouped-bias", "softmax"])
def test_nan_logits_rank_below_every_number(device, cfg):
    """A NaN score ranks below every number (NaNs among themselves by lower id), in the kernel, the core and the
    reference alike (torch.sort alone would put NaN first): a NaN logit's expert is picked only when no number
    is left. Softmax turns one NaN logit into NaN scores for the whole row."""
    cfg = dict(cfg)
    T, E, K = 24, 16, 6
    bias = torch.rand(E, dtype=torch.float64).to(device) * 0.05 if cfg.pop("bias", False) else None
    logits = separated_logits(T, E, torch.float64, device)
    for t in range(1, T):  # row t: t % 7 NaN logits at random experts (row 0 has none)
        logits[t, torch.randperm(E)[: t % 7].to(device)] = float("nan")
    logits[T - 1] = float("nan")  # every logit NaN: experts 0 .. K-1 (of the kept groups)
    idx, w = mok.functional.route_topk(logits, K, bias=bias, **cfg)
    ridx, rw = reference.route_topk(logits.cpu(), K, bias=None if bias is None else bias.cpu(), **cfg)
    assert torch.equal(idx.cpu().long(), ridx)
    torch.testing.assert_close(w.cpu(), rw, equal_nan=True, rtol=1e-12, atol=0)
    if cfg["score_func"] == "sigmoid" and "n_group" not in cfg:
        nan_rows = torch.isnan(logits.cpu()).gather(1, ridx)
        numbers = (~torch.isnan(logits.cpu())).sum(1, keepdim=True)
        assert not (nan_rows & (torch.arange(K) < numbers)).any()  # the first min(K, numbers) picks are numbers
