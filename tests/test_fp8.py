"""FP8 quantisation (CPU ops on the C core) against mok.reference, an independent implementation
with torch's float8 dtypes: bit-exact codes and scales, on random and edge-case blocks; and the CUDA
kernels against the C core, bit for bit."""
import pytest
import torch

import mok
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
    return x.to(dtype)


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
