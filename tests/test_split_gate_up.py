"""Gate and up weights as two tensors (torchtitan's w1 and w3): the split ops and the layer with a
(gate, up) pair must give exactly the bits of the concatenated [E, 2I, H] weight, on every device
and kernel path (sm_90a reading and writing the halves in place, in either address order, single
CTAs and pairs; the SIMT kernels and the CPU, which concatenate). Ragged routing throughout."""
import pytest
import torch

import mok
from conftest import DEVICES, single_ctas_and_pairs
from mok._ops import ops
from shapes import MoECase, make_moe_inputs, make_routing

# I = 64 and 128 run the sm_90a kernels in place (K halves of 64); I = 40 and 24 concatenate for the
# dgrad (and split the weight gradient with a copy) but still read the SwiGLU halves in place.
CASES = [
    MoECase(0, 64, 64, 4, 2),
    MoECase(1, 64, 64, 4, 1),
    MoECase(37, 64, 40, 6, 2, "empty_expert"),
    MoECase(53, 128, 64, 5, 1, "one_expert"),
    MoECase(300, 192, 128, 8, 4, "zipf"),
    MoECase(150, 96, 24, 16, 4, "random"),
]


def halves(gate_up, I, up_first):
    """gate and up [E, I, H] as contiguous tensors; up_first puts up at the lower address (the
    kernels' flipped planes)."""
    E, _, H = gate_up.shape
    buf = torch.empty(2, E, I, H, dtype=gate_up.dtype, device=gate_up.device)
    gate, up = (buf[1], buf[0]) if up_first else (buf[0], buf[1])
    gate.copy_(gate_up[:, :I])
    up.copy_(gate_up[:, I:])
    return gate, up


def dtypes_for(device):
    return [torch.bfloat16, torch.float32] if device == "cuda" else [torch.float64, torch.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("up_first", [False, True], ids=["gate-first", "up-first"])
def test_split_ops_equal_concatenated(device, case, up_first):
    for dtype in dtypes_for(device):
        x, idx, _w, gate_up, _down = make_moe_inputs(case, dtype, device)
        plan = mok.functional.moe_plan(idx, case.E)
        R, I, K = plan.src_of_row.shape[0], case.I, case.K
        gate, up = halves(gate_up, I, up_first)
        x_rows = ops.gather_rows(x, plan.src_of_row, None, K)
        for rows in (None, x_rows):
            act, h = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate_up, plan.offsets, rows)
            act_s, h_s = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate, plan.offsets, rows, up)
            assert torch.equal(h, h_s) and torch.equal(act, act_s), (dtype, rows is None)
        d_h = torch.randn(R, 2 * I, dtype=dtype, device=device)
        d_h[plan.src_of_row < 0] = 0
        want = ops.grouped_mm(d_h, None, 1, gate_up, plan.offsets, False)
        assert torch.equal(ops.grouped_mm_gate_up_dgrad(d_h, gate, up, plan.offsets), want), dtype
        for b, b_gather, div in ((x_rows, None, 1), (x, plan.src_of_row, K)):
            whole = ops.grouped_mm_wgrad(d_h, b, b_gather, div, plan.offsets)
            d_gate, d_up = ops.grouped_mm_gate_up_wgrad(d_h, b, b_gather, div, plan.offsets)
            assert d_gate.is_contiguous() and d_up.is_contiguous()
            assert torch.equal(d_gate, whole[:, :I]) and torch.equal(d_up, whole[:, I:]), (dtype, b_gather is None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES[1:], ids=str)
def test_layer_with_gate_up_pair_equals_concatenated(device, case):
    # y and every gradient, bit for bit: the pair's gate and up gradients are the halves of the
    # concatenated weight's gradient.
    dtype = torch.bfloat16 if device == "cuda" else torch.float64
    x, idx, w, gate_up, down = make_moe_inputs(case, dtype, device)
    I = case.I
    gate, up = (t.contiguous() for t in (gate_up[:, :I], gate_up[:, I:]))
    dy = torch.randn(case.T, case.H, dtype=dtype, device=device)

    def run(split):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, down, gate, up, gate_up)]
        xx, ww, dd, g, u, gu = leaves
        weight = (g, u) if split else gu
        y = mok.functional.moe_experts(xx, idx, ww, weight, dd)
        y.backward(dy)
        grads = [xx.grad, ww.grad, dd.grad] + ([g.grad, u.grad] if split else [gu.grad[:, :I], gu.grad[:, I:]])
        return y, grads

    y, grads = run(False)
    y_s, grads_s = run(True)
    assert torch.equal(y, y_s)
    for a, b in zip(grads, grads_s):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("up_first", [False, True], ids=["gate-first", "up-first"])
def test_split_ops_cluster_pairs_equal_single_ctas(monkeypatch, up_first):
    # The halves' 4-D maps in the CTA pairs' multicast loads (MOK_SM90_CLUSTER=2) as well.
    T, H, I, E, K = 700, 256, 192, 8, 2
    idx = make_routing(T, K, E, "zipf").cuda()
    plan = mok.functional.moe_plan(idx, E)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) / H**0.5
    gate, up = halves(gate_up, I, up_first)
    d_h = torch.randn(plan.src_of_row.shape[0], 2 * I, device="cuda", dtype=torch.bfloat16)

    def run():
        out = list(ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate, plan.offsets, None, up))
        out.append(ops.grouped_mm_gate_up_dgrad(d_h, gate, up, plan.offsets))
        out.extend(ops.grouped_mm_gate_up_wgrad(d_h, x, plan.src_of_row, K, plan.offsets))
        out.append(ops.grouped_mm(d_h, None, 1, gate_up, plan.offsets, False))
        torch.cuda.synchronize()
        return out

    single = single_ctas_and_pairs(monkeypatch, run)  # bitwise equal
    assert torch.equal(single[2], single[5])  # the split dgrad is the concatenated one


def test_bad_gate_up_pair_names_the_argument():
    case = MoECase(5, 16, 8, 4, 2)
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.float32)
    gate = gate_up[:, :8].contiguous()
    with pytest.raises(ValueError, match=r"gate_up_proj must be a tensor \[E, 2I, H\] or a pair"):
        mok.functional.moe_experts(x, idx, w, (gate, gate, gate), down)
    with pytest.raises(ValueError, match=r"gate_up_proj\[1\] \(up\) must be of the shape of the gate"):
        mok.functional.moe_experts(x, idx, w, (gate, gate[:, :4].contiguous()), down)
    with pytest.raises(ValueError, match=r"gate_up_proj\[1\] \(up\) must be contiguous"):
        mok.functional.moe_experts(x, idx, w, (gate, gate.transpose(1, 2).contiguous().transpose(1, 2)), down)
    plan = mok.functional.moe_plan(idx, case.E)
    with pytest.raises(ValueError, match="mok.grouped_mm_swiglu: up must have the shape of gate_up"):
        ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, 2, gate, plan.offsets, None, gate[:, :4].contiguous())
    with pytest.raises(ValueError, match=r"mok.grouped_mm_gate_up_dgrad: d_h.shape\[1\] must be 16"):
        ops.grouped_mm_gate_up_dgrad(torch.randn(plan.src_of_row.shape[0], 8), gate, gate, plan.offsets)
    with pytest.raises(ValueError, match=r"mok.grouped_mm_gate_up_wgrad: d_h.shape\[1\] must be even"):
        ops.grouped_mm_gate_up_wgrad(torch.randn(plan.src_of_row.shape[0], 7), x, plan.src_of_row, 2, plan.offsets)


@pytest.mark.parametrize("device", DEVICES)
def test_one_tensor_as_gate_and_up(device):
    # A pair of one tensor twice (tied gate and up) is the concatenation [w | w]: on sm_90a it takes the
    # copy path (no stride-0 map).
    case = MoECase(40, 64, 64, 4, 2, "zipf")
    dtype = torch.bfloat16 if device == "cuda" else torch.float64
    x, idx, w, gate_up, down = make_moe_inputs(case, dtype, device)
    gate = gate_up[:, :64].contiguous()
    y = mok.functional.moe_experts(x, idx, w, (gate, gate), down)
    assert torch.equal(y, mok.functional.moe_experts(x, idx, w, torch.cat([gate, gate], 1), down))


@pytest.mark.parametrize("device", DEVICES)
def test_gate_up_pair_compiles_fullgraph(device):
    # The pair traces as two graph inputs: no graph break, the eager bits (CPU float32, CUDA bf16).
    torch._dynamo.reset()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = MoECase(40, 64, 64, 8, 2, "zipf")
    x, idx, w, gate_up, down = make_moe_inputs(case, dtype, device)
    gate, up = (t.contiguous().requires_grad_(True) for t in (gate_up[:, :64], gate_up[:, 64:]))

    def forward(x, gate, up):
        return mok.functional.moe_experts(x, idx, w, (gate, up), down)

    y = torch.compile(forward, fullgraph=True)(x, gate, up)
    y.float().square().sum().backward()
    grads = gate.grad.clone(), up.grad.clone()
    gate.grad = up.grad = None
    y_eager = forward(x, gate, up)
    y_eager.float().square().sum().backward()
    assert torch.equal(y, y_eager)
    assert torch.equal(grads[0], gate.grad) and torch.equal(grads[1], up.grad)
