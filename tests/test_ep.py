"""Expert parallelism on the CPU (runs in CI): the layout math, W virtual ranks in one process
(pure-torch exchange) and real gloo processes over torch.distributed, each compared bitwise with
the W = 1 result of mok's operators (the layer's math; reference() below), forward and backward, on
ragged routing."""
import datetime
import functools
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mok
import mok.ep as ep
from mok import functional
from mok._gate_up import gate_up_swiglu
from mok._ops import ops

# ------------------------------------------------------------------------------------------------
# inputs: tokens per rank differ, one rank has none, the last expert gets no tokens
# ------------------------------------------------------------------------------------------------


def make_problem(seed, world, tokens, H=16, I=12, E=8, K=2, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    T_all = sum(tokens)
    x = torch.randn(T_all, H, generator=g, dtype=dtype)
    # Expert E - 1 never chosen; distinct experts per token.
    idx = torch.stack([torch.randperm(E - 1, generator=g)[:K] for _ in range(T_all)]) if T_all else \
        torch.empty(0, K, dtype=torch.int64)
    w = torch.rand(T_all, K, generator=g, dtype=dtype)
    gu = torch.randn(E, 2 * I, H, generator=g, dtype=dtype) * 0.3
    dn = torch.randn(E, H, I, generator=g, dtype=dtype) * 0.3
    dy = torch.randn(T_all, H, generator=g, dtype=dtype)
    return dict(x=x, idx=idx, w=w, gu=gu, dn=dn, dy=dy, tokens=list(tokens), E=E, K=K, H=H)


def reference(p):
    """W = 1: all tokens on one rank, through mok's operators with their own autograd formulas
    (GEMM1 + SwiGLU, GEMM2, the combine weighted by w), the formulation the expert-parallel layer
    follows. Returns y and the gradients of x, w, gate_up, down.
    NOTE: mok.functional.moe_experts gives the same y, and gradients equal up to rounding: it takes
    the router-weight gradient from the other side of GEMM2 (mok/_down_combine.py;
    test_reference_is_the_layer_up_to_rounding)."""
    x, w = p["x"].clone().requires_grad_(), p["w"].clone().requires_grad_()
    gu, dn = p["gu"].clone().requires_grad_(), p["dn"].clone().requires_grad_()
    plan = functional.moe_plan(p["idx"].to(x.device), p["E"])
    act = gate_up_swiglu(x, plan.src_of_row, plan.row_of, p["K"], gu, plan.offsets)
    rows = ops.grouped_mm(act, None, 1, dn, plan.offsets, True)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = ops.combine(rows, plan.row_of, plan.src_of_row, w.to(acc))
    (y * p["dy"]).sum().backward()
    return y.detach(), x.grad, w.grad, gu.grad, dn.grad


def test_reference_is_the_layer_up_to_rounding():
    p = make_problem(5, 1, [37], dtype=torch.float64)
    y0, *g0 = reference(p)
    x, w = p["x"].clone().requires_grad_(), p["w"].clone().requires_grad_()
    gu, dn = p["gu"].clone().requires_grad_(), p["dn"].clone().requires_grad_()
    y = functional.moe_experts(x, p["idx"], w, gu, dn)
    (y * p["dy"]).sum().backward()
    assert torch.equal(y, y0)
    for a, b in zip((x.grad, w.grad, gu.grad, dn.grad), g0):
        assert (a - b).abs().max() <= 1e-12 * b.abs().max()


def assert_same(a, b, what):
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if not torch.equal(a, b):
        diff = (a.double() - b.double()).abs().max().item()
        raise AssertionError(f"{what}: not bitwise equal to W=1 (max abs diff {diff:.3e})")


# ------------------------------------------------------------------------------------------------
# layout
# ------------------------------------------------------------------------------------------------


def test_layout_orders_pairs_per_destination():
    # 2 ranks, 4 experts (2 per rank), one source rank with 3 tokens, K = 2.
    idx = torch.tensor([[[0, 3], [2, -1], [1, 2]]])
    lay = ep.make_layout(idx, num_experts=4, world=2, capacity=6)
    assert lay.dst.tolist() == [[0, 1, 1, -1, 0, 1]]
    assert lay.pos.tolist() == [[0, 0, 1, -1, 1, 2]]
    assert lay.eid.tolist() == [[0, 1, 0, -1, 1, 0]]
    assert lay.counts.tolist() == [[2, 3]]
    assert lay.src_of_row.tolist() == [[0, 1, 2, -1, 4, 5]]
    assert lay.row_of.shape == (1, 3, 2)


def test_layout_marks_bad_ids_and_overflow():
    idx = torch.tensor([[[0], [1], [0], [9]]])
    lay = ep.make_layout(idx, num_experts=4, world=2, capacity=2)
    assert lay.dst.tolist() == [[0, 0, ep.DST_OVERFLOW, ep.DST_BAD_ID]]
    assert lay.counts.tolist() == [[2, 0]]
    drop = ep.make_layout(idx, num_experts=4, world=2, capacity=2, drop=True)
    assert drop.dst.tolist() == [[0, 0, ep.DST_NONE, ep.DST_BAD_ID]]
    assert drop.num_dropped.tolist() == [1]


def test_layout_empty():
    lay = ep.make_layout(torch.empty(2, 0, 3, dtype=torch.int64), num_experts=4, world=2, capacity=1)
    assert lay.counts.tolist() == [[0, 0], [0, 0]]
    assert lay.dst.shape == (2, 0)


def test_capacity_overflow_is_an_error_and_drop_counts():
    g = ep.VirtualExpertParallel(2, num_experts=4, max_tokens=4, top_k=1, hidden_size=8, dtype=torch.float32,
                                 capacity=1)
    x = torch.randn(2, 4, 8)
    idx = torch.zeros(2, 4, 1, dtype=torch.int64)
    w = torch.ones(2, 4, 1)
    gu, dn = torch.randn(4, 12, 8), torch.randn(4, 8, 6)
    with pytest.raises(RuntimeError, match="exceed the capacity"):
        g.moe_experts(x, idx, w, gu, dn)
    with pytest.raises(ValueError, match="expert id"):
        g.moe_experts(x, torch.full((2, 4, 1), 7), w, gu, dn)
    d = ep.VirtualExpertParallel(2, num_experts=4, max_tokens=4, top_k=1, hidden_size=8, dtype=torch.float32,
                                 capacity=1, overflow="drop")
    y = d.moe_experts(x, idx, w, gu, dn)
    assert torch.count_nonzero(y.abs().sum(-1)).item() == 2  # one token per source kept


# ------------------------------------------------------------------------------------------------
# virtual ranks, pure-torch exchange
# ------------------------------------------------------------------------------------------------


def stack_ranks(p, world):
    """Per-rank inputs stacked to [W, T_max, ...]; padding tokens have expert id -1."""
    T_max = max(max(p["tokens"]), 1)
    H, K = p["H"], p["K"]
    x = torch.zeros(world, T_max, H, dtype=p["x"].dtype)
    idx = torch.full((world, T_max, K), -1, dtype=torch.int64)
    w = torch.zeros(world, T_max, K, dtype=p["w"].dtype)
    dy = torch.zeros(world, T_max, H, dtype=p["dy"].dtype)
    start = 0
    for r, n in enumerate(p["tokens"]):
        sl = slice(start, start + n)
        x[r, :n], idx[r, :n], w[r, :n], dy[r, :n] = p["x"][sl], p["idx"][sl], p["w"][sl], p["dy"][sl]
        start += n
    return x, idx, w, dy, T_max


def run_virtual(p, world, experts_kw=None, **kw):
    x, idx, w, dy, T_max = stack_ranks(p, world)
    x.requires_grad_()
    w.requires_grad_()
    gu, dn = p["gu"].clone().requires_grad_(), p["dn"].clone().requires_grad_()
    g = ep.VirtualExpertParallel(world, num_experts=p["E"], max_tokens=T_max, top_k=p["K"], hidden_size=p["H"],
                                 dtype=x.dtype, device=x.device, **kw)
    y = g.moe_experts(x, idx, w, gu, dn, **(experts_kw or {}))
    (y * dy).sum().backward()
    return g, y.detach(), x.grad, w.grad, gu.grad, dn.grad


def unstack(t, tokens):
    return torch.cat([t[r, :n] for r, n in enumerate(tokens)])


TOKENS = {1: [9], 2: [7, 0], 4: [5, 0, 8, 3], 8: [3, 1, 0, 6, 2, 0, 4, 5]}


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_virtual_ranks_match_w1_bitwise(world, dtype, _fresh_seed):
    p = make_problem(_fresh_seed, world, TOKENS[world], dtype=dtype)
    y0, dx0, dw0, dgu0, ddn0 = reference(p)
    g, y, dx, dw, dgu, ddn = run_virtual(p, world)
    assert g.backend == "torch"
    assert_same(unstack(y, p["tokens"]), y0, "y")
    assert_same(unstack(dx, p["tokens"]), dx0, "d x")
    assert_same(unstack(dw, p["tokens"]), dw0, "d topk_w")
    assert_same(dgu, dgu0, "d gate_up_proj")
    assert_same(ddn, ddn0, "d down_proj")
    # Padding tokens (expert id -1) get zero outputs and zero gradients.
    pad = torch.ones(y.shape[:2], dtype=torch.bool)
    for r, n in enumerate(p["tokens"]):
        pad[r, :n] = False
    assert not y[pad].any() and not dx[pad].any() and not dw[pad].any()


FP8_OPTIONS = [dict(recipe="blockwise"), dict(recipe="blockwise", fp8_dgrad=True),
               dict(recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True),
               dict(recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"), dict(recipe="mxfp8")]


def recipe_reference(p, options):
    """W = 1 through mok.functional.moe_experts with the recipe's options and a 128-aligned plan (as the
    expert-parallel local experts use under the FP8 recipes, and CUDA by default; on the CPU's 1-aligned
    plans the weight gradients' column-wise blocks would straddle experts): y and the gradients of x,
    w, gate_up, down. With every GEMM in FP8 the W = 1 experts in the form the expert-parallel ones take:
    the router weights applied by the combine and d_topk_w by combine_weight_grad
    (ROUTER_GRAD_IN_SWIGLU=False; the source's combine owns them under expert parallelism, whose local
    experts see weight 1, for which the v53 form gives the same bits)."""
    old = mok._fp8_experts.ROUTER_GRAD_IN_SWIGLU
    mok._fp8_experts.ROUTER_GRAD_IN_SWIGLU = False
    try:
        return _recipe_reference(p, options)
    finally:
        mok._fp8_experts.ROUTER_GRAD_IN_SWIGLU = old


def _recipe_reference(p, options):
    x, w = p["x"].clone().requires_grad_(), p["w"].clone().requires_grad_()
    gu, dn = p["gu"].clone().requires_grad_(), p["dn"].clone().requires_grad_()
    plan = functional.moe_plan(p["idx"].to(x.device), p["E"], tile=ep.FP8_PLAN_TILE)
    y = mok.functional.moe_experts(x, p["idx"].to(x.device), w, gu, dn, plan=plan, **options)
    (y * p["dy"]).sum().backward()
    return y.detach(), x.grad, w.grad, gu.grad, dn.grad


def assert_matches_w1(got, want, tokens):
    (y, dx, dw, dgu, ddn), (y0, dx0, dw0, dgu0, ddn0) = got, want
    assert_same(unstack(y, tokens), y0, "y")
    assert_same(unstack(dx, tokens), dx0, "d x")
    assert_same(unstack(dw, tokens), dw0, "d topk_w")
    assert_same(dgu, dgu0, "d gate_up_proj")
    assert_same(ddn, ddn0, "d down_proj")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("options", FP8_OPTIONS, ids=str)
def test_virtual_ranks_with_fp8_recipes_match_w1_bitwise(world, options, _fresh_seed):
    # The local experts in an FP8 recipe (weight 1, K = 1 on the received rows) see each expert's rows in
    # the W = 1 order, so the row-wise codes, the column-wise blocks along each expert's rows and every
    # sum are those of W = 1: y and every gradient bitwise equal to moe_experts(recipe=...) on one rank.
    p = make_problem(_fresh_seed, world, TOKENS[world], H=128, I=128, dtype=torch.bfloat16)
    g, *got = run_virtual(p, world, experts_kw=options)
    assert_matches_w1(got, recipe_reference(p, options), p["tokens"])


def test_expert_parallel_recipe_options_are_checked():
    g = ep.VirtualExpertParallel(2, num_experts=4, max_tokens=4, top_k=1, hidden_size=128, dtype=torch.bfloat16)
    x = torch.randn(2, 4, 128, dtype=torch.bfloat16)
    idx = torch.zeros(2, 4, 1, dtype=torch.int64)
    w = torch.ones(2, 4, 1, dtype=torch.bfloat16)
    gu, dn = torch.randn(4, 256, 128, dtype=torch.bfloat16), torch.randn(4, 128, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="recipe must be one of"):
        g.moe_experts(x, idx, w, gu, dn, recipe="fp8")
    with pytest.raises(ValueError, match="fp8_wgrad must be False unless recipe='blockwise'"):
        g.moe_experts(x, idx, w, gu, dn, recipe="mxfp8", fp8_wgrad=True)
    with pytest.raises(ValueError, match="multiples of 128"):
        g.moe_experts(x, idx, w, gu[:, :192], dn[..., :96], recipe="blockwise")
    with pytest.raises(ValueError, match="bfloat16"):
        g.moe_experts(x.float(), idx, w.float(), gu.float(), dn.float(), recipe="mxfp8")
    with pytest.raises(ValueError, match="fp8_dgrad must be False unless recipe='blockwise'"):
        ep.ExpertParallelExperts(g, 128, 128, recipe="bf16", fp8_dgrad=True)
    # the layer passes its recipe to the expert-parallel experts
    layer = mok.MoE(128, 128, 4, 1, ep=g, recipe="blockwise", fp8_dgrad=True, dtype=torch.bfloat16)
    assert (layer.experts.recipe, layer.experts.fp8_dgrad, layer.experts.fp8_wgrad) == ("blockwise", True, False)


def test_virtual_ranks_small_capacity_within_bounds(_fresh_seed):
    # A capacity below T_max * K that the routing never exceeds gives the same result.
    p = make_problem(_fresh_seed, 2, [6, 6], E=4, K=1)
    p["idx"] = torch.tensor([[0], [2]] * 6)
    y0, dx0, *_ = reference(p)
    g, y, dx, *_ = run_virtual(p, 2, capacity=3)
    assert_same(unstack(y, p["tokens"]), y0, "y")
    assert_same(unstack(dx, p["tokens"]), dx0, "d x")


# ------------------------------------------------------------------------------------------------
# real processes: torch.distributed (gloo) fallback
# ------------------------------------------------------------------------------------------------


def _gloo_worker(rank, world, path, seed, tokens):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        p = make_problem(seed, world, tokens)
        y0, dx0, dw0, dgu0, ddn0 = reference(p)
        start = sum(tokens[:rank])
        sl = slice(start, start + tokens[rank])
        E, K, H = p["E"], p["K"], p["H"]
        g = ep.ExpertParallel(num_experts=E, max_tokens=max(tokens), top_k=K, hidden_size=H,
                              dtype=torch.float32, device="cpu")
        assert g.backend == "torch", g.backend
        El = g.local_experts
        shard = slice(rank * El, (rank + 1) * El)
        x, w = p["x"][sl].clone().requires_grad_(), p["w"][sl].clone().requires_grad_()
        gu, dn = p["gu"][shard].clone().requires_grad_(), p["dn"][shard].clone().requires_grad_()
        for step in range(2):  # the exchange is reusable: run twice
            for t in (x, w, gu, dn):
                t.grad = None
            y = g.moe_experts(x, p["idx"][sl], w, gu, dn)
            (y * p["dy"][sl]).sum().backward()
            tag = f"rank {rank}/{world} step {step}"
            assert_same(y.detach(), y0[sl], f"{tag}: y")
            assert_same(x.grad, dx0[sl], f"{tag}: d x")
            assert_same(w.grad, dw0[sl], f"{tag}: d topk_w")
            assert_same(gu.grad, dgu0[shard], f"{tag}: d gate_up_proj")
            assert_same(dn.grad, ddn0[shard], f"{tag}: d down_proj")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_processes_match_w1_bitwise(world, _fresh_seed):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_gloo_worker, args=(world, os.path.join(d, "store"), _fresh_seed, TOKENS[world]), nprocs=world,
                 join=True)


def _moe_layer_worker(rank, world, path, seed, tokens):
    """mok.MoE(..., ep=group) on each rank against one mok.MoE holding every expert and token."""
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.set_num_threads(1)
        H, I, E, K = 16, 12, 8, 2
        torch.manual_seed(seed)
        full = mok.MoE(H, I, E, K, num_shared_experts=1)
        x_all = torch.randn(sum(tokens), H, generator=torch.Generator().manual_seed(seed + 1))
        dy_all = torch.randn_like(x_all)
        x0 = x_all.clone().requires_grad_()
        y0 = full(x0)
        (y0 * dy_all).sum().backward()

        group = ep.ExpertParallel(num_experts=E, max_tokens=max(tokens), top_k=K, hidden_size=H,
                                  dtype=torch.float32, device="cpu")
        layer = mok.MoE(H, I, E, K, num_shared_experts=1, ep=group)
        El = group.local_experts
        shard = slice(rank * El, (rank + 1) * El)
        with torch.no_grad():
            for name, p in layer.named_parameters():
                src = dict(full.named_parameters())[name]
                p.copy_(src[shard] if name.startswith("experts.") else src)
        sl = slice(sum(tokens[:rank]), sum(tokens[: rank + 1]))
        x = x_all[sl].clone().requires_grad_()
        y = layer(x)
        (y * dy_all[sl]).sum().backward()
        # NOTE: close, not bitwise: the router and shared-expert matmuls are torch's, whose CPU
        # blocking depends on the number of rows (the routed experts alone are bitwise: see above).
        close = dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(y.detach(), y0.detach()[sl], **close)
        torch.testing.assert_close(x.grad, x0.grad[sl], **close)
        # Expert gradients: each rank holds the full sum for its experts (tokens of every rank).
        torch.testing.assert_close(layer.experts.gate_up_proj.grad, full.experts.gate_up_proj.grad[shard], **close)
        torch.testing.assert_close(layer.experts.down_proj.grad, full.experts.down_proj.grad[shard], **close)
        # Router and shared-expert gradients are per-rank partial sums (data parallel): they add up.
        for name in ("router.weight", "shared_experts.up_proj.weight"):
            g = dict(layer.named_parameters())[name].grad.clone()
            dist.all_reduce(g)
            torch.testing.assert_close(g, dict(full.named_parameters())[name].grad, rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_moe_layer_with_ep_matches_full_layer(_fresh_seed):
    world = 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_moe_layer_worker, args=(world, os.path.join(d, "store"), _fresh_seed % 10000, [9, 6]),
                 nprocs=world, join=True)


# ------------------------------------------------------------------------------------------------
# fake kernels and torch.compile
# ------------------------------------------------------------------------------------------------


def test_exchange_op_fakes_give_static_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    W, T, K, H, E = 2, 5, 2, 16, 4
    lay = ep.make_layout(torch.randint(0, E, (W, T, K)), E, W, T * K)
    common = (0, W, T * K, 10**6, 4, 1000, -1)
    with FakeTensorMode(allow_non_fake_inputs=True):
        table = torch.empty(2 * W + 1, dtype=torch.int64)
        recv, eid, cnt = torch.ops.mok.ep_dispatch(torch.empty(W, T, H), K, lay.dst, lay.pos, lay.eid, lay.counts,
                                                   table, *common)
        assert (recv.shape, eid.shape, cnt.shape) == ((W, W * T * K, H), (W, W * T * K), (W, W))
        assert eid.dtype == torch.int32
        out = torch.ops.mok.ep_combine(recv, cnt, lay.dst, lay.pos, table, *common)
        assert out.shape == (W, T * K, H)


def test_compile_fullgraph_virtual_ranks(_fresh_seed):
    W, T, K, H, I, E = 2, 5, 2, 16, 8, 4
    g = ep.VirtualExpertParallel(W, num_experts=E, max_tokens=T, top_k=K, hidden_size=H, dtype=torch.float32)
    x = torch.randn(W, T, H, requires_grad=True)
    idx, w = torch.randint(0, E, (W, T, K)), torch.rand(W, T, K)
    gu, dn = torch.randn(E, 2 * I, H, requires_grad=True), torch.randn(E, H, I, requires_grad=True)
    y0 = g.moe_experts(x, idx, w, gu, dn)
    (dx0,) = torch.autograd.grad(y0.sum(), x)
    y1 = torch.compile(g.moe_experts, fullgraph=True)(x, idx, w, gu, dn)
    (dx1,) = torch.autograd.grad(y1.sum(), x)
    assert_same(y1, y0, "compiled y")
    assert_same(dx1, dx0, "compiled d x")


@pytest.mark.parametrize("options", [FP8_OPTIONS[2], FP8_OPTIONS[3]], ids=str)
def test_compile_fullgraph_virtual_ranks_fp8_recipes(options, _fresh_seed):
    # the FP8 recipes' local experts under torch.compile(fullgraph=True): the same y and d x as eager
    W, T, K, H, I, E = 2, 5, 2, 128, 128, 4
    g = ep.VirtualExpertParallel(W, num_experts=E, max_tokens=T, top_k=K, hidden_size=H, dtype=torch.bfloat16)
    x = torch.randn(W, T, H, dtype=torch.bfloat16, requires_grad=True)
    idx, w = torch.randint(0, E, (W, T, K)), torch.rand(W, T, K)
    gu = torch.randn(E, 2 * I, H, dtype=torch.bfloat16, requires_grad=True)
    dn = torch.randn(E, H, I, dtype=torch.bfloat16, requires_grad=True)
    y0 = g.moe_experts(x, idx, w, gu, dn, **options)
    (dx0,) = torch.autograd.grad(y0.float().sum(), x)
    y1 = torch.compile(functools.partial(g.moe_experts, **options), fullgraph=True)(x, idx, w, gu, dn)
    (dx1,) = torch.autograd.grad(y1.float().sum(), x)
    assert_same(y1, y0, "compiled y")
    assert_same(dx1, dx0, "compiled d x")
