"""recipe="mxfp8" on Hopper as an exact emulation: the MXFP8 quantise-dequantise op (mok.fp8.qdq_mxfp8)
bit for bit against the composition of mok.fp8's quantize / dequantize and against mok.reference (an
independent implementation), on the CPU (the C core) and on CUDA (against the CPU op)."""
import pytest
import torch

import mok
from mok import reference as R
from mok._ops import ops

from conftest import DEVICES
from shapes import MoECase, make_moe_inputs

BF16_MAX = float.fromhex("0x1.fep127")


# ------------------------------------------------------------------------------------------------
# the qdq op
# ------------------------------------------------------------------------------------------------


def _dequantized(x):
    """float32 dequantize(quantize(x, "mxfp8")) by the C core (row-wise)."""
    return mok.fp8.dequantize(*mok.fp8.quantize(x, "mxfp8"), "mxfp8")


def _reference_rows(x):
    """The same by mok.reference (torch's float8 dtypes): an independent implementation."""
    return R.dequantize_fp8(*R.quantize_fp8(x, "mxfp8"), "mxfp8")


def _segments(offsets, M):
    off = [0, M] if offsets is None else [int(v) for v in offsets]
    return off[0], off[-1], list(zip(off[:-1], off[1:]))


def _want_cols(x, offsets, rows_of=_dequantized):
    """float32 column-wise qdq by the segment rule: each segment's transpose quantised row-wise."""
    M, N = x.shape
    lo, hi, segs = _segments(offsets, M)
    want = torch.zeros(M, N)
    for a, b in segs:
        if b > a:
            want[a:b] = rows_of(x[a:b].t().contiguous()).t()
    return want


def assert_qdq_equal(got, want, what=""):
    """got (bf16) equals want (float32) bit for bit, NaN where want is NaN (-0 and +0 distinguished)."""
    got = got.cpu()
    assert got.dtype == torch.bfloat16 and got.shape == want.shape, what
    g = got.float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(g), nan), f"{what}: NaN positions differ"
    assert torch.equal(g[~nan].view(torch.int32), want[~nan].view(torch.int32)), f"{what}: values differ"


def _edge_inputs(M, N, seed=None):
    """bf16 [M, N]: rows of very different magnitudes (2^-133 .. bf16's largest), zeros and -0,
    a NaN, +-Inf, saturating blocks, and random bit patterns."""
    g = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, ()).item()))
    mag = torch.pow(2.0, torch.randint(-133, 120, (M, 1), generator=g).double())
    x = (torch.randn(M, N, generator=g, dtype=torch.float64) * mag).clamp(-BF16_MAX, BF16_MAX)
    x.view(-1)[::7] = 0
    x.view(-1)[3::11] = -0.0
    if M >= 8 and N >= 2:
        x[0] = 0  # zero blocks
        x[1, N // 2] = float("nan")
        x[2, 0] = float("inf")
        x[3, -1] = float("-inf")
        x[4] = torch.where(torch.rand(N, generator=g) < 0.5, -BF16_MAX, BF16_MAX)  # Inf after qdq
        x[5] = torch.randn(N, generator=g, dtype=torch.float64) * 2.0**-130  # bf16 subnormals
        x[6, ::4] = 448.0 * 2.0**100  # saturation and ties next to a big amax
    x = x.bfloat16()
    if M >= 16:
        # every bf16 bit pattern is fair game (NaN and Inf patterns included)
        x[8:16] = torch.randint(0, 1 << 16, (8, N), generator=g, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return x


QDQ_SHAPES = [(1, 1), (1, 32), (3, 33), (32, 64), (70, 75), (129, 256), (200, 8), (64, 0), (0, 64), (300, 96)]


@pytest.mark.parametrize("shape", QDQ_SHAPES, ids=str)
def test_qdq_rows_and_cols_equal_dequantize_of_quantize(shape):
    x = _edge_inputs(*shape)
    r, c = mok.fp8.qdq_mxfp8(x, rows=True, cols=True)
    assert_qdq_equal(r, _dequantized(x), "rows vs the C core")
    assert_qdq_equal(r, _reference_rows(x), "rows vs mok.reference")
    assert_qdq_equal(c, _want_cols(x, None), "cols vs the C core")
    assert_qdq_equal(c, _want_cols(x, None, _reference_rows), "cols vs mok.reference")
    # the single-copy calls give the same copies
    assert torch.equal(mok.fp8.qdq_mxfp8(x).view(torch.int16), r.view(torch.int16))
    assert torch.equal(mok.fp8.qdq_mxfp8(x, rows=False, cols=True).view(torch.int16), c.view(torch.int16))


def test_qdq_values_are_exact_in_bf16():
    # The claim the recipe rests on: for bf16 inputs, e4m3(code) * 2^e is a bf16 value, so the bf16
    # qdq equals the fp32 dequantisation bit for bit. (csrc/core/tests/test_core.c proves it for every
    # bf16 element and every scale; here: 8192 random blocks, magnitudes 2^-133 .. 2^127, random bit
    # patterns, zeros.)
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    blocks = torch.randn(8192, 32, generator=g, dtype=torch.float64)
    blocks *= torch.pow(2.0, torch.randint(-133, 128, (8192, 1), generator=g).double())
    blocks *= torch.pow(2.0, torch.randint(-8, 1, (8192, 32), generator=g).double())  # spread inside a block
    blocks = blocks.clamp(-BF16_MAX, BF16_MAX).bfloat16()
    bits = torch.randint(0, 1 << 16, (2048, 32), generator=g, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    bits = bits[torch.isfinite(bits.float()).all(1)]
    zeros = torch.zeros(4, 32, dtype=torch.bfloat16)
    x = torch.cat([blocks, bits, zeros])
    d = _dequantized(x)
    finite = torch.isfinite(d)
    assert finite.float().mean() > 0.99
    assert torch.equal(d.bfloat16().float()[finite].view(torch.int32), d[finite].view(torch.int32))
    assert_qdq_equal(mok.fp8.qdq_mxfp8(x), d)
    # the one overflow: elements >= 1.9375 * 2^127 round to 2^128 = Inf, in fp32 as in bf16
    top = torch.tensor([[BF16_MAX, float.fromhex("0x1.f0p127"), float.fromhex("0x1.e0p127"), -BF16_MAX]]).bfloat16()
    q = mok.fp8.qdq_mxfp8(top).float()
    assert q[0, 0] == float("inf") and q[0, 1] == float("inf") and q[0, 3] == float("-inf")
    assert q[0, 2] == float.fromhex("0x1.e0p127")
    assert_qdq_equal(mok.fp8.qdq_mxfp8(top), _dequantized(top))


def test_qdq_nan_and_inf_blocks_become_nan():
    # A block holding NaN or Inf has the NaN scale and NaN codes: every element of it becomes NaN
    # (the quiet NaN 0x7FC0), in the row-wise and the column-wise copy; other blocks are untouched.
    x = torch.randn(64, 64).bfloat16()
    x[5, 40] = float("nan")
    x[40, 3] = float("inf")
    r, c = mok.fp8.qdq_mxfp8(x, rows=True, cols=True)
    rb, cb = r.view(torch.int16), c.view(torch.int16)
    assert (rb[5, 32:64] == 0x7FC0).all() and not torch.isnan(r[5, :32].float()).any()
    assert (rb[40, 0:32] == 0x7FC0).all() and not torch.isnan(r[40, 32:].float()).any()
    assert (cb[0:32, 40] == 0x7FC0).all() and not torch.isnan(c[32:, 40].float()).any()
    assert (cb[32:64, 3] == 0x7FC0).all() and not torch.isnan(c[:32, 3].float()).any()
    assert torch.isnan(r.float()).sum() == 64 and torch.isnan(c.float()).sum() == 64


def test_qdq_cols_restart_at_each_expert():
    # ragged segments: rows 0-2 and 130-139 outside every expert (zeros), an empty expert, a one-row
    # expert, partial last blocks, an expert of more than two blocks
    x = _edge_inputs(140, 72)
    for offsets in ([3, 3, 40, 41, 120, 130], [0, 140], [0, 0, 0], [5, 5], [0, 32, 64, 96, 128, 140]):
        off = torch.tensor(offsets, dtype=torch.int32)
        c = mok.fp8.qdq_mxfp8(x, offsets=off, rows=False, cols=True)
        assert_qdq_equal(c, _want_cols(x, offsets), f"offsets {offsets}")
        assert_qdq_equal(c, _want_cols(x, offsets, _reference_rows), f"offsets {offsets} vs mok.reference")
        lo, hi = offsets[0], offsets[-1]
        assert (c[:lo].view(torch.int16) == 0).all() and (c[hi:].view(torch.int16) == 0).all()
    # a block's rows: rows 3..34 of the first non-empty expert form one block, 35..39 the next
    x = torch.ones(140, 8).bfloat16()
    x[10, 0] = 1000.0  # the block's amax: scale 4, so 1 -> 1 (exact); the next block keeps scale 2^-8
    c = mok.fp8.qdq_mxfp8(x, offsets=torch.tensor([3, 40, 140], dtype=torch.int32), rows=False, cols=True)
    assert c[10, 0] == 1024.0 and c[3, 0] == 1.0 and c[35, 0] == 1.0


def test_qdq_padded_plan_equals_unpadded():
    # CUDA plans pad each expert to 128 rows with zero rows; the values on the tokens' rows are those
    # of the unpadded (CPU) plan.
    case = MoECase(90, 64, 32, 5, 2, "zipf")
    x, idx, *_ = make_moe_inputs(case, torch.bfloat16)
    p1 = mok.functional.moe_plan(idx, case.E, tile=1)
    p128 = mok.functional.moe_plan(idx, case.E, tile=128)
    rows1 = ops.gather_rows(x, p1.src_of_row, None, case.K)
    rows128 = ops.gather_rows(x, p128.src_of_row, None, case.K)
    c1 = mok.fp8.qdq_mxfp8(rows1, offsets=p1.offsets, rows=False, cols=True)
    c128 = mok.fp8.qdq_mxfp8(rows128, offsets=p128.offsets, rows=False, cols=True)
    pairs = p1.row_of.flatten().long()
    assert torch.equal(c1[pairs].view(torch.int16), c128[p128.row_of.flatten().long()].view(torch.int16))


def test_qdq_errors_name_the_argument():
    x = torch.randn(64, 64).bfloat16()
    with pytest.raises(ValueError, match=r"\bx\b.*BFloat16"):
        mok.fp8.qdq_mxfp8(x.float())
    with pytest.raises(ValueError, match=r"\bx\b.*2-D"):
        mok.fp8.qdq_mxfp8(x.view(-1))
    with pytest.raises(ValueError, match=r"\bx\b.*contiguous"):
        ops.qdq_mxfp8(x.t(), None, True, False)
    with pytest.raises(ValueError, match="rows.*cols"):
        mok.fp8.qdq_mxfp8(x, rows=False)
    with pytest.raises(ValueError, match="rows and cols"):
        ops.qdq_mxfp8(x, None, False, False)
    with pytest.raises(ValueError, match=r"offsets.*Int"):
        mok.fp8.qdq_mxfp8(x, offsets=torch.tensor([0, 64]), cols=True)
    with pytest.raises(ValueError, match=r"offsets.*1-D"):
        mok.fp8.qdq_mxfp8(x, offsets=torch.zeros(2, 2, dtype=torch.int32), cols=True)
    with pytest.raises(ValueError, match=r"offsets.*E \+ 1 >= 1"):
        mok.fp8.qdq_mxfp8(x, offsets=torch.zeros(0, dtype=torch.int32), cols=True)
    with pytest.raises(ValueError, match=r"offsets.*non-decreasing.*offsets\[2\] = 10"):
        mok.fp8.qdq_mxfp8(x, offsets=torch.tensor([0, 32, 10], dtype=torch.int32), cols=True)
    with pytest.raises(ValueError, match=r"offsets.*non-negative"):
        mok.fp8.qdq_mxfp8(x, offsets=torch.tensor([-1, 32], dtype=torch.int32), cols=True)
    with pytest.raises(ValueError, match=r"offsets\[E\].*64.*65"):
        mok.fp8.qdq_mxfp8(x, offsets=torch.tensor([0, 65], dtype=torch.int32), cols=True)


@pytest.mark.parametrize("device", DEVICES)
def test_qdq_opcheck(device):
    x = torch.randn(70, 96, device=device).bfloat16()
    off = torch.tensor([0, 32, 32, 64], dtype=torch.int32, device=device)
    for args in ((x, None, True, False), (x, None, False, True), (x, off, True, True), (x[:0], off[:1], True, True)):
        torch.library.opcheck(ops.qdq_mxfp8.default, args)


def test_qdq_under_compile():
    x = torch.randn(40, 96, dtype=torch.bfloat16)
    off = torch.tensor([0, 7, 40], dtype=torch.int32)
    f = torch.compile(lambda t: mok.fp8.qdq_mxfp8(t * 2, offsets=off, rows=True, cols=True), fullgraph=True,
                      backend="eager")
    for got, want in zip(f(x), mok.fp8.qdq_mxfp8(x * 2, offsets=off, rows=True, cols=True)):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


# ------------------------------------------------------------------------------------------------
# CUDA qdq
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", QDQ_SHAPES + [(1000, 40), (512, 7168), (257, 2050), (4096, 1536)], ids=str)
def test_cuda_qdq_matches_the_cpu_op_bit_for_bit(shape):
    junk = torch.full((1 << 24,), 0x5A5A, dtype=torch.int16, device="cuda")  # poison the allocator
    del junk
    x = _edge_inputs(*shape)
    M = shape[0]
    offsets = [0, M] if M < 64 else [0, 32, 32, 64 * (M // 64)]  # multiples of 32; an empty expert
    offsets = torch.tensor(offsets, dtype=torch.int32)
    for off in (None, offsets):
        want = mok.fp8.qdq_mxfp8(x, offsets=off, rows=True, cols=True)
        for rows, cols in ((True, True), (True, False), (False, True)):
            got = ops.qdq_mxfp8(x.cuda(), None if off is None else off.cuda(), rows, cols)
            for g, w, asked in zip(got, want, (rows, cols)):
                if asked:
                    assert torch.equal(g.cpu().view(torch.int16), w.view(torch.int16)), f"{shape} {rows} {cols}"
                else:
                    assert g.numel() == 0
    mok.check_errors(synchronize=True)


@pytest.mark.gpu
def test_cuda_qdq_unaligned_pointer_and_rows():
    # element-wise loads and stores: x starting 2 bytes into its storage, and N % 8 != 0
    flat = _edge_inputs(1, 136 * 264 + 1).view(-1)
    x = flat[1:].view(136, 264)
    xc = flat.cuda()[1:].view(136, 264)
    assert xc.data_ptr() % 16 != 0
    for got, want in zip(mok.fp8.qdq_mxfp8(xc, rows=True, cols=True), mok.fp8.qdq_mxfp8(x, rows=True, cols=True)):
        assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
    x = _edge_inputs(100, 77)
    for got, want in zip(mok.fp8.qdq_mxfp8(x.cuda(), rows=True, cols=True), mok.fp8.qdq_mxfp8(x, rows=True, cols=True)):
        assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_cuda_qdq_reports_a_misaligned_offset():
    mok.check_errors(synchronize=True)
    x = torch.randn(128, 64, device="cuda").bfloat16()
    off = torch.tensor([0, 16, 128], dtype=torch.int32, device="cuda")
    ops.qdq_mxfp8(x, off, True, True)  # no host synchronisation here: the kernel sets the flag
    with pytest.raises(ValueError, match="offsets"):
        mok.check_errors(synchronize=True)
    mok.check_errors(synchronize=True)  # cleared
    ops.qdq_mxfp8(x, off, True, False)  # rows only: the offsets are not read
    mok.check_errors(synchronize=True)
    with pytest.raises(ValueError, match=r"offsets must be on the device of x"):
        ops.qdq_mxfp8(x, off.cpu(), False, True)
