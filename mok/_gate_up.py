"""GEMM1 + SwiGLU of the routed experts as two autograd nodes over one fused kernel.

The kernel (ops.grouped_mm_swiglu) writes h = [gate | up] and act = SwiGLU(h) in one pass. As one
autograd node, its backward held h and the incoming d_act while it ran GEMM1's dgrad and weight
gradient, next to d_h and d_gate_up: [rows, 3I] bf16 more at the layer's peak than the
torchtitan-style baseline, whose separate SwiGLU node frees them first (Mixtral shape: 5.3 against
3.8 GiB). Here the same forward kernel feeds two nodes:

    h   = _GateUp(x, gate_up)    backward: d_h -> d_x (dgrad + combine), d_gate_up (wgrad)
    act = _SwiGLUOf(h, act_raw)  backward: d_act -> d_h = swiglu_backward(h, d_act)

so h and d_act are released when the SwiGLU node is done, before GEMM1's backward allocates.
Same kernels, same bits (tests/test_experts.py compares with the op's own autograd).
"""
import torch

from ._ops import ops


def gate_up_backward(d_h, x, src_of_row, row_of, top_k, gate_up, offsets, x_rows, need_x, need_w, up=None):
    """(d_x, d_gate_up, d_up) from d_h: the dgrad through gate_up summed over each token's rows, and the
    weight gradient over x_rows (the gathered rows the forward read) or x gathered on the fly.
    With up (split weights: gate_up holds the gate rows, up the up rows), d_gate_up and d_up are the
    gate and up halves of the weight gradient; else d_up is None."""
    d_x = d_w = d_up = None
    if need_x:
        if up is None:
            d_rows = ops.grouped_mm(d_h, None, 1, gate_up, offsets, False)
        else:
            d_rows = ops.grouped_mm_gate_up_dgrad(d_h, gate_up, up, offsets)
        d_x = ops.combine(d_rows, row_of, src_of_row, None)  # sum of each token's K rows, fixed order
    if need_w:
        b, b_gather, div = (x_rows, None, 1) if x_rows is not None else (x, src_of_row, top_k)
        if up is None:
            d_w = ops.grouped_mm_wgrad(d_h, b, b_gather, div, offsets)
        else:
            d_w, d_up = ops.grouped_mm_gate_up_wgrad(d_h, b, b_gather, div, offsets)
    return d_x, d_w, d_up


class _GateUp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate_up, src_of_row, row_of, top_k, offsets, x_rows, up):
        act, h = ops.grouped_mm_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows, up)
        ctx.save_for_backward(x, gate_up, src_of_row, row_of, offsets, x_rows, up)
        ctx.top_k = top_k
        # act is SwiGLU(h): its gradient reaches h through _SwiGLUOf, not through this node.
        ctx.mark_non_differentiable(act)
        ctx.set_materialize_grads(False)
        return h, act

    @staticmethod
    def backward(ctx, d_h, _d_act):
        x, gate_up, src_of_row, row_of, offsets, x_rows, up = ctx.saved_tensors
        if d_h is None:
            return (None,) * 8
        need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[7]
        d_x, d_w, d_up = gate_up_backward(d_h.contiguous(), x, src_of_row, row_of, ctx.top_k, gate_up, offsets,
                                          x_rows, ctx.needs_input_grad[0], need_w, up)
        return d_x, d_w, None, None, None, None, None, d_up


class _SwiGLUOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, act):
        ctx.save_for_backward(h)
        return act  # computed from h by GEMM1's epilogue

    @staticmethod
    def backward(ctx, d_act):
        (h,) = ctx.saved_tensors
        return ops.swiglu_backward(h, d_act.contiguous()), None


def gate_up_h_act(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows=None, up=None):
    """(h, act): h [rows, 2I] = rows of x @ gate_up[e]^T, differentiable in x and gate_up, and
    act = SwiGLU(h), not differentiable (its gradient reaches h through _SwiGLUOf, or through
    mok/_down_combine.py's node). With up, gate_up holds the gate rows [E, I, H] and up the up rows
    (torchtitan's w1 and w3), read where they are: the same bits as their concatenation."""
    weights_grad = gate_up.requires_grad or (up is not None and up.requires_grad)
    if not (torch.is_grad_enabled() and (x.requires_grad or weights_grad)):
        act, h = ops.grouped_mm_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows, up)
        return h, act
    return _GateUp.apply(x, gate_up, src_of_row, row_of, top_k, offsets, x_rows, up)


def gate_up_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows=None, up=None):
    """act [rows, I] = SwiGLU(rows of x @ gate_up[e]^T), differentiable in x and gate_up (and up)."""
    h, act = gate_up_h_act(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows, up)
    return _SwiGLUOf.apply(h, act) if h.requires_grad else act
