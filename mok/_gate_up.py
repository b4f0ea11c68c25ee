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


def gate_up_backward(d_h, x, src_of_row, row_of, top_k, gate_up, offsets, x_rows, need_x, need_w):
    """(d_x, d_gate_up) from d_h: the dgrad through gate_up summed over each token's rows, and the
    weight gradient over x_rows (the gathered rows the forward read) or x gathered on the fly."""
    d_x = d_w = None
    if need_x:
        d_rows = ops.grouped_mm(d_h, None, 1, gate_up, offsets, False)
        d_x = ops.combine(d_rows, row_of, src_of_row, None)  # sum of each token's K rows, fixed order
    if need_w:
        if x_rows is not None:
            d_w = ops.grouped_mm_wgrad(d_h, x_rows, None, 1, offsets)
        else:
            d_w = ops.grouped_mm_wgrad(d_h, x, src_of_row, top_k, offsets)
    return d_x, d_w


class _GateUp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate_up, src_of_row, row_of, top_k, offsets, x_rows):
        act, h = ops.grouped_mm_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows)
        ctx.save_for_backward(x, gate_up, src_of_row, row_of, offsets, x_rows)
        ctx.top_k = top_k
        # act is SwiGLU(h): its gradient reaches h through _SwiGLUOf, not through this node.
        ctx.mark_non_differentiable(act)
        ctx.set_materialize_grads(False)
        return h, act

    @staticmethod
    def backward(ctx, d_h, _d_act):
        x, gate_up, src_of_row, row_of, offsets, x_rows = ctx.saved_tensors
        if d_h is None:
            return (None,) * 7
        d_x, d_w = gate_up_backward(d_h.contiguous(), x, src_of_row, row_of, ctx.top_k, gate_up, offsets, x_rows,
                                    ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return d_x, d_w, None, None, None, None, None


class _SwiGLUOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, act):
        ctx.save_for_backward(h)
        return act  # computed from h by GEMM1's epilogue

    @staticmethod
    def backward(ctx, d_act):
        (h,) = ctx.saved_tensors
        return ops.swiglu_backward(h, d_act.contiguous()), None


def gate_up_h_act(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows=None):
    """(h, act): h [rows, 2I] = rows of x @ gate_up[e]^T, differentiable in x and gate_up, and
    act = SwiGLU(h), not differentiable (its gradient reaches h through _SwiGLUOf, or through
    mok/_down_combine.py's node)."""
    if not (torch.is_grad_enabled() and (x.requires_grad or gate_up.requires_grad)):
        act, h = ops.grouped_mm_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows)
        return h, act
    return _GateUp.apply(x, gate_up, src_of_row, row_of, top_k, offsets, x_rows)


def gate_up_swiglu(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows=None):
    """act [rows, I] = SwiGLU(rows of x @ gate_up[e]^T), differentiable in x and gate_up."""
    h, act = gate_up_h_act(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows)
    return _SwiGLUOf.apply(h, act) if h.requires_grad else act
