"""mok::quantize_fp8_weight_rowcol: an expert weight's 128 x 128 blockwise codes for the FP8 forward and
those of each expert's W^T for the FP8 dgrad, from one read of the weight (one kernel on CUDA bf16), bit
for bit the C core's quantisation followed by the transposes; for torchtitan's (w1, w3) pair, those of
the concatenation without making it. And the layer with the fused codes (mok._fp8_experts.
FUSED_WEIGHT_CODES) against the two-pass codes: the same bits, the same cache."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok._ops import ops
from shapes import make_moe_inputs
from test_fp8_experts import CASES

# (E, N, K): one tile, several experts and partial tiles along K, K below one piece, an expert's rows of
# several tiles with K not a multiple of 8 (the kernel's element-wise path), no experts, K = 0
SHAPES = [(1, 128, 128), (3, 256, 384), (2, 128, 200), (4, 128, 8), (2, 384, 1300), (2, 256, 77), (0, 128, 64),
          (2, 128, 0)]


def reference(w):
    """The definition on the C core: quantize_fp8(w as [E * N, K], "blockwise_128x128"), then per expert the
    codes and the scales transposed."""
    E, N, K = w.shape
    q, s = ops.quantize_fp8(w.detach().cpu().reshape(E * N, K), "blockwise_128x128")
    q, s = q.view(E, N, K), s.view(E, N // 128, s.shape[1])
    return q, s, q.transpose(1, 2).contiguous(), s.transpose(1, 2).contiguous()


def assert_same(got, want):
    names = ("q", "scales", "qt", "scales_t")
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous(), (name, a.shape, b.shape)
        a, b = a.cpu(), b.cpu()
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b) if a.dtype == torch.uint8 else torch.equal(a.view(torch.int32), b.view(torch.int32)), \
            f"{name} differs from the quantisation then the transpose"


def edge_weight(E, N, K, device, dtype):
    """Random values scaled per 128 x 128 tile over many binades, with an all-zero tile, a tile holding an
    Inf, one holding a NaN and one of subnormal-sized values where the shape has room."""
    w = torch.randn(E, N, K, dtype=torch.float64)
    tiles_k = (K + 127) // 128
    for e in range(E):
        for tn in range(N // 128):
            for tk in range(tiles_k):
                w[e, 128 * tn:128 * tn + 128, 128 * tk:128 * tk + 128] *= 2.0 ** torch.randint(-20, 12, ()).item()
    if E and K:
        w[0, :128, :128] = 0.0
        w[-1, -1, -1] = float("inf")
        if N >= 256:
            w[0, 128, 0] = float("nan")
            w[-1, 128:256, :] *= 1e-30
    return w.to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_weight_codes_are_the_quantisation_then_the_transpose(device, shape, dtype):
    w = edge_weight(*shape, device, dtype)
    assert_same(ops.quantize_fp8_weight_rowcol(w), reference(w))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 128, 128), (3, 256, 384), (2, 128, 200), (2, 384, 77)], ids=str)
def test_pair_codes_are_those_of_the_concatenation(device, shape):
    gate, up = (edge_weight(*shape, device, torch.bfloat16) for _ in range(2))
    assert_same(ops.quantize_fp8_weight_rowcol(gate, up), reference(torch.cat([gate, up], 1)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3, 256, 384), (2, 128, 200)], ids=str)
@pytest.mark.parametrize("pair", [False, True], ids=["one-weight", "pair"])
def test_codes_alone_are_the_rowcol_ops_first_two(device, shape, pair):
    # mok::quantize_fp8_weight: the same kernel without the transposed copy (the pair's forward codes)
    w = edge_weight(*shape, device, torch.bfloat16)
    up = edge_weight(*shape, device, torch.bfloat16) if pair else None
    want = reference(torch.cat([w, up], 1) if pair else w)
    got = ops.quantize_fp8_weight(w, up)
    assert len(got) == 2
    assert_same(tuple(got) + want[2:], want)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_codes_of_a_misaligned_weight(device):
    # rows whose 16-byte loads would straddle: the element-wise path, same bits
    w = torch.randn(2 * 128 * 136 + 1, dtype=torch.bfloat16, device=device)[1:].view(2, 128, 136)
    assert_same(ops.quantize_fp8_weight_rowcol(w), reference(w))


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_never_alias(device):
    # one tile row per expert: the transposed scales [E, kb, 1] are already contiguous as a view of the scales,
    # but a custom op's outputs may not alias each other or an input (torch.compile refuses them)
    w = torch.randn(2, 128, 256, device=device, dtype=torch.bfloat16)
    outs = ops.quantize_fp8_weight_rowcol(w)
    ptrs = [t.untyped_storage().data_ptr() for t in outs] + [w.untyped_storage().data_ptr()]
    assert len(set(ptrs)) == len(ptrs)
    q = torch.randint(0, 255, (2, 1, 64), dtype=torch.uint8, device=device)
    assert ops.transpose_fp8_codes(q).untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    compiled = torch.compile(lambda t: ops.quantize_fp8_weight_rowcol(t), fullgraph=True)
    assert_same(compiled(w), reference(w))


@pytest.mark.parametrize("op", ["quantize_fp8_weight_rowcol", "quantize_fp8_weight"])
def test_bad_input_names_the_argument(op):
    fn = getattr(ops, op)
    op = f"mok.{op}"
    with pytest.raises(ValueError, match=rf"{op}: w must be 3-D \[E, N, K\]"):
        fn(torch.zeros(128, 128))
    with pytest.raises(ValueError, match=rf"{op}: w.shape\[1\] \(N\) must be a multiple of 128"):
        fn(torch.zeros(2, 64, 128))
    with pytest.raises(ValueError, match=rf"{op}: up must have the shape of w"):
        fn(torch.zeros(2, 128, 128), torch.zeros(2, 256, 128))
    with pytest.raises(ValueError, match=rf"{op}: up must have w's dtype"):
        fn(torch.zeros(2, 128, 128), torch.zeros(2, 128, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=rf"{op}: w must be contiguous"):
        fn(torch.zeros(2, 128, 256)[:, :, :128])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", [False, True], ids=["one-weight", "pair"])
@pytest.mark.parametrize("options", [{}, dict(fp8_dgrad=True), dict(fp8_dgrad=True, fp8_wgrad="tiled")],
                         ids=["fp8_forward", "fp8_dgrad", "all_tiled"])
@pytest.mark.parametrize("case", CASES[1:4], ids=str)
def test_layer_with_fused_weight_codes_is_the_two_pass_layer(monkeypatch, device, pair, options, case):
    # y and every gradient bit for bit, and the codes cached as before (reused on the next call, both the
    # forward's and the dgrad's). Without fp8_dgrad only the pair's forward codes change hands
    # (mok::quantize_fp8_weight).
    x, idx, w, gate_up, down = make_moe_inputs(case, torch.bfloat16, device, requires_grad=True)
    weight = (gate_up[:, :case.I].detach().clone().requires_grad_(True),
              gate_up[:, case.I:].detach().clone().requires_grad_(True)) if pair else gate_up
    leaves = [x, w, *(weight if pair else [weight]), down]
    dy = torch.randn(case.T, case.H, dtype=torch.bfloat16, device=device)
    results, made = {}, []
    fused_codes = mok._fp8_experts.quantize_expert_weight_rowcol
    monkeypatch.setattr(mok._fp8_experts, "quantize_expert_weight_rowcol",
                        lambda *a: made.append(1) or fused_codes(*a))
    for fused in (False, True):
        monkeypatch.setattr(mok._fp8_experts, "FUSED_WEIGHT_CODES", fused)
        mok._fp8_experts.drop_cached_codes(*leaves)
        y = mok.functional.moe_experts(x, idx, w, weight, down, recipe="blockwise", **options)
        results[fused] = [y] + list(torch.autograd.grad(y, leaves, dy))
        want_made = 2 if fused and options else 0
        assert len(made) == want_made, "the fused codes were not made where asked for (or made where not)"
    for a, b in zip(results[False], results[True]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    first = weight[0] if pair else weight
    kinds = ("", "_t") if options else ("",)
    attrs = [f"_mok_fp8_blockwise{'_pair' if pair else ''}{kind}" for kind in kinds]
    cached = lambda: [getattr(first, a) for a in attrs] + [getattr(down, f"_mok_fp8_blockwise{k}") for k in kinds]  # noqa: E731
    entries = cached()
    assert all(e is not None for e in entries)
    mok.functional.moe_experts(x, idx, w, weight, down, recipe="blockwise", **options)
    assert all(a is b for a, b in zip(cached(), entries)) and len(made) == want_made  # reused, not remade
