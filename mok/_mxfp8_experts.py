"""The routed experts under recipe="mxfp8" on Hopper: MXFP8 training numerics, exactly, on mok's
BF16 GEMMs.

What MXFP8 training computes (Blackwell's block-scaled MMA, TransformerEngine / torchao's recipe):
every operand of every expert GEMM, forward and backward, is quantised to E4M3 with one E8M0 scale
per 32 consecutive elements along that GEMM's contraction dimension (RCEIL scales, round-to-nearest-
even, saturation), and the GEMM sums the products of the dequantised values in fp32. Hopper has no
block-scaled MMA, and an FP8 MMA promoted every 32 of K runs on the CUDA cores at about the BF16
rate. So here each operand is quantised and dequantised in one pass ("qdq": mok.fp8.qdq_mxfp8,
bf16 in, bf16 out) and the GEMM runs on mok's BF16 kernels with fp32 accumulation. For bf16 inputs
the dequantised values are exactly bf16 values (csrc/core/tests/test_core.c checks every bf16
element with every scale), so the layer computes exactly the GEMMs of the dequantised MXFP8
operands, up to the fp32 summation order: the numerics of MXFP8 training, for studying them (loss
curves, divergence, recipes) on Hopper. Speed is the BF16 path's plus the qdq passes (each a
read of a bf16 tensor and one or two bf16 writes, memory-bound): there is no FP8 speed-up on Hopper.

The six GEMMs and the blocks of their operands (R = the plan's rows, contraction dim in brackets):

    forward  h     [R, 2I] = x_rows [H]  . gate_up[e] [H]       rows of x_rows; gate_up along H
             rows  [R, H]  = act [I]     . down[e] [I]          rows of act; down along I
    dgrad2   d_act [R, I]  = d_rows [H]  . down[e] [H]          rows of d_rows; down along H
    dgrad1   d_xr  [R, H]  = d_h [2I]    . gate_up[e] [2I]      rows of d_h; gate_up along 2I
    wgrad2   d_down[e]     = d_rows^T . act    [expert's rows]  column-wise, blocks per expert
    wgrad1   d_gate_up[e]  = d_h^T . x_rows    [expert's rows]  column-wise, blocks per expert

Row-wise copies: 1 x 32 blocks along the last dim. Column-wise copies of activations and gradients:
32 x 1 blocks along the rows, restarting at each expert's first row (the plan's offsets), the last
block of an expert partial (CPU plans, 1-row tiles) or padded with zero rows (CUDA plans, 128-row
tiles): the same values either way. The weights' column-wise copies are of each expert's [N, K]
matrix along N, i.e. the weight viewed as [E * N, K] with blocks of 32 rows, which never straddle
two experts as N % 32 == 0. Each qdq pass reads its tensor once and writes the copies needed
(x_rows, act, d_rows and d_h give both). The gradient of an operand is taken straight through its
qdq (the usual rule of quantised training), so e.g. d_act is the dgrad of the quantised GEMM2.

SwiGLU and its backward and the combine are the BF16 path's (on the bf16 h, act and gradients); the
router-weight gradient is combine's, sum_h dy * rows with the GEMM2 output rows. The gathers of x_rows
and d_rows are fused into their qdq passes (GATHER_QDQ below).
Weights' qdq copies are kept on the weight tensor and reused while it keeps its storage and version
(an optimizer step bumps the version), as the blockwise recipe's codes; not under torch.compile nor
while a CUDA graph is captured.

gate_up may be a (gate, up) pair of [E, I, H] tensors (torchtitan's w1 and w3): each half's qdq copies
are its own (no MXFP8 block straddles the halves: I % 32 == 0, along H and along each expert's rows)
and cached on it, and the BF16 kernels read them, and write the halves' gradients, as a pair (their
split forms, mok/_gate_up.py): the concatenation's bits without a concatenation. (QDQ_IN_GEMM's kernels
have no split form: there the pair is concatenated per call.)

Shapes: bf16 x and weights, H and I multiples of 32 (whole MXFP8 blocks along every contraction).
"""
import torch

from ._fp8_experts import weight_cache_usable
from ._gate_up import _SwiGLUOf
from ._ops import ops

BLOCK = 32  # the MXFP8 block

# x_rows and d_rows (the combine's weighted gather of dy) are needed only as their qdq copies. True
# (default): the copies straight from x and dy by the plan (torch.ops.mok.qdq_mxfp8_gather: each gathered
# row read once, the bf16 x_rows and d_rows never written; d_rows through _MxDownCombine, GEMM2 and the
# combine as one node); False: the bf16 gathers, then qdq_mxfp8. The same bits either way (performance
# log v48; bench_moe_layer.py's mok_mxfp8_bf16_gather is the False side).
GATHER_QDQ = True

# The row-wise qdq copies of x_rows, act and d_h (the forward GEMMs' and GEMM1's dgrad's A operands):
# False (default): made by the qdq passes and read by the GEMMs; True: never written, the GEMMs round A's
# rows themselves as each K-block arrives (torch.ops.mok.grouped_mm_mxfp8_a / grouped_mm_swiglu_mxfp8_a;
# on sm_90a in the consumer warpgroups), so those passes write only the column-wise copies the weight
# gradients need (none at all without gradients). The same bits either way; d_rows keeps its pass (its
# rows are a weighted gather of dy). Measured slower (performance log v59, H100: 0.78x / 0.83x / 0.82x mok
# BF16 on Qwen3 / Mixtral / DeepSeek-V3 against 0.92x / 1.02x / 0.99x): the GEMM rounds each value of A once
# per N-tile, and that rounding is not hidden under the MMA (v60: likely shared-memory bandwidth, not its
# instructions).
QDQ_IN_GEMM = False


def check_mxfp8_args(x, gate_up_proj, up_proj=None):
    """The recipe's extra conditions, with errors that name the argument (up_proj: the up half of a
    (gate, up) pair, gate_up_proj then the gate [E, I, H])."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"mok: recipe='mxfp8' needs bfloat16 x and weights, got x of dtype {x.dtype}")
    if gate_up_proj.dtype != torch.bfloat16:
        raise ValueError(f"mok: recipe='mxfp8' needs bfloat16 weights, got gate_up_proj of dtype {gate_up_proj.dtype}")
    _E, rows, H = gate_up_proj.shape
    I, i_of = (rows, "gate_up_proj[0].shape[1]") if up_proj is not None else (rows // 2, "gate_up_proj.shape[1] / 2")
    if H % BLOCK or I % BLOCK:
        raise ValueError(
            f"mok: recipe='mxfp8' needs the hidden size H (x.shape[1], gate_up_proj.shape[2]) and the intermediate "
            f"size I ({i_of}) to be multiples of {BLOCK} (whole MXFP8 blocks), got H={H}, I={I}"
        )


def qdq_expert_weight(w, cols):
    """(rows, cols) qdq copies of an expert weight w [E, N, K]: rows along K (the forward GEMM's
    contraction), cols along N per expert (the dgrad's), or None when cols is False. One pass."""
    E, N, K = w.shape
    r, c = ops.qdq_mxfp8(w.detach().reshape(E * N, K), None, True, bool(cols))
    return r.view(E, N, K), (c.view(E, N, K) if cols else None)


_CACHE_ATTR = "_mok_mxfp8_qdq"


def cached_expert_weight(w, cols):
    """qdq_expert_weight(w, cols), kept on w and reused while w keeps its storage and version (a
    cached pair serves a rows-only call too); recomputed under torch.compile (part of the graph) and while
    a CUDA graph is captured (weight_cache_usable)."""
    if not weight_cache_usable():
        return qdq_expert_weight(w, cols)
    key = (w._version, w.data_ptr(), tuple(w.shape), w.device)
    hit = getattr(w, _CACHE_ATTR, None)
    if hit is not None and hit[0] == key and (hit[2] is not None or not cols):
        return hit[1], (hit[2] if cols else None)
    r, c = qdq_expert_weight(w, cols)
    try:
        setattr(w, _CACHE_ATTR, (key, r, c))
    except (AttributeError, RuntimeError):  # a tensor that takes no attributes: no cache
        pass
    return r, c


def _qdq_copies(t, offsets, rows, cols, in_gemm):
    """(row-wise, column-wise) qdq copies of t as qdq_mxfp8 makes them, except that with in_gemm
    (QDQ_IN_GEMM) the row-wise one is not made (None: the GEMM rounds t's rows itself, _mm_of_rows); None
    for a copy not asked for."""
    rows = rows and not in_gemm
    if not (rows or cols):
        return None, None
    r, c = ops.qdq_mxfp8(t, offsets, rows, cols)
    return (r if rows else None), (c if cols else None)


def _mm_of_rows(t, t_rows, b, offsets, trans_b, in_gemm):
    """grouped_mm(qdq_rows(t), b): on the copy t_rows, or (in_gemm) rounding t's rows in the GEMM."""
    if in_gemm:
        return ops.grouped_mm_mxfp8_a(t, None, 1, b, offsets, trans_b)
    return ops.grouped_mm(t_rows, None, 1, b, offsets, trans_b)


class _MxGateUp(torch.autograd.Function):
    """h = qdq(x_rows) @ qdq(gate_up[e])^T, with act = SwiGLU(h) from the same fused kernel (its
    gradient reaches h through _SwiGLUOf, as in mok/_gate_up.py). Backward: d_h (qdq'd both ways in
    one pass) -> d_x = combine(qdq(d_h) @ gate_up_cols[e]) and d_gate_up = qdq_c(d_h)^T qdq_c(x_rows).
    With up (a (gate, up) pair; gate_up the gate): up_rows / up_cols the up half's copies beside w_rows /
    w_cols, the gate's, read as a pair, and the gradient returned as (d_gate, d_up)."""

    @staticmethod
    def forward(ctx, x, gate_up, src_of_row, row_of, top_k, offsets, w_rows, w_cols, need_w, up, up_rows, up_cols):
        # the column-wise copy of x_rows is the weight gradient's operand: made now, from the same read
        # (the backward follows the forward's choice: QDQ_IN_GEMM may change in between)
        ctx.in_gemm = QDQ_IN_GEMM
        if ctx.in_gemm:
            x_c = ops.qdq_mxfp8_gather(x, src_of_row, None, top_k, offsets, False, True)[1] if need_w else None
            act, h = ops.grouped_mm_swiglu_mxfp8_a(x, src_of_row, top_k, w_rows, offsets)
        else:
            if GATHER_QDQ:
                x_r, x_c = ops.qdq_mxfp8_gather(x, src_of_row, None, top_k, offsets, True, need_w)
            else:
                x_rows = ops.gather_rows(x, src_of_row, None, top_k, row_of)
                x_r, x_c = ops.qdq_mxfp8(x_rows, offsets, True, need_w)
                del x_rows
            act, h = ops.grouped_mm_swiglu(x, src_of_row, row_of, top_k, w_rows, offsets, x_r, up_rows)
        ctx.save_for_backward(src_of_row, row_of, offsets, x_c if need_w else None, w_cols, up_cols)
        ctx.split = up is not None
        ctx.mark_non_differentiable(act)
        ctx.set_materialize_grads(False)
        return h, act

    @staticmethod
    def backward(ctx, d_h, _d_act):
        src_of_row, row_of, offsets, x_c, w_cols, up_cols = ctx.saved_tensors
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[9]
        if d_h is None or not (need_x or need_w):
            return (None,) * 12
        d_h = d_h.contiguous()
        d_r, d_c = _qdq_copies(d_h, offsets, need_x, need_w, ctx.in_gemm)
        d_x = d_w = d_up = None
        if need_x:
            # [R, 2I] . [E, 2I, H] -> [R, H], then each token's K rows summed in a fixed order
            if ctx.split:  # (in_gemm never has a pair: experts_mxfp8 concatenates it)
                d_rows = ops.grouped_mm_gate_up_dgrad(d_r, w_cols, up_cols, offsets)
            else:
                d_rows = _mm_of_rows(d_h, d_r, w_cols, offsets, False, ctx.in_gemm)
            d_x = ops.combine(d_rows, row_of, src_of_row, None)
        if need_w:
            if ctx.split:
                d_w, d_up = ops.grouped_mm_gate_up_wgrad(d_c, x_c, None, 1, offsets)  # [E, I, H] each
            else:
                d_w = ops.grouped_mm_wgrad(d_c, x_c, None, 1, offsets)  # [E, 2I, H]
        return (d_x, d_w) + (None,) * 7 + (d_up, None, None)


class _MxDown(torch.autograd.Function):
    """rows = qdq(act) @ qdq(down[e])^T. Backward: d_rows (qdq'd both ways in one pass) ->
    d_act = qdq(d_rows) @ down_cols[e] and d_down = qdq_c(d_rows)^T qdq_c(act)."""

    @staticmethod
    def forward(ctx, act, down, offsets, w_rows, w_cols, need_w):
        a_r, a_c = _qdq_copies(act, offsets, True, need_w, QDQ_IN_GEMM)
        rows = _mm_of_rows(act, a_r, w_rows, offsets, True, QDQ_IN_GEMM)
        ctx.save_for_backward(offsets, a_c if need_w else None, w_cols)
        ctx.set_materialize_grads(False)
        return rows

    @staticmethod
    def backward(ctx, d_rows):
        offsets, a_c, w_cols = ctx.saved_tensors
        need_a, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if d_rows is None or not (need_a or need_w):
            return (None,) * 6
        d_r, d_c = ops.qdq_mxfp8(d_rows.contiguous(), offsets, need_a, need_w)
        d_act, d_w = _down_mx_backward(d_r, d_c, a_c, w_cols, offsets, need_a, need_w)
        return d_act, d_w, None, None, None, None


def _down_mx_backward(d_r, d_c, a_c, w_cols, offsets, need_a, need_w):
    """(d_act, d_down) from d_rows' qdq copies: d_act = qdq(d_rows) @ down_cols[e], d_down = qdq_c(d_rows)^T
    qdq_c(act)."""
    d_act = d_w = None
    if need_a:
        d_act = ops.grouped_mm(d_r, None, 1, w_cols, offsets, False)  # [R, H] . [E, H, I] -> [R, I]
    if need_w:
        d_w = ops.grouped_mm_wgrad(d_c, a_c, None, 1, offsets)  # [E, H, I]
    return d_act, d_w


class _MxDownCombine(torch.autograd.Function):
    """y = combine(qdq(act) @ qdq(down[e])^T, topk_w) as one node (GATHER_QDQ), so that the backward makes
    d_rows' qdq copies straight from dy (the combine's weighted gather fused into the qdq pass: d_rows is
    never written in bf16). Gradients bit for bit those of _MxDown then mok::combine."""

    @staticmethod
    def forward(ctx, act, down, w, offsets, row_of, src_of_row, w_rows, w_cols, need_w):
        a_r, a_c = _qdq_copies(act, offsets, True, need_w, QDQ_IN_GEMM)
        rows = _mm_of_rows(act, a_r, w_rows, offsets, True, QDQ_IN_GEMM)
        ctx.save_for_backward(w, offsets, row_of, src_of_row, rows, a_c if need_w else None, w_cols)
        ctx.set_materialize_grads(False)
        return ops.combine(rows, row_of, src_of_row, w)

    @staticmethod
    def backward(ctx, dy):
        w, offsets, row_of, src_of_row, rows, a_c, w_cols = ctx.saved_tensors
        if dy is None:
            return (None,) * 9
        dy = dy.contiguous()
        need_a, need_down, need_topk_w = ctx.needs_input_grad[:3]
        d_topk_w = ops.combine_weight_grad(dy, rows, row_of) if need_topk_w else None
        d_act = d_down = None
        if need_a or need_down:
            d_r, d_c = ops.qdq_mxfp8_gather(dy, src_of_row, w, row_of.shape[1], offsets, need_a, need_down)
            d_act, d_down = _down_mx_backward(d_r, d_c, a_c, w_cols, offsets, need_a, need_down)
        return (d_act, d_down, d_topk_w) + (None,) * 6


def experts_mxfp8(x, plan, top_k, topk_w, gate_up_proj, down_proj, up_proj=None):
    """y [T, H] bf16 of the routed experts under the MXFP8 recipe (qdq emulation on Hopper).

    x [T, H] bf16; plan: mok.functional.moe_plan(topk_idx, E) (any tile: 1 on the CPU, 128 on CUDA;
    CUDA needs offsets that are multiples of 32); top_k = K; topk_w [T, K] (used in fp32);
    gate_up_proj [E, 2I, H] and down_proj [E, H, I] bf16; H and I multiples of 32 (inputs checked by
    the caller: mok.functional's checks and check_mxfp8_args); up_proj: the up half [E, I, H] of a
    (gate, up) pair, gate_up_proj then the gate. Differentiable in x, topk_w and every weight."""
    x = x.contiguous()
    if up_proj is not None and QDQ_IN_GEMM:  # the GEMMs that round A themselves take one weight
        gate_up_proj, up_proj = torch.cat([gate_up_proj, up_proj], dim=1), None
    grad = torch.is_grad_enabled()
    need_x = grad and x.requires_grad
    need_w1 = grad and (gate_up_proj.requires_grad or (up_proj is not None and up_proj.requires_grad))
    need_w2 = grad and down_proj.requires_grad
    need_act = need_x or need_w1  # act's gradient feeds d_h
    w1_r, w1_c = cached_expert_weight(gate_up_proj, need_x)
    up_r, up_c = cached_expert_weight(up_proj, need_x) if up_proj is not None else (None, None)
    w2_r, w2_c = cached_expert_weight(down_proj, need_act)
    h, act = _MxGateUp.apply(x, gate_up_proj, plan.src_of_row, plan.row_of, top_k, plan.offsets, w1_r, w1_c,
                             need_w1, up_proj, up_r, up_c)
    if need_act:
        act = _SwiGLUOf.apply(h, act)
    del h
    w = topk_w.to(torch.float32).contiguous()
    if GATHER_QDQ:
        return _MxDownCombine.apply(act, down_proj, w, plan.offsets, plan.row_of, plan.src_of_row, w2_r, w2_c,
                                    need_w2)
    rows = _MxDown.apply(act, down_proj, plan.offsets, w2_r, w2_c, need_w2)
    return ops.combine(rows, plan.row_of, plan.src_of_row, w)
