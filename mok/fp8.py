"""FP8 numerics of mok's recipes (the C core on the CPU, CUDA kernels on the GPU, bit-exact with
each other). The blockwise grouped GEMM is mok.fp8_gemm; the layers' recipe="blockwise" runs on
both. MXFP8 has no FP8 GEMM on Hopper (no block-scaled MMA): its layer recipe runs mok's BF16
GEMMs on operands rounded to the MXFP8 grid by qdq_mxfp8 below (mok/_mxfp8_experts.py). Recipes:

- "blockwise_1x128": E4M3 values, one fp32 scale per 1x128 block along the last dim (activations);
- "blockwise_128x128": E4M3 values, one fp32 scale per 128x128 tile (weights);
- "mxfp8": E4M3 values, one E8M0 scale per 1x32 block, chosen by the RCEIL rule (the smallest power
  of two 2^e with amax / 2^e <= 448).

Conversions round to nearest even and saturate to +-448. An all-zero block gets scale 1 (blockwise)
or 2^-127 (mxfp8); a block holding NaN or Inf gets a NaN scale and NaN codes (0x7F). Each tensor is
quantised along its last dimension, the GEMM's K: a column-wise copy is quantize(x.t().contiguous()),
and quantize_rowcol(x, recipe) makes both copies at once (one read of x on the GPU).

qdq_mxfp8(x) ("quantise-dequantise") gives bf16 copies of a bf16 x holding exactly the values of its
MXFP8 encoding, row-wise (blocks along the last dim) and/or column-wise (blocks along the first
dim, restarting at each expert's first row): bit for bit dequantize(quantize(x, "mxfp8")) rounded
to bf16, a rounding that is exact.
"""
from typing import NamedTuple

import torch

from ._ops import ops

RECIPES = ("blockwise_1x128", "blockwise_128x128", "mxfp8")
ROWCOL_RECIPES = ("blockwise_1x128", "mxfp8")


class RowCol(NamedTuple):
    """Row-wise and column-wise FP8 copies of x [M, N]: (q, scales) = quantize(x) and
    (qt, scales_t) = quantize(x.t().contiguous()), so qt is [N, M]."""

    q: torch.Tensor
    scales: torch.Tensor
    qt: torch.Tensor
    scales_t: torch.Tensor


def quantize(x, recipe):
    """x [M, N] (bf16, fp16, fp32, fp64) -> (q [M, N] float8_e4m3fn, scales): fp32 [M, ceil(N/128)]
    (blockwise_1x128), fp32 [ceil(M/128), ceil(N/128)] (blockwise_128x128) or uint8 E8M0 codes
    [M, ceil(N/32)] (mxfp8)."""
    if recipe not in RECIPES:
        raise ValueError(f"mok: recipe must be one of {RECIPES}, got {recipe!r}")
    return ops.quantize_fp8(x.contiguous(), recipe)


def dequantize(q, scales, recipe):
    """float32 [M, N] = e4m3(q) * (the scale of its block)."""
    if recipe not in RECIPES:
        raise ValueError(f"mok: recipe must be one of {RECIPES}, got {recipe!r}")
    return ops.dequantize_fp8(q, scales, recipe)


def quantize_rowcol(x, recipe, col_recipe=None):
    """Both FP8 copies a GEMM's forward and backward need from one tensor.

    x [M, N] (bf16, fp16, fp32, fp64); recipe "blockwise_1x128" or "mxfp8" ("blockwise_128x128" has
    the same tile scale both ways: its column-wise copy is simply q.t()). Returns RowCol(q, scales,
    qt, scales_t), bit for bit quantize(x, recipe) and quantize(x.t().contiguous(), recipe):

    - q [M, N] float8_e4m3fn, scales fp32 [M, ceil(N/128)] or uint8 E8M0 [M, ceil(N/32)];
    - qt [N, M] float8_e4m3fn (x quantised along its first dimension, stored transposed), scales_t
      fp32 [N, ceil(M/128)] or uint8 E8M0 [N, ceil(M/32)].

    col_recipe (default: recipe): with recipe "blockwise_1x128", "blockwise_128x128" quantises the
    column-wise copy in 128 x 128 tiles instead: qt, scales_t = quantize(x.t().contiguous(),
    "blockwise_128x128"), scales_t fp32 [ceil(N/128), ceil(M/128)] (the FP8 weight gradient's cheaper
    operand, mok.fp8_gemm.quantize_rowcol_for_wgrad).

    On the GPU a bf16 x is read once by a fused kernel (other dtypes: two quantisations)."""
    if recipe not in ROWCOL_RECIPES:
        raise ValueError(f"mok: recipe must be one of {ROWCOL_RECIPES}, got {recipe!r}")
    return RowCol(*ops.quantize_fp8_rowcol(x.contiguous(), recipe, False, col_recipe))


def qdq_mxfp8(x, *, offsets=None, rows=True, cols=False):
    """MXFP8 quantise-dequantise of a bf16 x [M, N]: bf16 [M, N] copies whose elements are the
    values of x's MXFP8 encoding (E4M3 codes times their block's E8M0 scale: quantize(x, "mxfp8")'s
    RCEIL scales, round-to-nearest-even, saturation), so a BF16 GEMM on them with fp32 accumulation
    computes the GEMM of the dequantised MXFP8 operands.

    - rows=True: 1 x 32 blocks along N (the GEMM's K when x is [rows, K]); bit for bit
      dequantize(*quantize(x, "mxfp8"), "mxfp8") rounded to bf16, and that rounding is exact (every
      such value of a bf16 element is a bf16 value). Elements with |x| >= 1.9375 * 2^127 (~3.3e38,
      the top of bf16's range) round to 2^128, i.e. +-Inf, as in the fp32 dequantisation.
    - cols=True: 32 x 1 blocks along M, i.e. the quantisation of x^T stored back untransposed (the
      operand of a weight gradient, whose contraction runs over rows). With offsets ([E + 1] int32, a
      plan's expert offsets) the blocks restart at each offsets[e] and the last block of an expert
      may be partial; rows outside [offsets[0], offsets[E]) come out as +0. Without offsets, one
      segment [0, M). A plan padded to 32 or 128 rows gives the same values on its tokens' rows as an
      unpadded one (padding rows are zero and do not change an amax).

    A block holding NaN or Inf becomes NaN in every element (its scale is the NaN code). On CUDA one
    kernel reads x once for both copies; it needs every offsets[e] in [0, M] and a multiple of 32
    or M itself (mok's CUDA plans are 128-aligned): otherwise nothing is written and
    mok.check_errors() raises (the offsets live on the GPU, and checking them here would
    synchronise).

    Returns the copy asked for, or (rows, cols) when both are."""
    if not (rows or cols):
        raise ValueError("mok: qdq_mxfp8 needs rows=True or cols=True")
    r, c = ops.qdq_mxfp8(x.contiguous(), offsets, bool(rows), bool(cols))
    if rows and cols:
        return r, c
    return r if rows else c
