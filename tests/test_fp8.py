"""FP8 quantisation (CPU ops on the C core) against mok.reference, an independent implementation
with torch's float8 dtypes: bit-exact codes and scales, on random and edge-case blocks; and the CUDA
kernels against the C core, bit for bit. quantize_rowcol against quantize(x) and quantize(x^T) on
every device (on CUDA, bf16 runs the fused kernel)."""
import pytest
import torch

import mok
from conftest import DEVICES
from shapes import make_gather_case
from mok import reference

RECIPES = ["blockwise_1x128", "blockwise_128x128", "mxfp8"]


def assert_bit_exact(x, recipe):
    q, s = mok.fp8.quantize(x, recipe)
    rq, rs = reference.quantize_fp8(x, recipe)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), "codes differ"
    if s.dtype == torch.uint8:
        assert torch.equal(s, rs), "E8M0 scales differ"
    else:
        assert torch.equal(s.view(torch.int32), rs.view(torch.int32)), "scales differ (bitwise)"
    return q, s


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 130), (129, 256), (200, 77), (0, 64)])
def test_random_blocks_bit_exact(recipe, dtype, shape):
    # Rows of very different magnitudes exercise the scales; a few exact zeros and ties too.
    x = torch.randn(*shape) * torch.logspace(-20, 20, shape[0] or 1)[: shape[0], None]
    x.view(-1)[::7] = 0
    assert_bit_exact(x.to(dtype), recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_edge_blocks(recipe):
    x = torch.randn(4, 160)
    x[0] = 0  # an all-zero block row
    x[1, 3] = float("inf")  # an Inf block
    x[2, 40] = float("nan")  # a NaN block
    x[3, :64] = torch.tensor([448.0, -448.0, 1e30, -1e30] * 16)  # saturation
    q, s = assert_bit_exact(x, recipe)
    if recipe == "blockwise_1x128":
        assert s[0, 0] == 1 and torch.isnan(s[1, 0]) and torch.isnan(s[2, 0])
        assert torch.all(q[1, :128].view(torch.uint8) == 0x7F)
    if recipe == "mxfp8":
        assert s[0, 0] == 0 and s[1, 0] == 0xFF and s[2, 1] == 0xFF


@pytest.mark.parametrize("recipe", RECIPES)
def test_round_trip_error_bound(recipe):
    x = torch.randn(300, 300) * 3
    q, s = mok.fp8.quantize(x, recipe)
    y = mok.fp8.dequantize(q, s, recipe)
    torch.testing.assert_close(y, reference.dequantize_fp8(q, s, recipe), rtol=0, atol=0)
    # E4M3 keeps 3 mantissa bits: a relative error of at most 2^-4 for normal values.
    big = x.abs() > x.abs().max() * 2**-6
    assert ((y - x).abs()[big] <= x.abs()[big] * 2**-4 + 1e-12).all()


def test_mx_scaled_values_fit_e4m3():
    x = torch.randn(64, 96) * torch.logspace(-30, 30, 64)[:, None]
    q, s = mok.fp8.quantize(x, "mxfp8")
    scaled = torch.ldexp(x, -(s.float() - 127).repeat_interleave(32, dim=1))
    assert scaled.abs().max() <= 448


def test_bad_recipe_and_shapes():
    with pytest.raises(ValueError, match="recipe"):
        mok.fp8.quantize(torch.randn(4, 4), "fp4")
    with pytest.raises(ValueError, match="recipe"):
        torch.ops.mok.quantize_fp8(torch.randn(4, 4), "int8")
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        mok.fp8.quantize(torch.randn(4), "mxfp8")
    q, s = mok.fp8.quantize(torch.randn(4, 40), "mxfp8")
    with pytest.raises(ValueError, match="scales must have shape"):
        mok.fp8.dequantize(q, s[:, :1].contiguous(), "mxfp8")


def _inputs_with_edge_blocks(shape, dtype):
    x = torch.randn(*shape) * torch.logspace(-20, 20, shape[0] or 1)[: shape[0], None]
    x.view(-1)[::7] = 0
    if shape[0] >= 5 and shape[1] >= 64:
        x[0] = 0  # all-zero blocks
        x[1, 3] = float("inf")
        x[2, shape[1] // 2] = float("nan")
        x[3, :64] = torch.tensor([448.0, -448.0, 1e30, -1e30] * 16)  # saturation
        x[4, :64] = torch.tensor([448.0, 2.0**-7, -(2.0**-8), 3 * 2.0**-10] * 16)  # subnormal codes, a tie
    if shape[0] >= 8 and dtype in (torch.bfloat16, torch.float32):
        x[5] = torch.randn(shape[1]) * 2.0**-110  # blocks below 2^-100: the bf16 kernels' division path
        x[6] = torch.randn(shape[1]) * 2.0**-128  # subnormal values
        x[7, ::3] = float("-inf")
    if shape[0] >= 9 and shape[1] >= 2 and dtype in (torch.bfloat16, torch.float32):
        # quotients below float's normal range: +-(smallest bf16 subnormal) next to a large amax
        x[8] = torch.where(torch.rand(shape[1]) < 0.5, -(2.0**-133), 2.0**-133)
        x[8, ::64] = 1000.0
    return x.to(dtype)


def assert_same_quantization(got, want, what):
    (q, s), (wq, ws) = got, want
    assert q.dtype == wq.dtype and q.shape == wq.shape and s.dtype == ws.dtype and s.shape == ws.shape, what
    assert torch.equal(q.cpu().view(torch.uint8), wq.cpu().view(torch.uint8)), f"{what}: codes differ"
    if s.dtype == torch.uint8:
        assert torch.equal(s.cpu(), ws.cpu()), f"{what}: E8M0 scales differ"
    else:
        assert torch.equal(s.cpu().view(torch.int32), ws.cpu().view(torch.int32)), f"{what}: scales differ (bitwise)"


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 130), (129, 256), (200, 77), (300, 1000), (6, 4096), (0, 64)])
def test_cuda_quantize_matches_c_core_bit_for_bit(recipe, dtype, shape):
    x = _inputs_with_edge_blocks(shape, dtype)
    q, s = mok.fp8.quantize(x, recipe)
    qc, sc = mok.fp8.quantize(x.cuda(), recipe)
    assert qc.is_cuda and qc.dtype == q.dtype and sc.dtype == s.dtype and sc.shape == s.shape
    assert torch.equal(qc.cpu().view(torch.uint8), q.view(torch.uint8)), "codes differ"
    if s.dtype == torch.uint8:
        assert torch.equal(sc.cpu(), s), "E8M0 scales differ"
    else:
        assert torch.equal(sc.cpu().view(torch.int32), s.view(torch.int32)), "scales differ (bitwise)"
    y = mok.fp8.dequantize(q, s, recipe)
    yc = mok.fp8.dequantize(qc, sc, recipe)
    torch.testing.assert_close(yc.cpu(), y, rtol=0, atol=0, equal_nan=True)


# Ragged shapes (M, N not multiples of 128 or 32), one row, 8 columns, no rows; plus a few drawn
# at random each run.
ROWCOL_SHAPES = [(1, 8), (1, 1), (0, 64), (64, 0), (3, 130), (129, 256), (200, 77), (130, 264), (256, 136),
                 (8, 1000), (300, 96)]
ROWCOL_RECIPES = ["blockwise_1x128", "mxfp8"]
# (MOK_QUANT_GATHER_BAND, MOK_QUANT_ROWCOL_STREAM) on CUDA: the default, row-major, bands of 1 and 3 tile
# columns; the streamed kernel row-major and in bands
BAND_STREAM_CASES = (("", ""), ("0", ""), ("1", ""), ("3", ""), ("", "1"), ("0", "1"), ("3", "1"))


def _random_shapes(n):
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    return [tuple(int(v) for v in torch.randint(1, 400, (2,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ROWCOL_RECIPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rowcol_equals_the_two_quantizations(device, recipe, dtype):
    for shape in ROWCOL_SHAPES + _random_shapes(3):
        x = _inputs_with_edge_blocks(shape, dtype)
        rc = mok.fp8.quantize_rowcol(x.to(device), recipe)
        assert isinstance(rc, mok.fp8.RowCol) and rc.q.device.type == device
        # the C core (CPU) is the definition; mok.reference is an independent one
        for ref in (mok.fp8.quantize, reference.quantize_fp8):
            assert_same_quantization((rc.q, rc.scales), ref(x, recipe), f"{shape} row-wise vs {ref.__module__}")
            assert_same_quantization((rc.qt, rc.scales_t), ref(x.t().contiguous(), recipe),
                                     f"{shape} column-wise vs {ref.__module__}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ROWCOL_RECIPES)
def test_rowcol_nan_inf_and_zero_blocks(device, recipe):
    B = 128 if recipe == "blockwise_1x128" else 32
    x = torch.randn(3 * B, 2 * B)
    x[:B, :B] = 0  # a zero tile: zero blocks both ways
    x[B + 5, B + 7] = float("nan")  # one row block and one column block go bad
    x[2 * B + 1, 3] = float("-inf")
    q, s, qt, st = mok.fp8.quantize_rowcol(x.to(device=device, dtype=torch.bfloat16), recipe)
    q, s, qt, st = q.cpu().view(torch.uint8), s.cpu(), qt.cpu().view(torch.uint8), st.cpu()
    zero_scale = 1.0 if recipe == "blockwise_1x128" else 0
    assert (s[:B, 0] == zero_scale).all() and (st[:B, 0] == zero_scale).all()
    assert (q[:B, :B] == 0).all() and (qt[:B, :B] == 0).all()
    nan_scale = (lambda v: torch.isnan(v)) if recipe == "blockwise_1x128" else (lambda v: v == 0xFF)
    assert nan_scale(s[B + 5, 1]) and nan_scale(st[B + 7, 1]) and nan_scale(s[2 * B + 1, 0]) and nan_scale(st[3, 2])
    assert (q[B + 5, B:2 * B] == 0x7F).all() and (qt[B + 7, B:2 * B] == 0x7F).all()
    assert (qt[3, 2 * B:3 * B] == 0x7F).all()
    # a block without NaN/Inf next to it is untouched
    assert not nan_scale(s[B + 5, 0]) and not nan_scale(st[B + 7, 0])


def test_rowcol_bad_input():
    with pytest.raises(ValueError, match="recipe must be"):
        mok.fp8.quantize_rowcol(torch.randn(4, 4), "blockwise_128x128")
    with pytest.raises(ValueError, match=r"recipe must be 'blockwise_1x128' or 'mxfp8'.*q\.t\(\)"):
        torch.ops.mok.quantize_fp8_rowcol(torch.randn(4, 4), "blockwise_128x128")
    with pytest.raises(ValueError, match="recipe"):
        torch.ops.mok.quantize_fp8_rowcol(torch.randn(4, 4), "fp4")
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        mok.fp8.quantize_rowcol(torch.randn(2, 4, 4), "mxfp8")
    with pytest.raises(ValueError, match=r"\bx\b.*bfloat16"):
        mok.fp8.quantize_rowcol(torch.ones(4, 4, dtype=torch.int32), "mxfp8")
    with pytest.raises(ValueError, match=r"\bx\b.*contiguous"):
        torch.ops.mok.quantize_fp8_rowcol(torch.randn(8, 4).t(), "mxfp8")


def test_rowcol_under_compile():
    x = torch.randn(40, 72, dtype=torch.bfloat16)
    f = torch.compile(lambda t: mok.fp8.quantize_rowcol(t * 2, "mxfp8"), fullgraph=True, backend="eager")
    got, want = f(x), mok.fp8.quantize_rowcol(x * 2, "mxfp8")
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g.view(torch.uint8), w.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_bf16_tile_kernels_large_and_misaligned(recipe):
    # Whole tiles of a model-sized row, a ragged N % 128, and an x whose data starts 2 bytes into its
    # storage (element-wise loads in the tile kernels).
    for shape in [(512, 7168), (136, 264), (1000, 40)]:
        x = _inputs_with_edge_blocks(shape, torch.bfloat16)
        assert_same_quantization(mok.fp8.quantize(x.cuda(), recipe), mok.fp8.quantize(x, recipe), f"{shape}")
    flat = torch.randn(136 * 264 + 1, dtype=torch.bfloat16)
    x = flat[1:].view(136, 264)
    xc = flat.cuda()[1:].view(136, 264)
    assert xc.data_ptr() % 16 != 0
    assert_same_quantization(mok.fp8.quantize(xc, recipe), mok.fp8.quantize(x, recipe), "misaligned")
    if recipe in ROWCOL_RECIPES:
        rc = mok.fp8.quantize_rowcol(xc, recipe)
        assert_same_quantization((rc.q, rc.scales), mok.fp8.quantize(x, recipe), "rowcol misaligned")
        assert_same_quantization((rc.qt, rc.scales_t), mok.fp8.quantize(x.t().contiguous(), recipe),
                                 "rowcol misaligned, column-wise")
        x = _inputs_with_edge_blocks((512, 7168), torch.bfloat16)
        rc = mok.fp8.quantize_rowcol(x.cuda(), recipe)
        assert_same_quantization((rc.q, rc.scales), mok.fp8.quantize(x, recipe), "rowcol 512 x 7168")
        assert_same_quantization((rc.qt, rc.scales_t), mok.fp8.quantize(x.t().contiguous(), recipe),
                                 "rowcol 512 x 7168, column-wise")


@pytest.mark.gpu
@pytest.mark.parametrize("strip", ["4", "8"])
@pytest.mark.parametrize("recipe", ROWCOL_RECIPES)
def test_cuda_rowcol_strip_kernel_matches_the_c_core(monkeypatch, recipe, strip):
    # MOK_QUANT_ROWCOL_STRIP=4 or 8 (read per call; v43, MXFP8's default on large tensors since v44): one CTA per strip of tiles down M,
    # the column scales staged and written per strip. Shapes: one tile, ragged edges and last strips
    # (M not a multiple of 128 * strip), misaligned rows (N % 8 != 0: element-wise loads), and many
    # strips. Outputs land in memory filled with 0xA5 first: a byte never written shows.
    monkeypatch.setenv("MOK_QUANT_ROWCOL_STRIP", strip)
    for shape in [(1, 8), (130, 264), (300, 77), (2100, 136), (4000, 4104)] + _random_shapes(2):
        junk = torch.full((1 << 25,), 0xA5, dtype=torch.uint8, device="cuda")
        del junk
        x = _inputs_with_edge_blocks(shape, torch.bfloat16)
        rc = mok.fp8.quantize_rowcol(x.cuda(), recipe)
        assert_same_quantization((rc.q, rc.scales), mok.fp8.quantize(x, recipe), f"{shape} row-wise")
        assert_same_quantization((rc.qt, rc.scales_t), mok.fp8.quantize(x.t().contiguous(), recipe),
                                 f"{shape} column-wise")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ROWCOL_RECIPES)
def test_rowcol_gather_gives_the_rowcol_of_the_gathered_rows(device, recipe, monkeypatch):
    # torch.ops.mok.quantize_fp8_rowcol_gather(x, src, w, K) = quantize_rowcol(gather_rows(x, src, w, K)),
    # bit for bit, with and without w: padding rows, K = 1, T = 1, R = 0, ragged R and N (N % 8 != 0:
    # element-wise loads), rows repeated, bf16 (the CUDA kernel) and fp32 (the composition). On CUDA for
    # each walk of the tiles too (MOK_QUANT_GATHER_BAND: row-major, bands of 1 and 3 tile columns, v51),
    # and with the experimental streamed 1 x 128 kernel (MOK_QUANT_ROWCOL_STREAM=1; MXFP8 and unaligned
    # rows keep the per-tile one).
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    for T, K, R, N, dtype in [(1, 1, 1, 8, torch.bfloat16), (7, 1, 130, 264, torch.bfloat16),
                              (40, 8, 300, 77, torch.bfloat16), (300, 2, 1000, 1000, torch.bfloat16),
                              (513, 8, 4100, 2048, torch.bfloat16), (20, 4, 0, 128, torch.bfloat16),
                              (33, 2, 70, 136, torch.float32)]:
        x = _inputs_with_edge_blocks((T, N), dtype).to(device)
        src, w = make_gather_case(T, K, R, device, gen)
        for wt in (None, w):
            want = mok.fp8.quantize_rowcol(torch.ops.mok.gather_rows(x, src, wt, K), recipe)
            for band, stream in BAND_STREAM_CASES if device == "cuda" else (("", ""),):
                monkeypatch.setenv("MOK_QUANT_GATHER_BAND", band)
                monkeypatch.setenv("MOK_QUANT_ROWCOL_STREAM", stream)
                got = torch.ops.mok.quantize_fp8_rowcol_gather(x, src, wt, K, recipe)
                for name, u, v in zip(("q", "scales", "qt", "scales_t"), got, want):
                    assert u.shape == v.shape and u.dtype == v.dtype, (name, u.shape, v.shape)
                    assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)), \
                        f"T={T} K={K} R={R} N={N} weighted={wt is not None} band={band!r} stream={stream!r}: {name}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ROWCOL_RECIPES)
def test_rowcol_scales_t_mn_major_is_the_transpose(device, recipe, monkeypatch):
    # scales_t_mn_major=True (the FP8 weight gradient's operand layout, written by the kernel itself):
    # q, scales and qt unchanged, scales_t the transpose of the default one, bit for bit; plain and
    # gathered rows; ragged and misaligned shapes; with the strip kernel forced (MOK_QUANT_ROWCOL_STRIP,
    # MXFP8's default on large tensors) MN-major still takes the per-tile kernel; and with the
    # experimental streamed kernel (MOK_QUANT_ROWCOL_STREAM=1).
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    for M, N in [(1, 8), (130, 264), (300, 77), (136, 96), (4000, 1024)]:
        x = _inputs_with_edge_blocks((M, N), torch.bfloat16).to(device)
        for strip, stream in (("", ""), ("4", ""), ("", "1")) if device == "cuda" else (("", ""),):
            monkeypatch.setenv("MOK_QUANT_ROWCOL_STRIP", strip)
            monkeypatch.setenv("MOK_QUANT_ROWCOL_STREAM", stream)
            want = torch.ops.mok.quantize_fp8_rowcol(x, recipe)
            got = torch.ops.mok.quantize_fp8_rowcol(x, recipe, True)
            src, w = make_gather_case(M, 2, M + 50, device, gen)
            want_g = torch.ops.mok.quantize_fp8_rowcol_gather(x, src, w, 2, recipe)
            got_g = torch.ops.mok.quantize_fp8_rowcol_gather(x, src, w, 2, recipe, True)
            for g, v, what in ((got, want, "plain"), (got_g, want_g, "gathered")):
                for name, a, b in zip(("q", "scales", "qt"), g[:3], v[:3]):
                    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{M}x{N} {what} {name}"
                assert torch.equal(g[3].view(torch.uint8), v[3].t().contiguous().view(torch.uint8)), \
                    f"{M}x{N} {what} scales_t"


@pytest.mark.parametrize("device", DEVICES)
def test_rowcol_column_copy_in_128x128_tiles(device, monkeypatch):
    # col_recipe="blockwise_128x128" (v50): q and scales are blockwise_1x128's, (qt, scales_t) bit for bit
    # quantize(x^T, "blockwise_128x128") (the C core's definition; on CUDA the same rowcol kernel, one
    # scale per tile); scales_t_mn_major gives their transpose; plain and gathered (weighted) rows;
    # ragged, one-row and misaligned shapes, edge blocks (zeros, NaN, Inf, saturation); the strip kernel
    # forced still takes the per-tile kernel.
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    col = "blockwise_128x128"
    for M, N in [(1, 8), (130, 264), (300, 77), (136, 96), (2000, 1024)]:
        x = _inputs_with_edge_blocks((M, N), torch.bfloat16).to(device)
        row = mok.fp8.quantize(x, "blockwise_1x128")
        want_t = mok.fp8.quantize(x.t().contiguous(), col)
        src, w = make_gather_case(M, 2, M + 50, device, gen)
        xg = torch.ops.mok.gather_rows(x, src, w, 2)
        row_g, want_tg = mok.fp8.quantize(xg, "blockwise_1x128"), mok.fp8.quantize(xg.t().contiguous(), col)
        for strip, stream in (("", ""), ("4", ""), ("", "1")) if device == "cuda" else (("", ""),):
            monkeypatch.setenv("MOK_QUANT_ROWCOL_STRIP", strip)
            monkeypatch.setenv("MOK_QUANT_ROWCOL_STREAM", stream)
            for mn in (False, True):
                got = torch.ops.mok.quantize_fp8_rowcol(x, "blockwise_1x128", mn, col)
                got_g = torch.ops.mok.quantize_fp8_rowcol_gather(x, src, w, 2, "blockwise_1x128", mn, col)
                for g, r, t, what in ((got, row, want_t, "plain"), (got_g, row_g, want_tg, "gathered")):
                    want = (r[0], r[1], t[0], t[1].t().contiguous() if mn else t[1])
                    for name, a, b in zip(("q", "scales", "qt", "scales_t"), g, want):
                        assert a.shape == b.shape, (M, N, what, mn, name, a.shape, b.shape)
                        assert a.stride()[-1] == 1, (M, N, what, mn, name, a.stride())
                        assert torch.equal(a.view(torch.uint8), b.reshape(-1).view(torch.uint8).view(a.view(torch.uint8).shape)), \
                            f"{M}x{N} {what} mn={mn} {name}"
    rc = mok.fp8.quantize_rowcol(x, "blockwise_1x128", col)
    assert rc.scales_t.shape == (-(-x.shape[1] // 128), -(-x.shape[0] // 128))


@pytest.mark.parametrize("device", DEVICES)
def test_rowcol_col_recipe_bad_input_names_the_argument(device):
    x = torch.randn(4, 128, dtype=torch.bfloat16, device=device)
    src = torch.zeros(8, dtype=torch.int32, device=device)
    for recipe, col in (("mxfp8", "blockwise_128x128"), ("blockwise_1x128", "mxfp8"), ("blockwise_1x128", "1x64")):
        with pytest.raises(ValueError, match="col_recipe"):
            torch.ops.mok.quantize_fp8_rowcol(x, recipe, False, col)
        with pytest.raises(ValueError, match="col_recipe"):
            torch.ops.mok.quantize_fp8_rowcol_gather(x, src, None, 2, recipe, False, col)
    with pytest.raises(ValueError, match="col_recipe"):
        mok.fp8_gemm.quantize_rowcol_for_wgrad(x, "mxfp8")


@pytest.mark.parametrize("device", DEVICES)
def test_rowcol_gather_bad_input_names_the_argument(device):
    x = torch.randn(4, 128, dtype=torch.bfloat16, device=device)
    src = torch.zeros(8, dtype=torch.int32, device=device)
    w = torch.ones(4, 2, device=device)
    op = torch.ops.mok.quantize_fp8_rowcol_gather
    with pytest.raises(ValueError, match="src_of_row"):
        op(x, src.long(), w, 2, "blockwise_1x128")
    with pytest.raises(ValueError, match="src_of_row"):
        op(x, src.view(2, 4), w, 2, "blockwise_1x128")
    with pytest.raises(ValueError, match="top_k"):
        op(x, src, None, 0, "blockwise_1x128")
    with pytest.raises(ValueError, match="recipe"):
        op(x, src, w, 2, "blockwise_128x128")
    with pytest.raises(ValueError, match="x"):
        op(x[:, :100:2], src, w, 2, "blockwise_1x128")
    with pytest.raises(ValueError, match="w"):
        op(x, src, w.double(), 2, "blockwise_1x128")
    with pytest.raises(ValueError, match="w"):
        op(x, src, w[:, :1].contiguous(), 2, "blockwise_1x128")


def _rowcol_kernels_launched(x, recipe):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = mok.fp8.quantize_rowcol(x, recipe)
        torch.cuda.synchronize()
    return out, [e.name for e in prof.events() if "quantize_rowcol" in e.name and "kernel" in e.name]


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ROWCOL_RECIPES)
def test_cuda_rowcol_default_kernel_choice_on_a_large_ragged_tensor(monkeypatch, recipe):
    # v44: MXFP8 takes the strip kernel by default once its strips of 4 fill 4 waves (here 33 x 57 strips,
    # over 4 * 3 * 132), 1x128 stays on the per-tile kernel. Both choices must give the bytes of the
    # per-tile kernel (MOK_QUANT_ROWCOL_STRIP=0), which the tests above hold against the C core.
    x = _inputs_with_edge_blocks((16384 + 77, 7168 + 40), torch.bfloat16).cuda()
    monkeypatch.delenv("MOK_QUANT_ROWCOL_STRIP", raising=False)
    got, kernels = _rowcol_kernels_launched(x, recipe)
    if torch.cuda.get_device_properties(0).multi_processor_count <= 132:
        assert len(kernels) == 1 and ("strip" in kernels[0]) == (recipe == "mxfp8"), kernels
    monkeypatch.setenv("MOK_QUANT_ROWCOL_STRIP", "0")
    want, kernels = _rowcol_kernels_launched(x, recipe)
    assert len(kernels) == 1 and "strip" not in kernels[0], kernels
    for name, u, v in zip(("q", "scales", "qt", "scales_t"), got, want):
        assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)), name


@pytest.mark.gpu
def test_cuda_rowcol_is_deterministic_and_leaves_no_gaps():
    # Outputs are fresh tensors: fill the caching allocator with 0xA5 first, so any byte the kernel
    # fails to write shows up as a difference from the C core.
    junk = torch.full((1 << 24,), 0xA5, dtype=torch.uint8, device="cuda")
    del junk
    x = _inputs_with_edge_blocks((300, 1000), torch.bfloat16)
    a = mok.fp8.quantize_rowcol(x.cuda(), "blockwise_1x128")
    b = mok.fp8.quantize_rowcol(x.cuda(), "blockwise_1x128")
    for u, v in zip(a, b):
        assert torch.equal(u.view(torch.uint8), v.view(torch.uint8))
    assert_same_quantization((a.qt, a.scales_t), mok.fp8.quantize(x.t().contiguous(), "blockwise_1x128"), "qt")
