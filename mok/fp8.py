"""FP8 numerics of mok's recipes (the C core on the CPU, CUDA kernels on the GPU, bit-exact with
each other). The blockwise grouped GEMM is mok.fp8_gemm; the layers' recipe="blockwise" runs on
both. MXFP8 has numerics only (no GEMM, no layer recipe yet):

- "blockwise_1x128": E4M3 values, one fp32 scale per 1x128 block along the last dim (activations);
- "blockwise_128x128": E4M3 values, one fp32 scale per 128x128 tile (weights);
- "mxfp8": E4M3 values, one E8M0 scale per 1x32 block, chosen by the RCEIL rule (the smallest power
  of two 2^e with amax / 2^e <= 448).

Conversions round to nearest even and saturate to +-448. An all-zero block gets scale 1 (blockwise)
or 2^-127 (mxfp8); a block holding NaN or Inf gets a NaN scale and NaN codes (0x7F). Each tensor is
quantised along its last dimension, the GEMM's K: a column-wise copy is quantize(x.t().contiguous()),
and quantize_rowcol(x, recipe) makes both copies at once (one read of x on the GPU).
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


def quantize_rowcol(x, recipe):
    """Both FP8 copies a GEMM's forward and backward need from one tensor.

    x [M, N] (bf16, fp16, fp32, fp64); recipe "blockwise_1x128" or "mxfp8" ("blockwise_128x128" has
    the same tile scale both ways: its column-wise copy is simply q.t()). Returns RowCol(q, scales,
    qt, scales_t), bit for bit quantize(x, recipe) and quantize(x.t().contiguous(), recipe):

    - q [M, N] float8_e4m3fn, scales fp32 [M, ceil(N/128)] or uint8 E8M0 [M, ceil(N/32)];
    - qt [N, M] float8_e4m3fn (x quantised along its first dimension, stored transposed), scales_t
      fp32 [N, ceil(M/128)] or uint8 E8M0 [N, ceil(M/32)].

    On the GPU a bf16 x is read once by a fused kernel (other dtypes: two quantisations)."""
    if recipe not in ROWCOL_RECIPES:
        raise ValueError(f"mok: recipe must be one of {ROWCOL_RECIPES}, got {recipe!r}")
    return RowCol(*ops.quantize_fp8_rowcol(x.contiguous(), recipe))
