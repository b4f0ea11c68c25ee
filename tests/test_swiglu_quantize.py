"""torch.ops.mok.swiglu_quantize_fp8: SwiGLU (forward) or its gradient (backward) with the result
quantised blockwise 1 x 128, row-wise and / or column-wise, in one op. It is defined as the
composition swiglu / swiglu_backward then quantize_fp8 / quantize_fp8_rowcol (each tested against
mok.reference elsewhere); on the GPU one kernel makes it (csrc/cuda/quant/swiglu_quantize_stream.cuh,
or swiglu_quantize_tile.cuh's per-tile one with MOK_SWIGLU_STREAM=0), which must give the
composition's codes, scales and bf16 values bit for bit: ragged row counts (R not a multiple of 128
or 16, R = 0, R = 1), widths of one and several 128-column blocks, rows of zeros, large values
(saturating exp), NaN and Inf, every combination of rows / cols / keep. On the CPU the op is the
composition itself; these tests then check its shapes and options."""
import pytest
import torch

from conftest import DEVICES
from mok._ops import ops

RECIPE = "blockwise_1x128"
SHAPES = [(0, 128), (1, 128), (13, 256), (128, 128), (200, 384), (515, 128)]
FLAGS = [(True, False, False), (False, True, False), (True, True, False), (True, True, True), (True, False, True),
         (False, True, True)]


def kernel_cases(test):
    """test(device, R, I, backward, special) over every device, SHAPES, both directions, randn and special h."""
    for mark in (pytest.mark.parametrize("special", [False, True], ids=["randn", "special"]),
                 pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"]),
                 pytest.mark.parametrize("R,I", SHAPES, ids=lambda v: str(v)),
                 pytest.mark.parametrize("device", DEVICES)):
        test = mark(test)
    return test


def make_h(R, I, device, special):
    h = torch.randn(R, 2 * I, device=device) * 3
    if special and R > 4:
        h[1] = 0                             # a row of zeros
        h[2, : I // 2] = 90.0                # exp(-g) underflows / saturates
        h[3, 5] = float("nan")
        h[4, I + 7] = float("inf")
        h[0, :: 17] *= 1e-30                 # tiny values
    return h.to(torch.bfloat16)


def composed(h, d_act, rows, cols):
    """(y, q, scales, qt, scales_t) by the separate ops."""
    y = ops.swiglu(h) if d_act is None else ops.swiglu_backward(h, d_act)
    q = s = qt = st = None
    if cols:
        q, s, qt, st = ops.quantize_fp8_rowcol(y, RECIPE)
    if rows and not cols:
        q, s = ops.quantize_fp8(y, RECIPE)
    return y, q, s, qt, st


def same_bits(a, b):
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    elif a.dtype == torch.bfloat16:
        a, b = a.view(torch.int16), b.view(torch.int16)
    elif a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return a.shape == b.shape and torch.equal(a, b)


def assert_outputs(got, want, names, what):
    """Each output bitwise its reference; an output whose reference is None was not asked for: empty."""
    for name, g, ref in zip(names, got, want):
        if ref is None:
            assert g.numel() == 0, f"{what}: {name} was not asked for, got shape {tuple(g.shape)}"
        else:
            assert same_bits(g, ref), f"{what}: {name} differs from the composition"


@kernel_cases
def test_matches_the_composition_bit_for_bit(device, R, I, backward, special):
    h = make_h(R, I, device, special)
    d_act = (torch.randn(R, I, device=device) * 2).to(torch.bfloat16) if backward else None
    N = 2 * I if backward else I
    y, q, s, qt, st = composed(h, d_act, True, True)
    for rows, cols, keep in FLAGS:
        out = ops.swiglu_quantize_fp8(h, d_act, rows, cols, keep)
        what = f"R={R} I={I} backward={backward} rows={rows} cols={cols} keep={keep}"
        want = [y if keep else None, q if rows else None, s if rows else None, qt if cols else None,
                st if cols else None]
        assert_outputs(out, want, ("out", "q", "scales", "qt", "scales_t"), what)
        if keep:
            assert out[0].shape == (R, N)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_column_copy_layouts_match_the_rowcol_op(device, backward):
    # scales_t_mn_major and col_recipe="blockwise_128x128" (v52, the layer's fp8_wgrad="tiled"): the
    # column-wise half is quantize_fp8_rowcol(y, ..., scales_t_mn_major, col_recipe)'s bit for bit (its
    # kernel shares the tile code), the row-wise half unchanged; ragged R, one and several column tiles.
    for R, I in [(1, 128), (200, 384), (515, 128), (256, 256)]:
        h = make_h(R, I, device, True)
        d_act = (torch.randn(R, I, device=device) * 2).to(torch.bfloat16) if backward else None
        y = ops.swiglu(h) if d_act is None else ops.swiglu_backward(h, d_act)
        for mn in (False, True):
            for col in (None, "blockwise_1x128", "blockwise_128x128"):
                q, s, qt, st = ops.quantize_fp8_rowcol(y, RECIPE, mn, col)
                for rows, keep in ((True, False), (False, True)):
                    out = ops.swiglu_quantize_fp8(h, d_act, rows, True, keep, mn, col)
                    what = f"R={R} I={I} backward={backward} mn={mn} col={col} rows={rows}"
                    assert same_bits(out[3], qt) and same_bits(out[4], st), f"{what}: column-wise copy"
                    if rows:
                        assert same_bits(out[1], q) and same_bits(out[2], s), f"{what}: row-wise copy"
                    if keep:
                        assert same_bits(out[0], y), f"{what}: out"
    with pytest.raises(ValueError, match="col_recipe"):
        ops.swiglu_quantize_fp8(h, d_act, True, True, False, False, "mxfp8")


@pytest.mark.parametrize("device", DEVICES)
def test_other_widths_and_dtypes_take_the_composition(device):
    # I % 128 != 0 and float32: the composition on every device (the kernel needs whole 128-column blocks)
    for h in (torch.randn(33, 80, device=device, dtype=torch.bfloat16), torch.randn(9, 256, device=device)):
        d_act = torch.randn(h.shape[0], h.shape[1] // 2, device=device, dtype=h.dtype)
        for da in (None, d_act):
            out = ops.swiglu_quantize_fp8(h, da, True, True, True)
            for got, ref in zip(out, composed(h, da, True, True)):
                assert same_bits(got, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_argument(device):
    h = torch.randn(4, 256, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rows and cols are both false"):
        ops.swiglu_quantize_fp8(h, None, False, False, True)
    with pytest.raises(ValueError, match="h.shape\\[1\\] must be even"):
        ops.swiglu_quantize_fp8(torch.randn(4, 255, device=device, dtype=torch.bfloat16), None, True, False, False)
    with pytest.raises(ValueError, match="d_act.shape\\[1\\] must be 128"):
        ops.swiglu_quantize_fp8(h, torch.randn(4, 64, device=device, dtype=torch.bfloat16), True, False, False)
    with pytest.raises(ValueError, match="d_act must be"):
        ops.swiglu_quantize_fp8(h, torch.randn(4, 128, device=device), True, False, False)
    with pytest.raises(ValueError, match="h must be contiguous"):
        ops.swiglu_quantize_fp8(torch.randn(256, 4, device=device, dtype=torch.bfloat16).t(), None, True, False, False)


# ---- swiglu_scaled_quantize_fp8 (v53): the row-scaled form z = s * swiglu(h) of the all-FP8 layer ----

def make_row_scale(R, device):
    """Router-weight-like scales with the edge values: zeros (padding rows), a negative and a large one."""
    s = torch.rand(R, device=device)
    if R > 6:
        s[1] = 0
        s[4] = -0.75
        s[6] = 300.0
    return s


def scaled_definition(h, d_z, s, rows, cols, mn, col):
    """(q, scales, qt, scales_t, d_s) by the separate ops (the op's definition)."""
    R, I = h.shape[0], h.shape[1] // 2
    src = torch.arange(R, device=h.device, dtype=torch.int32)
    dz = d_z if d_z is not None else torch.zeros(R, I, device=h.device, dtype=h.dtype)
    d_h, z, d_s = ops.swiglu_scaled_backward(h, dz, src, s.view(R, 1))
    row_src, col_src = (d_h, d_h) if d_z is not None else (ops.swiglu(h), z)
    q, sc = ops.quantize_fp8(row_src, RECIPE) if rows else (None, None)
    qt, st = ops.quantize_fp8_rowcol(col_src, RECIPE, mn, col)[2:] if cols else (None, None)
    return q, sc, qt, st, (d_s if d_z is not None else None), (dz, ops.swiglu(h))


@kernel_cases
def test_scaled_matches_its_definition(device, R, I, backward, special):
    # the codes and scales bit for bit those of the separate ops (forward: act's row-wise copy, z's
    # column-wise one; backward: d_h's for d_act = s * d_z); d_s = d_z . act: on the GPU the kernel's
    # per-128-column partial sums added in a fixed order, equal to swiglu_scaled_backward's up to fp32
    # rounding (measured against the Cauchy-Schwarz scale |d_z_r| |act_r|, so cancellation is not an error)
    h = make_h(R, I, device, special)
    s = make_row_scale(R, device)
    d_z = (torch.randn(R, I, device=device) * 2).to(torch.bfloat16) if backward else None
    for rows, cols in ((True, True), (True, False), (False, True)):
        for mn, col in ((False, None), (True, None), (True, "blockwise_128x128")):
            got = ops.swiglu_scaled_quantize_fp8(h, d_z, s, rows, cols, mn, col)
            want = scaled_definition(h, d_z, s, rows, cols, mn, col)
            what = f"R={R} I={I} backward={backward} rows={rows} cols={cols} mn={mn} col={col}"
            assert_outputs(got[:4], want[:4], ("q", "scales", "qt", "scales_t"), what)
            if not backward:
                assert got[4].numel() == 0, f"{what}: d_s in the forward"
                continue
            assert got[4].shape == (R,) and got[4].dtype == torch.float32
            dz, act = (t.double() for t in want[5])
            finite = torch.isfinite(dz).all(1) & torch.isfinite(act).all(1)
            scale = dz.norm(dim=1) * act.norm(dim=1) + 1e-30
            err = ((got[4].double() - want[4].double()).abs() / scale)[finite]
            assert err.numel() == 0 or err.max() < 1e-5, f"{what}: d_s"
            # NaN / Inf in a row's inputs reach its d_s as in the definition
            assert torch.equal(torch.isfinite(got[4]), torch.isfinite(want[4])), f"{what}: d_s's non-finite rows"


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_other_widths_and_dtypes_take_the_composition(device):
    for h in (torch.randn(33, 80, device=device, dtype=torch.bfloat16), torch.randn(9, 256, device=device)):
        R, I = h.shape[0], h.shape[1] // 2
        s = make_row_scale(R, device)
        for d_z in (None, torch.randn(R, I, device=device, dtype=h.dtype)):
            got = ops.swiglu_scaled_quantize_fp8(h, d_z, s, True, True)
            want = scaled_definition(h, d_z, s, True, True, False, None)
            for name, g, ref in zip(("q", "scales", "qt", "scales_t", "d_s"), got, want):
                if ref is not None:
                    assert same_bits(g, ref), name


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_bad_input_names_the_argument(device):
    h = torch.randn(4, 256, device=device, dtype=torch.bfloat16)
    s = torch.rand(4, device=device)
    with pytest.raises(ValueError, match="rows and cols are both false"):
        ops.swiglu_scaled_quantize_fp8(h, None, s, False, False)
    with pytest.raises(ValueError, match="row_scale.shape\\[0\\] must be 4"):
        ops.swiglu_scaled_quantize_fp8(h, None, torch.rand(5, device=device), True, True)
    with pytest.raises(ValueError, match="row_scale must be"):
        ops.swiglu_scaled_quantize_fp8(h, None, s.bfloat16(), True, True)
    with pytest.raises(ValueError, match="d_z.shape\\[1\\] must be 128"):
        ops.swiglu_scaled_quantize_fp8(h, torch.randn(4, 64, device=device, dtype=torch.bfloat16), s, True, False)
    with pytest.raises(ValueError, match="col_recipe"):
        ops.swiglu_scaled_quantize_fp8(h, None, s, True, True, False, "mxfp8")


@pytest.mark.gpu
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_streamed_and_per_tile_kernels_agree(monkeypatch, backward, scaled):
    # v54-v56: the streamed kernels (MOK_SWIGLU_STREAM=1; persistent, their loads ahead: the forward's one item,
    # the backward's a ring of rows per output tile, its row-scaled form with the row scales in the ring and
    # the router-weight gradient's partial sums) and the per-tile one (MOK_SWIGLU_STREAM=0) give the same bits
    # (the same sums in the same order), on shapes with more items than resident CTAs (several items per CTA,
    # a ragged last round), rows past R, special values, every copy combination and the one node's column
    # layouts
    for R, I in [(4100, 1024), (515, 384), (1, 128), (33000, 256)]:
        h = make_h(R, I, "cuda", True)
        d = (torch.randn(R, I, device="cuda") * 2).to(torch.bfloat16) if backward else None
        s = make_row_scale(R, "cuda")
        for rows, cols, keep in FLAGS:
            for mn, col in ((False, None), (True, "blockwise_128x128")):
                if scaled and keep:
                    continue

                def run():
                    if scaled:
                        return ops.swiglu_scaled_quantize_fp8(h, d, s, rows, cols, mn, col)
                    return ops.swiglu_quantize_fp8(h, d, rows, cols, keep, mn, col)

                monkeypatch.setenv("MOK_SWIGLU_STREAM", "0")
                want = run()
                monkeypatch.setenv("MOK_SWIGLU_STREAM", "1")
                got = run()
                what = f"R={R} I={I} rows={rows} cols={cols} keep={keep} mn={mn} col={col}"
                for name, g, w in zip(("0", "1", "2", "3", "4"), got, want):
                    assert (g.numel() == 0 and w.numel() == 0) or same_bits(g, w), f"{what}: output {name}"
