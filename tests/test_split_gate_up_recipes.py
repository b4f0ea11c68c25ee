"""torchtitan's (w1, w3) pair under recipe="blockwise" and recipe="mxfp8": the same bits as the
concatenated [E, 2I, H] weight on every path of both recipes (each autograd node form, FP8 and BF16
backward GEMMs), the codes / qdq copies cached per version of the pair (a change to either half is
seen), and the FP8 weight gradient's gate / up form (mok::grouped_mm_fp8_gate_up_wgrad) equal to the
halves of the whole one, its outputs in either address order. Ragged routing throughout."""
import os

import pytest
import torch

import mok
from conftest import DEVICES
from mok._ops import ops
from shapes import make_moe_inputs, make_routing
# CASES: H and I multiples of 128 (the blockwise recipe's scale blocks); no tokens, one token with K = 1, an
# empty expert, one expert taking all, zipf
from test_fp8_experts import CASES
from test_fp8_gemm import make_wgrad_operands
from test_split_gate_up import halves

# (recipe, options, mok._fp8_experts / mok._mxfp8_experts settings): every node form the recipes take
CONFIGS = [
    pytest.param("blockwise", {}, {}, id="blockwise"),  # FP8 forward, BF16 backward (split BF16 kernels)
    pytest.param("blockwise", dict(fp8_dgrad=True), {}, id="fp8_dgrad"),
    pytest.param("blockwise", dict(fp8_wgrad=True), {}, id="fp8_wgrad"),  # _Fp8GateUp's FP8 weight gradient
    pytest.param("blockwise", dict(fp8_dgrad=True, fp8_wgrad=True), {}, id="all"),  # the one node
    pytest.param("blockwise", dict(fp8_dgrad=True, fp8_wgrad="tiled"), dict(ROUTER_GRAD_IN_SWIGLU=True),
                 id="all_tiled_rgs"),
    pytest.param("blockwise", dict(fp8_dgrad=True, fp8_wgrad=True),
                 dict(FUSED_MLP_COMBINE=False, FUSED_SWIGLU_QUANT=True), id="all_mlp_node"),
    pytest.param("blockwise", dict(fp8_dgrad=True, fp8_wgrad=True), dict(FUSED_GATE_UP=True), id="all_fused_gate_up"),
    pytest.param("mxfp8", {}, {}, id="mxfp8"),
    pytest.param("mxfp8", {}, dict(QDQ_IN_GEMM=True), id="mxfp8_qdq_in_gemm"),  # concatenates the pair
]


def _apply_settings(monkeypatch, recipe, settings):
    module = mok._fp8_experts if recipe == "blockwise" else mok._mxfp8_experts
    for name, value in settings.items():
        monkeypatch.setattr(module, name, value)


def _run(x, idx, w, weight, down, dy, recipe, options, leaves):
    y = mok.functional.moe_experts(x, idx, w, weight, down, recipe=recipe, **options)
    return [y] + list(torch.autograd.grad(y, leaves, dy))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe,options,settings", CONFIGS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_recipe_with_gate_up_pair_equals_concatenated(monkeypatch, device, recipe, options, settings, case):
    # y and every gradient bit for bit; d_gate and d_up the halves of d_gate_up. Up at the lower address
    # for every other case (the kernels' flipped planes). A frozen up (w3 without a gradient) as well.
    _apply_settings(monkeypatch, recipe, settings)
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, device, requires_grad=True)
    I = case.I
    gate, up = (t.requires_grad_(True) for t in halves(gate_up.detach(), I, up_first=case.T % 2 == 1))
    dy = torch.randn(case.T, case.H, dtype=torch.bfloat16, device=device)
    want = _run(x, idx, w, gate_up, down, dy, recipe, options, [x, w, gate_up, down])
    got = _run(x, idx, w, (gate, up), down, dy, recipe, options, [x, w, gate, up, down])
    want = want[:3] + [want[3][:, :I], want[3][:, I:], want[4]]
    names = ["y", "d_x", "d_topk_w", "d_gate", "d_up", "d_down"]
    for name, a, b in zip(names, want, got):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name} differs from the concatenated weight's"
    if not settings.get("QDQ_IN_GEMM"):  # (which concatenates: its gradients are views of one tensor)
        assert got[3].is_contiguous() and got[4].is_contiguous(), "the halves' gradients were not written in place"
    up.requires_grad_(False)
    frozen = _run(x, idx, w, (gate, up), down, dy, recipe, options, [gate, down])
    assert torch.equal(frozen[1].view(torch.int16), want[3].view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_blockwise_pair_codes_are_cached_until_either_half_changes(device):
    # The pair's codes live on the gate, keyed by both halves: reused while neither changes, remade when
    # the up half changes in place (an optimizer step) or is replaced by another tensor (even with the
    # same values), and always those of the current concatenation.
    case = CASES[2]
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, device)
    gate, up = gate_up[:, :case.I].contiguous(), gate_up[:, case.I:].contiguous()  # (own version counters)

    def run(g, u):
        return mok.functional.moe_experts(x, idx, w, (g, u), down, recipe="blockwise")

    def concatenated(g, u):
        return mok.functional.moe_experts(x, idx, w, torch.cat([g, u], 1), down, recipe="blockwise")

    y = run(gate, up)
    entry = gate._mok_fp8_blockwise_pair
    assert torch.equal(run(gate, up), y) and gate._mok_fp8_blockwise_pair is entry  # reused
    with torch.no_grad():
        up.mul_(-2.0)  # an optimizer step on w3 alone
    y2 = run(gate, up)
    assert gate._mok_fp8_blockwise_pair is not entry
    assert torch.equal(y2, concatenated(gate, up)) and not torch.equal(y2, y)
    entry = gate._mok_fp8_blockwise_pair
    other = up.clone()  # a new w3 with the same values: a miss, the same result
    assert torch.equal(run(gate, other), y2) and gate._mok_fp8_blockwise_pair is not entry
    with torch.no_grad():
        gate.add_(1.0)
    assert torch.equal(run(gate, other), concatenated(gate, other))


@pytest.mark.parametrize("device", DEVICES)
def test_mxfp8_pair_copies_are_cached_per_half(device):
    # Each half's qdq copies on its own tensor: a change to one half remakes its copies only.
    case = CASES[2]
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, device)
    gate, up = gate_up[:, :case.I].contiguous(), gate_up[:, case.I:].contiguous()  # (own version counters)
    y = mok.functional.moe_experts(x, idx, w, (gate, up), down, recipe="mxfp8")
    g_entry, u_entry = gate._mok_mxfp8_qdq, up._mok_mxfp8_qdq
    with torch.no_grad():
        up.mul_(0.5)
    y2 = mok.functional.moe_experts(x, idx, w, (gate, up), down, recipe="mxfp8")
    assert gate._mok_mxfp8_qdq is g_entry and up._mok_mxfp8_qdq is not u_entry
    assert not torch.equal(y, y2)
    assert torch.equal(y2, mok.functional.moe_experts(x, idx, w, torch.cat([gate, up], 1), down, recipe="mxfp8"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,M,N", [
    pytest.param([0, 128, 128, 256, 384], 256, 128, id="empty-expert"),
    pytest.param([0, 0, 256, 256], 512, 256, id="one-expert-all-rows"),
    pytest.param([0, 0, 0], 256, 128, id="R0"),
    pytest.param(("zipf", 150, 4, 16), 256, 384, id="plan-zipf"),
])
@pytest.mark.parametrize("b_tiled", [False, True], ids=["b-1x128", "b-128x128"])
def test_fp8_gate_up_wgrad_is_the_halves_of_the_whole(device, rows, M, N, b_tiled):
    # (explicit 128-aligned offsets, or the device's own plan of a routing: 128-row tiles on CUDA)
    if isinstance(rows, tuple):
        routing, T, K, E = rows
        offsets = mok.functional.moe_plan(make_routing(T, K, E, routing).to(device), E).offsets
    else:
        offsets = torch.tensor(rows, dtype=torch.int32, device=device)
    R = int(offsets[-1])
    a_q, a_s, b_q, b_s = make_wgrad_operands(R, M, N, device, b_tiled)
    whole = ops.grouped_mm_fp8_wgrad(a_q, a_s, b_q, b_s, offsets)
    d_gate, d_up = ops.grouped_mm_fp8_gate_up_wgrad(a_q, a_s, b_q, b_s, offsets)
    assert d_gate.shape == d_up.shape == (offsets.shape[0] - 1, M // 2, N)
    assert d_gate.is_contiguous() and d_up.is_contiguous()
    assert torch.equal(d_gate.view(torch.int16), whole[:, :M // 2].view(torch.int16))
    assert torch.equal(d_up.view(torch.int16), whole[:, M // 2:].view(torch.int16))


def test_fp8_gate_up_wgrad_bad_input_names_the_argument():
    a_q, a_s, b_q, b_s = make_wgrad_operands(128, 128, 128, "cpu")
    off = torch.tensor([0, 128], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"mok.grouped_mm_fp8_gate_up_wgrad: b.shape\[1\] must be 128"):
        ops.grouped_mm_fp8_gate_up_wgrad(a_q, a_s, b_q[:, :64].contiguous(), b_s, off)
    a_q, a_s, b_q, b_s = make_wgrad_operands(128, 384, 128, "cpu")
    with pytest.raises(ValueError, match=r"mok.grouped_mm_fp8_gate_up_wgrad: a.shape\[0\] must be even"):
        ops.grouped_mm_fp8_gate_up_wgrad(a_q[:3].contiguous(), a_s[:, :3].contiguous(), b_q, b_s, off)


def _allocate_flipped(nbytes, run):
    """run() with the caching allocator arranged so that its first allocation of nbytes (a multiple of
    2 MiB) lands above its second: in a private memory pool (no other free blocks to choose from), one
    segment holding a free block of 2 * nbytes, a live 2 MiB separator (so the two free blocks do not
    merge), then a free block of exactly nbytes; best fit gives the first allocation the exact block
    (above) and the second the front of the larger one (below). Returns (run()'s result, the pool, which
    must outlive the result), or None when the blocks did not land as arranged."""
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        sep = 2 << 20
        segment = torch.empty(3 * nbytes + sep, dtype=torch.uint8, device="cuda")
        base = segment.data_ptr()
        del segment  # one free block of the whole size, carved below in address order
        low = torch.empty(2 * nbytes, dtype=torch.uint8, device="cuda")
        separator = torch.empty(sep, dtype=torch.uint8, device="cuda")
        high = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        arranged = (low.data_ptr(), separator.data_ptr(), high.data_ptr()) == (base, base + 2 * nbytes,
                                                                             base + 2 * nbytes + sep)
        del low, high
        result = run()
        del separator
    return (result, pool) if arranged else None


@pytest.mark.gpu
@pytest.mark.skipif(bool(os.environ.get("PYTORCH_CUDA_ALLOC_CONF")) or not hasattr(torch.cuda, "use_mem_pool"),
                    reason="the allocator arrangement assumes the default caching allocator and private pools")
def test_gate_up_wgrad_outputs_in_either_address_order():
    # The weight gradients' split store maps are based at the lower of the two outputs: d_up below d_gate
    # (the flipped planes) must give the same bits. Both the FP8 op and the BF16 one.
    E, I, N, R = 4, 1024, 2048, 512  # each output 16 MiB: its own 2 MiB-rounded block
    offsets = torch.tensor([0, 128, 128, 384, 512], dtype=torch.int32, device="cuda")
    a_q, a_s, b_q, b_s = make_wgrad_operands(R, 2 * I, N, "cuda", b_tiled=True)
    d_h = torch.randn(R, 2 * I, device="cuda", dtype=torch.bfloat16)
    rows = torch.randn(R, N, device="cuda", dtype=torch.bfloat16)
    nbytes = E * I * N * 2
    for name, op, whole in (
            ("fp8", lambda: ops.grouped_mm_fp8_gate_up_wgrad(a_q, a_s, b_q, b_s, offsets),
             lambda: ops.grouped_mm_fp8_wgrad(a_q, a_s, b_q, b_s, offsets)),
            ("bf16", lambda: ops.grouped_mm_gate_up_wgrad(d_h, rows, None, 1, offsets),
             lambda: ops.grouped_mm_wgrad(d_h, rows, None, 1, offsets))):
        want = whole()
        arranged = _allocate_flipped(nbytes, op)
        assert arranged is not None, "the allocator did not place the blocks as arranged"
        flipped, _pool = arranged
        d_gate, d_up = flipped
        assert d_up.data_ptr() < d_gate.data_ptr(), f"{name}: d_up was not placed below d_gate"
        straight = op()
        for d_gate, d_up in (flipped, straight):
            assert torch.equal(d_gate, want[:, :I]) and torch.equal(d_up, want[:, I:]), name
