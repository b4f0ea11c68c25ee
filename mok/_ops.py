"""Fake (meta) kernels and autograd formulas of the torch.ops.mok operators.

The schemas and the CPU/CUDA kernels live in csrc/torch/ops.cpp (FP8: quant_ops.cpp,
fp8_gemm_ops.cpp). Every operator that takes part in a forward pass has an autograd formula written
with other mok operators, so a whole training step is a graph of mok kernels with no host
synchronisation. The backward-only operators (route_topk_backward, combine_weight_grad,
swiglu_backward, swiglu_scaled_backward, gather_rows, grouped_mm_wgrad) and the integer plan have
no autograd formula; nor do the FP8 operators (quantize_fp8, dequantize_fp8, and grouped_mm_fp8, which is forward-only until
the FP8 recipe of the layer supplies its backward GEMMs).
"""
import torch

from . import _lib  # noqa: F401  (registers the schemas)

ops = torch.ops.mok

# Row tile of the routing plan: each expert's rows start at a multiple of it, so a GEMM tile of
# 128 rows never straddles two experts. The CPU kernels work row by row and need no padding.
PLAN_TILE = 128


def plan_tile_for(device) -> int:
    return PLAN_TILE if torch.device(device).type == "cuda" else 1


def plan_capacity(num_tokens, top_k, num_experts, tile=PLAN_TILE):
    """Static number of rows of a plan (mok_plan_capacity in csrc/core): an upper bound of
    sum_e round_up(count_e, tile) over every possible routing."""
    pairs = num_tokens * top_k
    if pairs == 0:
        return 0
    rows = pairs + torch.sym_min(num_experts, pairs) * (tile - 1)
    return (rows + tile - 1) // tile * tile


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------------------------------------
# fake kernels: shapes and dtypes only
# ------------------------------------------------------------------------------------------------


@torch.library.register_fake("mok::route_topk")
def _route_topk_fake(logits, bias, top_k, score_func, n_group, topk_group, renormalize, scaling):
    T = logits.shape[0]
    return logits.new_empty((T, top_k)), logits.new_empty((T, top_k), dtype=torch.int32)


@torch.library.register_fake("mok::route_topk_backward")
def _route_topk_backward_fake(grad_w, logits, topk_idx, score_func, renormalize, scaling):
    return torch.empty_like(logits)


@torch.library.register_fake("mok::moe_plan")
def _moe_plan_fake(topk_idx, num_experts, tile, skip_invalid):
    T, K = topk_idx.shape
    cap = plan_capacity(T, K, num_experts, tile)
    new = topk_idx.new_empty
    return new((num_experts,)), new((num_experts + 1,)), new((T, K)), new((cap,)), new((1,))


@torch.library.register_fake("mok::gather_rows")
def _gather_rows_fake(x, src_of_row, w, top_k, row_of=None):
    return x.new_empty((src_of_row.shape[0], x.shape[1]))


@torch.library.register_fake("mok::combine")
def _combine_fake(rows, row_of, src_of_row, w):
    return rows.new_empty((row_of.shape[0], rows.shape[1]))


@torch.library.register_fake("mok::combine_weight_grad")
def _combine_weight_grad_fake(dy, rows, row_of):
    return rows.new_empty(row_of.shape, dtype=_acc_dtype(rows.dtype))


@torch.library.register_fake("mok::swiglu")
def _swiglu_fake(h):
    return h.new_empty((h.shape[0], h.shape[1] // 2))


@torch.library.register_fake("mok::swiglu_backward")
def _swiglu_backward_fake(h, d_act):
    return torch.empty_like(h)


@torch.library.register_fake("mok::swiglu_scaled_backward")
def _swiglu_scaled_backward_fake(h, d_z, src_of_row, w):
    return torch.empty_like(h), torch.empty_like(d_z), h.new_empty((h.shape[0],), dtype=_acc_dtype(h.dtype))


def _grouped_mm_out_shape(a, a_gather, b, trans_b):
    rows = a_gather.shape[0] if a_gather is not None else a.shape[0]
    return rows, (b.shape[1] if trans_b else b.shape[2])


@torch.library.register_fake("mok::grouped_mm")
def _grouped_mm_fake(a, a_gather, a_gather_div, b, offsets, trans_b):
    return a.new_empty(_grouped_mm_out_shape(a, a_gather, b, trans_b))


@torch.library.register_fake("mok::grouped_mm_swiglu")
def _grouped_mm_swiglu_fake(x, src_of_row, row_of, top_k, gate_up, offsets, x_rows=None, up=None):
    R, N = src_of_row.shape[0], gate_up.shape[1] * (2 if up is not None else 1)
    return x.new_empty((R, N // 2)), x.new_empty((R, N))


@torch.library.register_fake("mok::grouped_mm_gate_up_dgrad")
def _grouped_mm_gate_up_dgrad_fake(d_h, gate, up, offsets):
    return d_h.new_empty((d_h.shape[0], gate.shape[2]))


@torch.library.register_fake("mok::grouped_mm_gate_up_wgrad")
def _grouped_mm_gate_up_wgrad_fake(d_h, b, b_gather, b_gather_div, offsets):
    shape = (offsets.shape[0] - 1, d_h.shape[1] // 2, b.shape[1])
    return d_h.new_empty(shape), d_h.new_empty(shape)


@torch.library.register_fake("mok::grouped_mm_mxfp8_a")
def _grouped_mm_mxfp8_a_fake(a, a_gather, a_gather_div, b, offsets, trans_b):
    return a.new_empty(_grouped_mm_out_shape(a, a_gather, b, trans_b))


@torch.library.register_fake("mok::grouped_mm_swiglu_mxfp8_a")
def _grouped_mm_swiglu_mxfp8_a_fake(x, src_of_row, top_k, gate_up, offsets):
    R, N = src_of_row.shape[0], gate_up.shape[1]
    return x.new_empty((R, N // 2)), x.new_empty((R, N))


@torch.library.register_fake("mok::grouped_mm_wgrad")
def _grouped_mm_wgrad_fake(a, b, b_gather, b_gather_div, offsets):
    return a.new_empty((offsets.shape[0] - 1, a.shape[1], b.shape[1]))


FP8_BLOCK = {"blockwise_1x128": 128, "blockwise_128x128": 128, "mxfp8": 32}


def fp8_scale_shape(recipe, M, N):
    B = FP8_BLOCK[recipe]
    rows = (M + B - 1) // B if recipe == "blockwise_128x128" else M
    return rows, (N + B - 1) // B


@torch.library.register_fake("mok::quantize_fp8")
def _quantize_fp8_fake(x, recipe):
    M, N = x.shape
    scale_dtype = torch.uint8 if recipe == "mxfp8" else torch.float32
    return x.new_empty((M, N), dtype=torch.float8_e4m3fn), x.new_empty(fp8_scale_shape(recipe, M, N), dtype=scale_dtype)


@torch.library.register_fake("mok::dequantize_fp8")
def _dequantize_fp8_fake(q, scales, recipe):
    return q.new_empty(q.shape, dtype=torch.float32)


def _col_recipe_of(recipe, col_recipe, op):
    """The column-wise copy's recipe: recipe itself, or with 'blockwise_1x128' also 'blockwise_128x128'."""
    if col_recipe is None or col_recipe == recipe:
        return recipe
    if recipe == "blockwise_1x128" and col_recipe == "blockwise_128x128":
        return col_recipe
    raise ValueError(
        f"{op}: col_recipe must be the recipe or, with recipe='blockwise_1x128', 'blockwise_128x128', got {col_recipe!r}"
    )


@torch.library.register_fake("mok::quantize_fp8_rowcol")
def _quantize_fp8_rowcol_fake(x, recipe, scales_t_mn_major=False, col_recipe=None):
    if recipe not in ("blockwise_1x128", "mxfp8"):
        raise ValueError(f"mok.quantize_fp8_rowcol: recipe must be 'blockwise_1x128' or 'mxfp8', got {recipe!r}")
    col = _col_recipe_of(recipe, col_recipe, "mok.quantize_fp8_rowcol")
    M, N = x.shape
    q, scales = _quantize_fp8_fake(x, recipe)
    scale_dtype = torch.uint8 if recipe == "mxfp8" else torch.float32
    qt = x.new_empty((N, M), dtype=torch.float8_e4m3fn)
    st_shape = fp8_scale_shape(col, N, M)
    if scales_t_mn_major:
        st_shape = st_shape[::-1]
    return q, scales, qt, x.new_empty(st_shape, dtype=scale_dtype)


@torch.library.register_fake("mok::quantize_fp8_rowcol_gather")
def _quantize_fp8_rowcol_gather_fake(x, src_of_row, w, top_k, recipe, scales_t_mn_major=False, col_recipe=None):
    if recipe not in ("blockwise_1x128", "mxfp8"):
        raise ValueError(f"mok.quantize_fp8_rowcol_gather: recipe must be 'blockwise_1x128' or 'mxfp8', got {recipe!r}")
    _col_recipe_of(recipe, col_recipe, "mok.quantize_fp8_rowcol_gather")
    return _quantize_fp8_rowcol_fake(x.new_empty((src_of_row.shape[0], x.shape[1])), recipe, scales_t_mn_major,
                                     col_recipe)


@torch.library.register_fake("mok::swiglu_quantize_fp8")
def _swiglu_quantize_fp8_fake(h, d_act, rows, cols, keep, scales_t_mn_major=False, col_recipe=None):
    if not (rows or cols):
        raise ValueError("mok.swiglu_quantize_fp8: rows and cols are both false: nothing to quantise")
    col = _col_recipe_of("blockwise_1x128", col_recipe, "mok.swiglu_quantize_fp8")
    R, N = h.shape[0], h.shape[1] if d_act is not None else h.shape[1] // 2
    codes, f32 = torch.float8_e4m3fn, torch.float32
    st_shape = fp8_scale_shape(col, N, R)
    if scales_t_mn_major:
        st_shape = st_shape[::-1]
    return (
        h.new_empty((R, N) if keep else (0,)),
        h.new_empty((R, N) if rows else (0,), dtype=codes),
        h.new_empty(fp8_scale_shape("blockwise_1x128", R, N) if rows else (0,), dtype=f32),
        h.new_empty((N, R) if cols else (0,), dtype=codes),
        h.new_empty(st_shape if cols else (0,), dtype=f32),
    )


@torch.library.register_fake("mok::swiglu_scaled_quantize_fp8")
def _swiglu_scaled_quantize_fp8_fake(h, d_z, row_scale, rows, cols, scales_t_mn_major=False, col_recipe=None):
    q, s, qt, st = _swiglu_quantize_fp8_fake(h, d_z, rows, cols, False, scales_t_mn_major, col_recipe)[1:]
    d_s = h.new_empty((h.shape[0],) if d_z is not None else (0,), dtype=_acc_dtype(h.dtype))
    return q, s, qt, st, d_s


@torch.library.register_fake("mok::qdq_mxfp8")
def _qdq_mxfp8_fake(x, offsets, rows, cols):
    if not (rows or cols):
        raise ValueError("mok.qdq_mxfp8: at least one of rows and cols must be true")
    M, N = x.shape
    return x.new_empty((M if rows else 0, N)), x.new_empty((M if cols else 0, N))


@torch.library.register_fake("mok::qdq_mxfp8_gather")
def _qdq_mxfp8_gather_fake(x, src_of_row, w, top_k, offsets, rows, cols):
    if not (rows or cols):
        raise ValueError("mok.qdq_mxfp8_gather: at least one of rows and cols must be true")
    return _qdq_mxfp8_fake(x.new_empty((src_of_row.shape[0], x.shape[1])), offsets, rows, cols)


@torch.library.register_fake("mok::grouped_mm_fp8")
def _grouped_mm_fp8_fake(a, a_scales, b, b_scales, offsets):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16)


@torch.library.register_fake("mok::grouped_mm_fp8_swiglu")
def _grouped_mm_fp8_swiglu_fake(a, a_scales, b, b_scales, offsets):
    R, N = a.shape[0], b.shape[1]
    return a.new_empty((R, N // 2), dtype=torch.bfloat16), a.new_empty((R, N), dtype=torch.bfloat16)


@torch.library.register_fake("mok::grouped_mm_fp8_wgrad")
def _grouped_mm_fp8_wgrad_fake(a, a_scales, b, b_scales, offsets):
    return a.new_empty((offsets.shape[0] - 1, a.shape[0], b.shape[0]), dtype=torch.bfloat16)


def _weight_codes_fake(w, up, op):
    if w.dim() != 3 or w.shape[1] % 128:
        raise ValueError(f"{op}: w must be [E, N, K] with N a multiple of 128, got shape {tuple(w.shape)}")
    if up is not None and up.shape != w.shape:
        raise ValueError(f"{op}: up must have the shape of w {tuple(w.shape)}, got {tuple(up.shape)}")
    E, N, K = w.shape
    N = 2 * N if up is not None else N
    kb = (K + 127) // 128
    codes = dict(dtype=torch.float8_e4m3fn)
    return (w.new_empty((E, N, K), **codes), w.new_empty((E, N // 128, kb), dtype=torch.float32),
            w.new_empty((E, K, N), **codes), w.new_empty((E, kb, N // 128), dtype=torch.float32))


@torch.library.register_fake("mok::quantize_fp8_weight_rowcol")
def _quantize_fp8_weight_rowcol_fake(w, up=None):
    return _weight_codes_fake(w, up, "mok.quantize_fp8_weight_rowcol")


@torch.library.register_fake("mok::quantize_fp8_weight")
def _quantize_fp8_weight_fake(w, up=None):
    return _weight_codes_fake(w, up, "mok.quantize_fp8_weight")[:2]


@torch.library.register_fake("mok::transpose_fp8_codes")
def _transpose_fp8_codes_fake(q):
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1]))


@torch.library.register_fake("mok::grouped_mm_fp8_gate_up_wgrad")
def _grouped_mm_fp8_gate_up_wgrad_fake(a, a_scales, b, b_scales, offsets):
    shape = (offsets.shape[0] - 1, a.shape[0] // 2, b.shape[0])
    return a.new_empty(shape, dtype=torch.bfloat16), a.new_empty(shape, dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# autograd
# ------------------------------------------------------------------------------------------------


def _route_topk_setup(ctx, inputs, output):
    logits, _bias, _k, score_func, _ng, _tg, renormalize, scaling = inputs
    _w, topk_idx = output
    ctx.save_for_backward(logits, topk_idx)
    ctx.score_func, ctx.renormalize, ctx.scaling = score_func, renormalize, scaling


def _route_topk_backward(ctx, grad_w, _grad_idx):
    logits, topk_idx = ctx.saved_tensors
    grad_logits = None
    if grad_w is not None and ctx.needs_input_grad[0]:
        grad_logits = ops.route_topk_backward(
            grad_w.contiguous(), logits, topk_idx, ctx.score_func, ctx.renormalize, ctx.scaling
        )
    return grad_logits, None, None, None, None, None, None, None


torch.library.register_autograd("mok::route_topk", _route_topk_backward, setup_context=_route_topk_setup)


def _combine_setup(ctx, inputs, output):
    rows, row_of, src_of_row, w = inputs
    ctx.save_for_backward(rows, row_of, src_of_row, w)


def _combine_backward(ctx, grad_y):
    rows, row_of, src_of_row, w = ctx.saved_tensors
    grad_y = grad_y.contiguous()
    d_rows = d_w = None
    if ctx.needs_input_grad[0]:
        # Each row has one source pair, so the transpose of the combine is a (weighted) gather.
        d_rows = ops.gather_rows(grad_y, src_of_row, w, row_of.shape[1])
    if w is not None and ctx.needs_input_grad[3]:
        d_w = ops.combine_weight_grad(grad_y, rows, row_of)
    return d_rows, None, None, d_w


torch.library.register_autograd("mok::combine", _combine_backward, setup_context=_combine_setup)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, grad_act):
    (h,) = ctx.saved_tensors
    return ops.swiglu_backward(h, grad_act.contiguous())


torch.library.register_autograd("mok::swiglu", _swiglu_backward, setup_context=_swiglu_setup)


def _grouped_mm_setup(ctx, inputs, output):
    a, a_gather, a_gather_div, b, offsets, trans_b = inputs
    ctx.save_for_backward(a, a_gather, b, offsets)
    ctx.a_gather_div, ctx.trans_b = a_gather_div, trans_b


def _grouped_mm_backward(ctx, grad_out):
    a, a_gather, b, offsets = ctx.saved_tensors
    div, trans_b = ctx.a_gather_div, ctx.trans_b
    grad_out = grad_out.contiguous()
    d_a = d_b = None
    if ctx.needs_input_grad[0]:
        if a_gather is not None:
            raise RuntimeError(
                "mok.grouped_mm: no gradient for a when a_gather is given (rows may repeat); "
                "use mok.ops.grouped_mm_swiglu, which reduces over each token's rows"
            )
        d_a = ops.grouped_mm(grad_out, None, 1, b, offsets, not trans_b)
    if ctx.needs_input_grad[3]:
        if trans_b:  # out = A b^T: d_b[e] = grad_e^T A_e, [N, K]
            d_b = ops.grouped_mm_wgrad(grad_out, a, a_gather, div, offsets)
        else:  # out = A b: d_b[e] = A_e^T grad_e, [K, N]
            rows = a if a_gather is None else ops.gather_rows(a, a_gather, None, div)
            d_b = ops.grouped_mm_wgrad(rows, grad_out, None, 1, offsets)
    return d_a, None, None, d_b, None, None


torch.library.register_autograd("mok::grouped_mm", _grouped_mm_backward, setup_context=_grouped_mm_setup)


def _grouped_mm_swiglu_setup(ctx, inputs, output):
    x, src_of_row, row_of, top_k, gate_up, offsets, x_rows, up = inputs
    _act, h = output
    # x_rows (the gathered copy of x the forward read, when the caller made one) serves the
    # weight gradient; without it the backward gathers x again.
    ctx.save_for_backward(x, src_of_row, row_of, gate_up, offsets, h, x_rows, up)
    ctx.top_k = top_k
    # NOTE: h is returned for backward, and rarely used downstream: leave its gradient None rather
    # than a materialised [R, 2I] tensor of zeros (an allocation, a fill and an extra add pass).
    ctx.set_materialize_grads(False)


def _grouped_mm_swiglu_backward(ctx, grad_act, grad_h):
    from ._gate_up import gate_up_backward

    x, src_of_row, row_of, gate_up, offsets, h, x_rows, up = ctx.saved_tensors
    if grad_act is not None:
        d_h = ops.swiglu_backward(h, grad_act.contiguous())
        if grad_h is not None:
            d_h = d_h + grad_h
    else:
        d_h = grad_h.contiguous() if grad_h is not None else torch.zeros_like(h)
    need_w = ctx.needs_input_grad[4] or (up is not None and ctx.needs_input_grad[7])
    d_x, d_w, d_up = gate_up_backward(d_h, x, src_of_row, row_of, ctx.top_k, gate_up, offsets, x_rows,
                                      ctx.needs_input_grad[0], need_w, up)
    return d_x, None, None, None, d_w, None, None, d_up


torch.library.register_autograd(
    "mok::grouped_mm_swiglu", _grouped_mm_swiglu_backward, setup_context=_grouped_mm_swiglu_setup
)

# Operators every test suite must opcheck (tests/test_opcheck.py fails if one is missing).
ALL_OPS = (
    "route_topk",
    "route_topk_backward",
    "moe_plan",
    "gather_rows",
    "combine",
    "combine_weight_grad",
    "swiglu",
    "swiglu_backward",
    "swiglu_scaled_backward",
    "grouped_mm",
    "grouped_mm_swiglu",
    "grouped_mm_wgrad",
    "grouped_mm_gate_up_dgrad",
    "grouped_mm_gate_up_wgrad",
    "grouped_mm_mxfp8_a",
    "grouped_mm_swiglu_mxfp8_a",
    "quantize_fp8",
    "dequantize_fp8",
    "transpose_fp8_codes",
    "quantize_fp8_weight_rowcol",
    "quantize_fp8_weight",
    "quantize_fp8_rowcol",
    "quantize_fp8_rowcol_gather",
    "swiglu_quantize_fp8",
    "swiglu_scaled_quantize_fp8",
    "grouped_mm_fp8",
    "grouped_mm_fp8_swiglu",
    "grouped_mm_fp8_wgrad",
    "grouped_mm_fp8_gate_up_wgrad",
    "qdq_mxfp8",
    "qdq_mxfp8_gather",
    "device_errors",
)
