"""GEMM2 (the down projection) and the weighted combine of the routed experts as one autograd node,
whose backward takes the router-weight gradient on the width-I side.

Forward, the plain path's kernels: rows = act @ down[e]^T, y[t] = sum_k w[t, k] * rows[row_of[t, k]].
Because rows is linear in act, the same y is the unweighted combine of z @ down[e]^T with
z = s * act, s[r] = the router weight of row r's (token, k) pair. The backward differentiates that
form:

    d_rows = gather(dy)                       unweighted (the token walk: x read once per token)
    d_z    = d_rows @ down[e]                 GEMM2's dgrad
    d_h, z, d_s = swiglu_scaled_backward(h, d_z, s)   one pass over h: d_h for d_act = s * d_z,
                                              d_s[r] = d_z[r] . act[r], and z itself
    d_down = d_rows^T z                       GEMM2's weight gradient
    d_w[t, k] = d_s[row_of[t, k]]

Against the op-by-op autograd (combine, grouped_mm and SwiGLU nodes) this drops the
combine_weight_grad pass over the rows [R, H] and the weighted row-walk gather, and holds only h
from the forward to the backward (not act [R, I] nor rows [R, H]); it adds one [R, I] write (z).
"""
import torch
import torch.nn.functional as F

from ._ops import ops


class _DownCombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, act, down, w, row_of, src_of_row, offsets):
        rows = ops.grouped_mm(act, None, 1, down, offsets, True)
        ctx.save_for_backward(h, down, w, row_of, src_of_row, offsets)
        return ops.combine(rows, row_of, src_of_row, w)

    @staticmethod
    def backward(ctx, dy):
        h, down, w, row_of, src_of_row, offsets = ctx.saved_tensors
        d_rows = ops.gather_rows(dy.contiguous(), src_of_row, None, row_of.shape[1], row_of)
        d_z = ops.grouped_mm(d_rows, None, 1, down, offsets, False)
        d_h, z, d_s = ops.swiglu_scaled_backward(h, d_z, src_of_row, w)
        del d_z
        d_down = ops.grouped_mm_wgrad(d_rows, z, None, 1, offsets) if ctx.needs_input_grad[2] else None
        d_w = pair_grad_of_rows(d_s, row_of) if ctx.needs_input_grad[3] else None
        return d_h, None, d_down, d_w, None, None, None


def pair_grad_of_rows(d_s, row_of):
    """d_w [T, K] = d_s[row_of[t, k]] of a per-row gradient d_s [R]: a skipped pair (row_of -1), like any
    row_of outside [0, R) that the combine skips, reads the zero appended at index R."""
    R = d_s.shape[0]
    return F.pad(d_s, (0, 1))[torch.where((row_of >= 0) & (row_of < R), row_of, R).long()]


def down_combine(h, act, down, w, row_of, src_of_row, offsets):
    """y [T, H] = sum_k w[t, k] * (act @ down[e]^T)[row_of[t, k]]; differentiable in h (through
    SwiGLU: act must be SwiGLU(h) as GEMM1's epilogue wrote it), down and w."""
    if torch.is_grad_enabled() and (h.requires_grad or down.requires_grad or w.requires_grad):
        return _DownCombine.apply(h, act, down, w, row_of, src_of_row, offsets)
    rows = ops.grouped_mm(act, None, 1, down, offsets, True)
    return ops.combine(rows, row_of, src_of_row, w)
