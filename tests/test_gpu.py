"""GPU-only properties: bitwise determinism, CUDA-graph capture of a training step, device-side
error reporting, and bf16 accuracy at realistic sizes. Skipped without a CUDA GPU."""
import pytest
import torch

import mok
from mok import reference
from conftest import capture_step, single_ctas_and_pairs
from shapes import MoECase, make_moe_inputs, rel_err

pytestmark = pytest.mark.gpu


def fwd_bwd(layer, x, gy):
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y = layer(x)
    y.backward(gy)
    return [y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("routing", ["random", "zipf"])
def test_forward_backward_bitwise_deterministic(routing):
    torch.manual_seed(0)
    layer = mok.MoE(256, 192, 16, 4, num_shared_experts=1, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn_like(x)
    first = fwd_bwd(layer, x, gy)
    for _ in range(2):
        again = fwd_bwd(layer, x, gy)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", [MoECase(2048, 512, 384, 32, 8, "random"), MoECase(1500, 384, 200, 8, 2, "zipf"),
                                  MoECase(333, 256, 130, 64, 6, "one_expert"),
                                  # E + 1 > 384: the sm_90a kernel reads the plan offsets from global
                                  # memory instead of its shared-memory copy
                                  MoECase(300, 128, 64, 400, 4, "random")], ids=str)
def test_bf16_accuracy_at_size(case):
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, "cuda", requires_grad=True)
    y = mok.functional.moe_experts(x, idx, w, gate_up, down)
    gy = torch.randn_like(y)
    y.backward(gy)
    leaves = [t.detach().double().cpu().requires_grad_(True) for t in (x, w, gate_up, down)]
    ry = reference.moe_experts(leaves[0], idx.cpu(), leaves[1], leaves[2], leaves[3])
    ry.backward(gy.double().cpu())
    assert rel_err(y, ry) < 1e-2
    for t, r in zip((x, w, gate_up, down), leaves):
        assert rel_err(t.grad, r.grad) < 1e-2


def test_training_step_captures_in_cuda_graph():
    torch.manual_seed(0)
    layer = mok.MoE(128, 96, 8, 2, score_func="sigmoid", n_group=2, topk_group=1, num_shared_experts=1,
                    device="cuda", dtype=torch.bfloat16)
    static_x = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    static_gy = torch.randn_like(static_x)
    params = list(layer.parameters())

    def step():
        y = layer(static_x)
        grads = torch.autograd.grad(y, params, static_gy)
        return y, grads

    graph, (y_static, g_static) = capture_step(step)
    for _ in range(3):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        y_eager, g_eager = step()
        assert torch.equal(y_static, y_eager)
        for a, b in zip(g_static, g_eager):
            assert torch.equal(a, b)


@pytest.mark.parametrize("options", [dict(recipe="blockwise"), dict(recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True),
                                     dict(recipe="mxfp8")], ids=str)
def test_fp8_training_step_in_a_cuda_graph_sees_the_updated_weights(options):
    # The FP8 recipes cache the weights' quantised copies per weight version. A captured step must not
    # take them from the cache: its replays would keep the codes of the weights at capture time after
    # an optimizer changes the weights in place (the graph's kernels would never read them). Capture
    # right after an eager step at the same weight version (a cache hit), then change the weights in
    # place before each replay: the replay must equal an eager step on the new weights, bit for bit.
    torch.manual_seed(0)
    layer = mok.MoE(256, 128, 8, 2, device="cuda", dtype=torch.bfloat16, **options)
    static_x = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    static_gy = torch.randn_like(static_x)
    params = list(layer.parameters())

    def step():
        y = layer(static_x)
        return y, torch.autograd.grad(y, params, static_gy)

    graph, (y_static, g_static) = capture_step(step)
    for _ in range(3):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn_like(p), alpha=0.05)  # an optimizer step, in place
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        y_eager, g_eager = step()
        assert torch.equal(y_static, y_eager)
        for a, b in zip(g_static, g_eager):
            assert torch.equal(a, b)


def test_out_of_range_expert_id_is_reported():
    case = MoECase(64, 32, 16, 4, 2)
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, "cuda")
    mok.check_errors(synchronize=True)
    bad = idx.clone()
    bad[5, 0] = 7
    mok.functional.moe_experts(x, bad, w, gate_up, down)
    with pytest.raises(ValueError, match="expert id outside"):
        mok.check_errors(synchronize=True)
    mok.check_errors(synchronize=True)  # cleared
    y = mok.functional.moe_experts(x, bad, w, gate_up, down, skip_invalid=True)
    mok.check_errors(synchronize=True)  # skipping is not an error
    ref = reference.moe_experts(x.double().cpu(), bad.cpu(), w.double().cpu(), gate_up.double().cpu(),
                                down.double().cpu(), skip_invalid=True)
    assert rel_err(y, ref) < 1e-2


def test_poisoned_outputs_are_fully_written():
    # The caching allocator hands back the poisoned block: any row a kernel forgot stays NaN.
    case = MoECase(300, 128, 96, 16, 4, "zipf")
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, "cuda")
    for _ in range(3):
        junk = torch.full((8 << 20,), float("nan"), device="cuda", dtype=torch.bfloat16)
        del junk
        y = mok.functional.moe_experts(x, idx, w, gate_up, down)
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("tile", [128, 8], ids=["aligned-plan", "unaligned-plan"])
@pytest.mark.parametrize("gather", [True, False])
def test_wgrad_sm90_matches_reference(tile, gather):
    # Plan tiles of 8 leave expert row ranges unaligned to the wgmma K-block: those experts take
    # the kernel's FMA fallback; 128-aligned plans (mok's default on CUDA) run on wgmma.
    from mok._ops import ops
    from shapes import make_routing

    T, H, I, E, K = 700, 256, 192, 8, 2
    idx = make_routing(T, K, E, "zipf").cuda()
    plan = mok.functional.moe_plan(idx, E, tile=tile)
    R = plan.src_of_row.shape[0]
    a = torch.randn(R, I, device="cuda", dtype=torch.bfloat16)
    a[plan.src_of_row < 0] = 0
    if gather:
        b = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        out = ops.grouped_mm_wgrad(a, b, plan.src_of_row, K, plan.offsets)
        ref = reference.grouped_mm_wgrad(a.double().cpu(), b.double().cpu(), plan.offsets.cpu(),
                                         plan.src_of_row.cpu(), K)
    else:
        b = torch.randn(R, H, device="cuda", dtype=torch.bfloat16)
        b[plan.src_of_row < 0] = 0
        out = ops.grouped_mm_wgrad(a, b, None, 1, plan.offsets)
        ref = reference.grouped_mm_wgrad(a.double().cpu(), b.double().cpu(), plan.offsets.cpu())
    assert rel_err(out, ref) < 1e-2
    again = ops.grouped_mm_wgrad(a, b, plan.src_of_row if gather else None, K if gather else 1, plan.offsets)
    assert torch.equal(out, again)


@pytest.mark.parametrize("tile", [128, 8], ids=["aligned-plan", "unaligned-plan"])
@pytest.mark.parametrize("shape", [(700, 256, 192, 8, 2), (301, 128, 72, 16, 4), (1, 64, 64, 4, 1)],
                         ids=["odd-pairs", "small-experts", "one-token"])
def test_sm90_cluster_pairs_are_bitwise_single_ctas(monkeypatch, tile, shape):
    # The sm_90a GEMMs run CTA pairs that share B by TMA multicast (MOK_SM90_CLUSTER=2, opt-in) or
    # single CTAs (=1, default). Each output is the same K-ordered wgmma chain either way, so every kernel
    # variant must agree bit for bit, including pairs whose tiles hold different experts, several
    # segments (unaligned plans), or no rows at all.
    from mok._ops import ops
    from shapes import make_routing

    T, H, I, E, K = shape
    torch.manual_seed(T + tile)
    idx = make_routing(T, K, E, "zipf").cuda()
    plan = mok.functional.moe_plan(idx, E, tile=tile)
    R = plan.src_of_row.shape[0]
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) / H**0.5
    down = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) / I**0.5
    rows = torch.randn(R, I, device="cuda", dtype=torch.bfloat16)
    rows[plan.src_of_row < 0] = 0
    x_rows = ops.gather_rows(x, plan.src_of_row, None, K)

    def run():
        act, h = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate_up, plan.offsets)
        act_r, h_r = ops.grouped_mm_swiglu(x, plan.src_of_row, plan.row_of, K, gate_up, plan.offsets, x_rows)
        y = ops.grouped_mm(rows, None, 1, down, plan.offsets, True)                  # NT, TMA rows
        y_g = ops.grouped_mm(x, plan.src_of_row, K, gate_up[:, :I, :].contiguous(), plan.offsets, True)  # gathered
        d_rows = ops.grouped_mm(y, None, 1, down, plan.offsets, False)              # NN (dgrad)
        d_g = ops.grouped_mm(x, plan.src_of_row, K, gate_up.transpose(1, 2)[:, :, :I].contiguous(), plan.offsets,
                             False)                                                  # NN, gathered
        w = ops.grouped_mm_wgrad(rows, x, plan.src_of_row, K, plan.offsets)          # wgrad, gathered
        w2 = ops.grouped_mm_wgrad(rows, y, None, 1, plan.offsets)                    # wgrad, rows
        torch.cuda.synchronize()
        return [act, h, act_r, h_r, y, y_g, d_rows, d_g, w, w2]

    pairs = single_ctas_and_pairs(monkeypatch, run)  # bitwise equal
    assert torch.isfinite(pairs[4]).all() and rel_err(pairs[4], reference.grouped_mm(
        rows.double().cpu(), down.double().cpu(), plan.offsets.cpu(), True)) < 1e-2
