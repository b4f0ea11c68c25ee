"""mok::transpose_fp8_codes: each [R, C] matrix of 1-byte codes transposed, bit for bit torch's
q.transpose(1, 2).contiguous(), on the CUDA kernel's shapes (R, C multiples of 16, partial 128 x 128
tiles, several matrices) and the fallback's (other sizes, non-contiguous input), and what the blockwise
recipe uses it for: the codes of W^T per expert."""
import pytest
import torch

import mok
from conftest import DEVICES
from mok._ops import ops

SHAPES = [(1, 128, 128), (3, 48, 80), (2, 384, 1296), (4, 1024, 16), (2, 40, 24), (2, 0, 32), (0, 16, 16)]


def random_codes(shape, dtype, device):
    q = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    return q.view(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8], ids=["e4m3", "uint8"])
def test_transpose_is_torchs(device, shape, dtype):
    q = random_codes(shape, dtype, device)
    out = ops.transpose_fp8_codes(q)
    assert out.dtype == dtype and out.shape == (shape[0], shape[2], shape[1]) and out.is_contiguous()
    assert torch.equal(out.view(torch.uint8), q.view(torch.uint8).transpose(1, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_transpose_of_a_non_contiguous_input(device):
    q = random_codes((2, 64, 256), torch.uint8, device)[:, :, 32:160]  # rows of 256 bytes, 128 taken
    assert torch.equal(ops.transpose_fp8_codes(q), q.transpose(1, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "mok"])
def test_transposed_weight_codes_are_the_codes_of_the_transposed_weight(monkeypatch, device, kernel):
    # what the FP8 dgrad reads: the 128 x 128 blocks of W^T are the transposed blocks of W, same scales,
    # whichever makes the transposed codes (mok._fp8_experts.TRANSPOSE_KERNEL)
    monkeypatch.setattr(mok._fp8_experts, "TRANSPOSE_KERNEL", kernel)
    w = torch.randn(3, 256, 384, device=device, dtype=torch.bfloat16)
    qt, st = mok._fp8_experts.transpose_expert_codes(*mok.fp8_gemm.quantize_weight_blockwise(w))
    want_q, want_s = mok.fp8_gemm.quantize_weight_blockwise(w.transpose(1, 2).contiguous())
    assert torch.equal(qt.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(st, want_s)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"mok.transpose_fp8_codes: q must be 3-D"):
        ops.transpose_fp8_codes(torch.zeros(4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"mok.transpose_fp8_codes: q must hold 1-byte codes"):
        ops.transpose_fp8_codes(torch.zeros(1, 4, 4))
