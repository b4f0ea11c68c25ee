"""The routed experts under the "blockwise" FP8 recipe (DeepSeek-V3's scaling): both expert GEMMs
of the forward run on E4M3 operands; the backward's GEMMs in BF16, or in FP8 too: its two dgrad
GEMMs with fp8_dgrad=True, its two weight-gradient GEMMs with fp8_wgrad=True (either or both).

    x_rows = gather(x)                                     bf16 [R, H]
    h, act = FP8GEMM(q(x_rows), Q(gate_up)), SwiGLU(h)      q: 1 x 128 scales, Q: 128 x 128 scales;
                                                            one kernel (SwiGLU in its epilogue)
    rows   = FP8GEMM(q(act), Q(down))
    y      = combine(rows)

What runs in FP8 under each option (every FP8 operand quantised along its GEMM's K, from BF16):

    GEMM                                    default   fp8_dgrad   fp8_wgrad
    forward  h, rows                        FP8       FP8         FP8
    dgrad    d_act = d_rows @ down[e]       BF16      FP8         BF16 (FP8 with fp8_dgrad)
             d_x  <- d_h @ gate_up[e]       BF16      FP8         BF16 (FP8 with fp8_dgrad)
    wgrad    d_down[e]    = d_rows^T act    BF16      BF16        FP8
             d_gate_up[e] = d_h^T x_rows    BF16      BF16        FP8

The default backward is the BF16 path's, on the saved bf16 tensors (x_rows, h, act) and the bf16
weights ("FP8 forward, BF16 backward": the gradients are those of the BF16 formulas at the FP8
forward's activations). fp8_dgrad=True: the two dgrad GEMMs run on the same FP8 kernel, the
incoming gradient quantised 1 x 128 along the GEMM's K, the weight's codes transposed per expert
(a 128 x 128 block of W^T is the transposed block of W with the same scale, so these are exactly the
codes of quantize(W^T)). fp8_wgrad=True: the weight gradients contract over each expert's rows, so
both operands are column-wise copies quantised 1 x 128 along the rows, on the K-grouped FP8 GEMM
(mok.fp8_gemm.grouped_mm_wgrad_blockwise): the forward quantises x_rows and act once with
mok.fp8.quantize_rowcol (the row-wise copy feeds the forward GEMM, the column-wise copy is saved for
the backward instead of the bf16 tensor: about half the bytes); the backward quantises d_h and
d_rows column-wise (with quantize_rowcol when fp8_dgrad needs their row-wise copy as well), giving
d_gate_up [E, 2I, H] = wgrad(col(d_h), col(x_rows)) and d_down [E, H, I] = wgrad(col(d_rows),
col(act)) in bf16. fp8_wgrad="tiled": the same with x_rows' and act's column-wise copies in 128 x 128
tiles (quantize_rowcol_for_wgrad(..., "blockwise_128x128"), one scale per 128 rows x 128 columns; d_h's
and d_rows' stay 1 x 128): the weight-gradient kernel's promotion is then the forward's (one FFMA per
accumulator and K-block instead of an FMUL and an FFMA), 18-46% faster on an H100 (performance log v50),
at the cost of coarser scales for the activations (an element below ~2^-15 of its tile's largest
magnitude becomes an E4M3 subnormal).

With every GEMM in FP8 (fp8_dgrad and fp8_wgrad) the path from x to y is one autograd node whose SwiGLU
writes its result's FP8 copies directly both ways (FUSED_MLP_COMBINE below, v52: no bf16 act or d_h,
lower peak memory); otherwise SwiGLU and each quantisation run as ops of their own (three autograd
nodes), or, opt-in, as v39's one node (FUSED_SWIGLU_QUANT).

Weights are quantised once per version: the codes and scales are cached on the weight tensor and
reused until the tensor changes in place (an optimizer step bumps its version counter) or is
replaced. The cache is skipped under torch.compile (the quantisation is then part of the graph) and
while a CUDA graph is captured (so that each replay quantises the weight as it is then).

gate_up_proj may be a (gate, up) pair of [E, I, H] tensors (torchtitan's w1 and w3, up_proj below): the
codes are those of their concatenation, made from each half (a 128 x 128 block never straddles the two,
I % 128 == 0) and cached on the gate for the pair's versions; the backward writes each half's gradient
into its own tensor (the BF16 kernels' split forms, mok/_gate_up.py, and the FP8 weight gradient's,
grouped_mm_fp8_gate_up_wgrad). The same bits as the concatenated weight, with no copy of it per call.

Shapes: H, I multiples of 128 (whole scale blocks, as the FP8 GEMM needs); bf16 x and weights.
"""
import weakref

import torch
import torch.nn.functional as F

from . import fp8
from ._down_combine import pair_grad_of_rows
from ._gate_up import _SwiGLUOf, gate_up_backward
from ._ops import ops
from .fp8_gemm import BLOCK, quantize_colwise_blockwise, quantize_rowcol_for_wgrad, quantize_weight_blockwise

RECIPES = ("bf16", "blockwise", "mxfp8")  # every recipe of the layers ("mxfp8": mok/_mxfp8_experts.py)
ACT_RECIPE = "blockwise_1x128"


# fp8_wgrad's values: False (BF16 weight gradients), True (FP8, every column-wise copy 1 x 128 along the
# rows: DeepSeek-V3's), "tiled" (FP8, the activations' column-wise copies, x_rows' and act's, in 128 x 128
# tiles; the incoming gradients' stay 1 x 128). "tiled" makes the weight gradient's promotion one FFMA per
# accumulator instead of an FMUL and an FFMA (performance log v50: the FP8 weight gradients 18-46%
# faster); the same single rowcol pass makes either copy.
FP8_WGRAD_VALUES = (False, True, "tiled")


def wgrad_act_col_recipe(fp8_wgrad):
    """The recipe of the activations' column-wise copies under fp8_wgrad (True or "tiled")."""
    return "blockwise_128x128" if fp8_wgrad == "tiled" else ACT_RECIPE


def check_recipe_options(recipe, fp8_dgrad, fp8_wgrad, owner="mok"):
    """recipe one of RECIPES; fp8_wgrad one of FP8_WGRAD_VALUES; fp8_dgrad / fp8_wgrad only with
    recipe="blockwise". Errors name the argument
    (owner: the caller's name in the message). One rule for the functional API, the layers and the
    expert-parallel experts."""
    if recipe not in RECIPES:
        raise ValueError(f"{owner}: recipe must be one of {RECIPES}, got {recipe!r}")
    if fp8_wgrad not in FP8_WGRAD_VALUES:
        raise ValueError(f"{owner}: fp8_wgrad must be False, True or 'tiled', got {fp8_wgrad!r}")
    for name, value in (("fp8_dgrad", fp8_dgrad), ("fp8_wgrad", fp8_wgrad)):
        if value and recipe != "blockwise":
            raise ValueError(f"{owner}: {name} must be False unless recipe='blockwise', got {value}")

# The forward's GEMM1: False (default), the plain FP8 GEMM (128 x 192 tiles) then torch.ops.mok.swiglu;
# True, one kernel with SwiGLU in its epilogue (mok.fp8_gemm.grouped_mm_swiglu_blockwise, 128 x 128
# tiles): the same h and act bit for bit. Measured on an H200 (RESULTS v20, performance log v37): the
# pair is 6-16% faster than the fused kernel on the Mixtral, DeepSeek-V3 and Qwen3 GEMM1s
# (bench_gemm_fp8.py), and the layer's fwd+bwd 1-2% faster on Mixtral and DeepSeek-V3 (Qwen3 within
# the noise). A module setting, so that benchmarks can compare the two (bench_moe_layer.py's
# mok_fp8_all_fused).
FUSED_GATE_UP = False


# The path between the two GEMMs. False (default): the three nodes _Fp8GateUp, _SwiGLUOf and _Fp8Down,
# SwiGLU and each quantisation an op of its own. True: one node for GEMM1, SwiGLU and GEMM2 (_Fp8Mlp)
# whose SwiGLU quantises its result in the same kernel, act in the forward and, with
# FUSED_SWIGLU_QUANT_BACKWARD, d_h in the backward (torch.ops.mok.swiglu_quantize_fp8), writing a bf16
# act or d_h only where a BF16 GEMM reads it. The same bits either way. Measured on an H200 (RESULTS
# v21, performance log v39): the fused kernel is 0.83-1.00x the two ops it replaces (it holds 128
# registers for its in-flight loads: two CTAs per SM, too few to hide them), the layer within 1% on
# Mixtral and DeepSeek-V3, and the one node keeps d_rows, h and act's codes alive through the whole
# backward (peak memory +0.4-1.7 GiB); so it is opt-in. FUSED_GATE_UP=True takes the three nodes.
FUSED_SWIGLU_QUANT = False
FUSED_SWIGLU_QUANT_BACKWARD = True

# Every GEMM in FP8 with both weight gradients (fp8_dgrad and fp8_wgrad, GATHER_QUANT): True (default),
# one node from x to y (_Fp8MlpCombine): x_rows' and d_rows' FP8 copies straight from x and dy (v45, v46)
# and SwiGLU with its result's two FP8 copies in one kernel both ways (v39's swiglu_quantize_fp8, with
# the column-wise copies in the layout and tiles the weight gradients read, v52): no bf16 act or d_h is
# written. False: the three nodes. The same bits either way with ROUTER_GRAD_IN_SWIGLU=False (below).
# Performance log v52.
FUSED_MLP_COMBINE = True

# In the one node (FUSED_MLP_COMBINE), the router-weight gradient from d_z's side (v53), as the BF16
# path's _DownCombine: y is the unweighted combine of z @ down[e]^T with z = s * act (s[r] the router
# weight of row r), so d_rows' FP8 copies come unweighted from dy, d_down's operand is z's column-wise
# copy (made by the forward's SwiGLU kernel), and the SwiGLU-backward kernel takes d_act = s * d_z and
# sums d_s[r] = d_z[r] . act[r]: no combine_weight_grad pass over rows [R, H], and rows is not held from
# the forward to the backward. False (default): d_w = combine_weight_grad(dy, rows), d_rows weighted (the
# three nodes' bits). Opt-in because measured (performance log v53, v56, H100): the scaled SwiGLU kernels
# cost about what combine_weight_grad did; with the backward streamed (v56: +0.10 / +0.11 / +0.04 ms over the
# plain kernel on Qwen3 / Mixtral / DeepSeek-V3) the step is equal on Qwen3 and DeepSeek-V3 and 1.8% slower on
# Mixtral, while Qwen3's peak memory is 0.24 GiB (12%) lower.
ROUTER_GRAD_IN_SWIGLU = False


def _saved_tensor_hooks_active():
    """Whether saved-tensor hooks are in force (torch.utils.checkpoint, save_on_cpu, FSDP activation
    offloading): they act on save_for_backward only, and the one node holds its intermediates on ctx
    (to free them early), so under such hooks the three nodes run instead, whose saved tensors the hooks
    see. Outside tracing only (the query is not traceable; a compiled graph manages its own memory)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:  # a torch without the query: assume hooks, keep the three nodes' semantics
        return True
    try:
        return top(False) is not None
    except TypeError:  # an older signature without ignore_is_tracing
        return top() is not None

# With fp8_wgrad, x_rows is needed only as its two FP8 copies, and with fp8_dgrad too, so is d_rows
# (the weighted gather of dy in mok::combine's backward). True: their copies straight from x and dy by
# the plan (torch.ops.mok.quantize_fp8_rowcol_gather: each gathered row read once, the bf16 x_rows and
# d_rows never written: 4 bytes moved per element instead of the gather's 2-4 and quantize_rowcol's 4;
# d_rows in the three-node path only, through _Fp8DownCombine); False: the bf16 gathers, then
# quantize_rowcol. The same bits either way. Performance log v45, v46.
GATHER_QUANT = True



def _gate_up_fp8(a_q, a_s, w_q, w_s, offsets):
    """(act, h) of the forward's GEMM1 on FP8 operands (see FUSED_GATE_UP)."""
    if FUSED_GATE_UP:
        return ops.grouped_mm_fp8_swiglu(a_q, a_s, w_q, w_s, offsets)
    h = ops.grouped_mm_fp8(a_q, a_s, w_q, w_s, offsets)
    return ops.swiglu(h), h


def quantize_expert_weight(w):
    """(codes [E, N, K] e4m3, scales [E, N / 128, K / 128] fp32) of an expert weight [E, N, K]:
    128 x 128 blocks, which never straddle two experts as N % 128 == 0."""
    return quantize_weight_blockwise(w.detach())


# The FP8 dgrad's W^T codes from a weight's cached codes (transpose_expert_codes; with FUSED_WEIGHT_CODES only
# where the codes were cached before the dgrad needed them): True (default), mok's byte-transpose kernel
# (torch.ops.mok.transpose_fp8_codes, csrc/cuda/transpose_bytes.cu), 0.8x of the copy's bandwidth; False,
# torch's strided copy of 1-byte elements, 0.09x (9x slower; it made remaking the codes cost ~10 ms per
# optimizer step on Mixtral with every GEMM in FP8). The same bytes. Performance log v65, H100.
TRANSPOSE_KERNEL = True


def transpose_expert_codes(q, s):
    """The blockwise codes of W^T [E, K, N] from those of W [E, N, K]: blocks and scales transpose (the codes
    by torch's strided copy, or with TRANSPOSE_KERNEL by mok's byte transpose)."""
    q_t = ops.transpose_fp8_codes(q) if TRANSPOSE_KERNEL else q.transpose(1, 2).contiguous()
    return q_t, s.transpose(1, 2).contiguous()


_CACHE_ATTR = "_mok_fp8_blockwise"
_CACHE_ATTR_T = "_mok_fp8_blockwise_t"
_CACHE_ATTR_PAIR = "_mok_fp8_blockwise_pair"  # on the gate of a (gate, up) pair
_CACHE_ATTR_PAIR_T = "_mok_fp8_blockwise_pair_t"


def weight_cache_usable():
    """Whether a weight's quantised copies may be kept on the weight and reused. Not under torch.compile
    (the quantisation is then part of the graph), nor while a CUDA graph is captured: a captured step
    that took cached codes would never read the weight, so its replays would keep using the codes of
    the weight as it was at capture, after the optimizer has changed it in place; and codes made during
    a capture live in the graph's memory pool, which replays overwrite."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _version_key(w):
    return (w._version, w.data_ptr(), tuple(w.shape))


def _cached(w, attr, make, partner=None):
    """make(w), kept on w and reused while w keeps its storage and version, and (partner: the up half of a
    pair, whose codes are part of the value) while partner is the same tensor with the same storage and
    version; not cached where weight_cache_usable() says no. The partner is held by a weak reference: a
    replaced up tensor, even one at the same address, misses."""
    if not weight_cache_usable():
        return make(w)
    key = (_version_key(w), None if partner is None else _version_key(partner))
    hit = getattr(w, attr, None)
    if hit is not None and hit[0] == key and (partner is None or hit[2]() is partner):
        return hit[1]
    value = make(w)
    try:
        setattr(w, attr, (key, value, None if partner is None else weakref.ref(partner)))
    except (AttributeError, RuntimeError, TypeError):  # a tensor that takes no attributes: no cache
        pass
    return value


def quantize_expert_weight_pair(gate, up):
    """quantize_expert_weight(cat([gate, up], 1)) from the halves, which no 128 x 128 block straddles: with
    FUSED_WEIGHT_CODES written in place by one kernel, else each half's codes concatenated."""
    if FUSED_WEIGHT_CODES:
        return ops.quantize_fp8_weight(gate.detach(), up.detach())
    (q_gate, s_gate), (q_up, s_up) = quantize_expert_weight(gate), quantize_expert_weight(up)
    return torch.cat([q_gate, q_up], 1), torch.cat([s_gate, s_up], 1)


def _codes_of(w, up=None):
    """quantize_expert_weight(w), or with up those of the pair's concatenation [E, 2I, H]."""
    return quantize_expert_weight(w) if up is None else quantize_expert_weight_pair(w, up)


def _cache_attrs(up):
    """The attributes that hold (the codes, the W^T codes) on the weight (the gate, for a pair)."""
    return (_CACHE_ATTR, _CACHE_ATTR_T) if up is None else (_CACHE_ATTR_PAIR, _CACHE_ATTR_PAIR_T)


def cached_expert_weight(w, up=None):
    """quantize_expert_weight(w), or with up those of the pair's concatenation [E, 2I, H], reused while the
    weight (both halves) keeps its storage and version."""
    return _cached(w, _cache_attrs(up)[0], lambda _: _codes_of(w, up), up)


# A weight's codes and its W^T codes for the FP8 dgrad, when both are needed and neither is cached: True (default),
# one kernel reads the bf16 weight once and writes both (torch.ops.mok.quantize_fp8_weight_rowcol; for the (w1, w3)
# pair straight from the two halves, no concatenation), and the pair's codes alone likewise
# (torch.ops.mok.quantize_fp8_weight); False, the quantisation, the pair's concatenation and
# transpose_expert_codes. The same bits. Performance log v66 (H100: 0.77x the time of quantising then transposing
# with mok's kernel; the requantised all-FP8 Mixtral step 22.7 -> 21.5 ms with the pair).
FUSED_WEIGHT_CODES = True


def quantize_expert_weight_rowcol(w, up=None):
    """((codes, scales), (codes_t, scales_t)): quantize_expert_weight(w) and transpose_expert_codes of it, or
    with up those of the pair's concatenation, from one read of the weight."""
    q, s, qt, st = ops.quantize_fp8_weight_rowcol(w.detach(), None if up is None else up.detach())
    return (q, s), (qt, st)


def cached_expert_weight_and_t(w, up=None):
    """(cached_expert_weight(w, up), the codes of w^T per expert for the FP8 dgrad), each reused while the weight
    (both halves) keeps its storage and version; made together where neither is cached (FUSED_WEIGHT_CODES), or
    the W^T codes from the codes (transpose_expert_codes)."""
    attr, attr_t = _cache_attrs(up)
    made = []

    def codes(_):
        if not FUSED_WEIGHT_CODES:
            return _codes_of(w, up)
        made.append(quantize_expert_weight_rowcol(w, up))
        return made[0][0]

    got = _cached(w, attr, codes, up)
    got_t = _cached(w, attr_t, lambda _: made[0][1] if made else transpose_expert_codes(*got), up)
    return got, got_t


def drop_cached_codes(*weights):
    """Forget the FP8 codes and MXFP8 copies cached on these weights (as an optimizer step makes them
    stale): for benchmarks that time a training step's quantisation of the weights without changing them."""
    from ._mxfp8_experts import _CACHE_ATTR as mxfp8_attr

    for w in weights:
        for attr in (_CACHE_ATTR, _CACHE_ATTR_T, _CACHE_ATTR_PAIR, _CACHE_ATTR_PAIR_T, mxfp8_attr):
            if getattr(w, attr, None) is not None:
                setattr(w, attr, None)


def _rowcol_of_gathered(x, src_of_row, w, top_k, col_recipe=ACT_RECIPE):
    """quantize_rowcol_for_wgrad(gather_rows(x, src_of_row, w, top_k), col_recipe) from one read of the
    gathered rows of x (the bf16 gathered tensor is never written)."""
    q, s, qt, st = ops.quantize_fp8_rowcol_gather(x, src_of_row, w, top_k, ACT_RECIPE, True, col_recipe)
    return (q, s), (qt, st)


def _rowcol_of_rows(x, src_of_row, top_k, x_rows, col_recipe):
    """quantize_rowcol_for_wgrad(x_rows, col_recipe) of the gathered token rows: of x_rows when given, else
    straight from x."""
    if x_rows is None:
        return _rowcol_of_gathered(x, src_of_row, None, top_k, col_recipe)
    return quantize_rowcol_for_wgrad(x_rows, col_recipe)


def _gate_up_wgrad_fp8(dqt, dst, xt_q, xt_s, offsets, split):
    """GEMM1's FP8 weight gradient: (d_gate_up [E, 2I, H], None), or with split (torchtitan's pair) (d_gate,
    d_up), each [E, I, H] and written where it is."""
    if split:
        return ops.grouped_mm_fp8_gate_up_wgrad(dqt, dst, xt_q, xt_s, offsets)
    return ops.grouped_mm_fp8_wgrad(dqt, dst, xt_q, xt_s, offsets), None


def _fp8_mm(a, w_q, w_s, offsets):
    """bf16 [R, N] = a [R, K] (quantised here, 1 x 128) @ w^T per expert, FP8 GEMM."""
    a_q, a_s = ops.quantize_fp8(a, ACT_RECIPE)
    return ops.grouped_mm_fp8(a_q, a_s, w_q, w_s, offsets)


def _quantize_grad(g, row, col):
    """((q, scales) row-wise or None, (qt, scales MN-major) column-wise or None) of an incoming gradient
    g [R, N]: one quantize_rowcol when both are needed, else only the copy that is."""
    if row and col:
        return quantize_rowcol_for_wgrad(g)
    if row:
        return fp8.quantize(g, ACT_RECIPE), None
    if col:
        return None, quantize_colwise_blockwise(g)
    return None, None


class _Fp8GateUp(torch.autograd.Function):
    """(h, act) = x_rows @ gate_up[e]^T in FP8 and SwiGLU(h) (see FUSED_GATE_UP); act is not differentiable
    here (its gradient reaches h through _SwiGLUOf, as in the BF16 path). Backward as mok's BF16
    _GateUp (d_x summed over each token's rows, d_gate_up over x_rows), its dgrad in FP8 when the
    transposed codes are given, its weight gradient in FP8 when fp8_wgrad (then x_rows' column-wise
    codes are saved, not x_rows)."""

    @staticmethod
    def forward(ctx, x, gate_up, src_of_row, row_of, top_k, offsets, x_rows, w_q, w_s, wt_q, wt_s, fp8_wgrad, up):
        xt_q = xt_s = None
        if fp8_wgrad:
            (x_q, x_s), (xt_q, xt_s) = _rowcol_of_rows(x, src_of_row, top_k, x_rows, wgrad_act_col_recipe(fp8_wgrad))
            act, h = _gate_up_fp8(x_q, x_s, w_q, w_s, offsets)
            x_rows = None
        else:
            act, h = _gate_up_fp8(*ops.quantize_fp8(x_rows, ACT_RECIPE), w_q, w_s, offsets)
        ctx.save_for_backward(x, gate_up, src_of_row, row_of, offsets, x_rows, wt_q, wt_s, xt_q, xt_s, up)
        ctx.top_k = top_k
        ctx.mark_non_differentiable(act)
        ctx.set_materialize_grads(False)
        return h, act

    @staticmethod
    def backward(ctx, d_h, _d_act):
        x, gate_up, src_of_row, row_of, offsets, x_rows, wt_q, wt_s, xt_q, xt_s, up = ctx.saved_tensors
        if d_h is None:
            return (None,) * 13
        d_h = d_h.contiguous()
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[12]
        fp8_dgrad = wt_q is not None and need_x
        fp8_wgrad = xt_q is not None and need_w
        g_row, g_col = _quantize_grad(d_h, fp8_dgrad, fp8_wgrad)
        d_x, d_w, d_up = gate_up_backward(d_h, x, src_of_row, row_of, ctx.top_k, gate_up, offsets, x_rows,
                                          need_x and not fp8_dgrad, need_w and not fp8_wgrad, up)
        if fp8_dgrad:
            d_x = ops.combine(ops.grouped_mm_fp8(*g_row, wt_q, wt_s, offsets), row_of, src_of_row, None)
        if fp8_wgrad:
            d_w, d_up = _gate_up_wgrad_fp8(*g_col, xt_q, xt_s, offsets, up is not None)
        return (d_x, d_w) + (None,) * 10 + (d_up,)


def _down_backward(d_rows, act, down, offsets, wt_q, wt_s, at_q, at_s, need_a, need_w, d_rows_codes=None):
    """(d_act, d_down) of rows = act @ down[e]^T: the dgrad on the FP8 kernel when down's transposed codes
    are given (else BF16), the weight gradient on FP8 column-wise copies when act's are given (else BF16
    on the saved act); None where not needed. d_rows_codes: d_rows' (row-wise, column-wise) FP8 copies
    when made already (then d_rows itself is not read)."""
    fp8_dgrad = wt_q is not None and need_a
    fp8_wgrad = at_q is not None and need_w
    g_row, g_col = d_rows_codes or _quantize_grad(d_rows, fp8_dgrad, fp8_wgrad)
    d_act = d_down = None
    if need_a:
        if fp8_dgrad:
            d_act = ops.grouped_mm_fp8(*g_row, wt_q, wt_s, offsets)
        else:
            d_act = ops.grouped_mm(d_rows, None, 1, down, offsets, False)
    if need_w:
        if fp8_wgrad:
            d_down = ops.grouped_mm_fp8_wgrad(*g_col, at_q, at_s, offsets)  # [E, H, I]
        else:
            d_down = ops.grouped_mm_wgrad(d_rows, act, None, 1, offsets)
    return d_act, d_down


def _down_fp8_keeping_act_codes(act, w_q, w_s, offsets, fp8_wgrad):
    """(rows = act @ down[e]^T in FP8, act's column-wise codes for the FP8 weight gradient): one
    quantize_rowcol of act feeds both."""
    (a_q, a_s), at = quantize_rowcol_for_wgrad(act, wgrad_act_col_recipe(fp8_wgrad))
    return ops.grouped_mm_fp8(a_q, a_s, w_q, w_s, offsets), at


class _Fp8Down(torch.autograd.Function):
    """rows = act @ down[e]^T in FP8; backward as mok.grouped_mm's (NT) in BF16, its dgrad in FP8
    when the transposed codes are given, its weight gradient in FP8 when fp8_wgrad (then act's
    column-wise codes are saved, not act)."""

    @staticmethod
    def forward(ctx, act, down, offsets, w_q, w_s, wt_q, wt_s, fp8_wgrad):
        at_q = at_s = None
        if fp8_wgrad:
            rows, (at_q, at_s) = _down_fp8_keeping_act_codes(act, w_q, w_s, offsets, fp8_wgrad)
            act = None
        else:
            rows = _fp8_mm(act, w_q, w_s, offsets)
        ctx.save_for_backward(act, down, offsets, wt_q, wt_s, at_q, at_s)
        ctx.set_materialize_grads(False)
        return rows

    @staticmethod
    def backward(ctx, d_rows):
        act, down, offsets, wt_q, wt_s, at_q, at_s = ctx.saved_tensors
        if d_rows is None:
            return (None,) * 8
        d_act, d_down = _down_backward(d_rows.contiguous(), act, down, offsets, wt_q, wt_s, at_q, at_s,
                                       ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return d_act, d_down, None, None, None, None, None, None


class _Fp8DownCombine(torch.autograd.Function):
    """y = combine(act @ down[e]^T in FP8, topk_w) as one node, for fp8_dgrad with fp8_wgrad (GATHER_QUANT):
    the backward makes d_rows' two FP8 copies straight from dy (the weighted gather of mok::combine's
    backward fused into the rowcol pass: d_rows is never written in bf16), then d_act and d_down as
    _Fp8Down. Gradients bit for bit those of _Fp8Down then mok::combine."""

    @staticmethod
    def forward(ctx, act, down, w, offsets, row_of, src_of_row, w_q, w_s, wt_q, wt_s, fp8_wgrad):
        rows, (at_q, at_s) = _down_fp8_keeping_act_codes(act, w_q, w_s, offsets, fp8_wgrad)
        ctx.save_for_backward(down, w, offsets, row_of, src_of_row, rows, wt_q, wt_s, at_q, at_s)
        ctx.set_materialize_grads(False)
        return ops.combine(rows, row_of, src_of_row, w)

    @staticmethod
    def backward(ctx, dy):
        down, w, offsets, row_of, src_of_row, rows, wt_q, wt_s, at_q, at_s = ctx.saved_tensors
        if dy is None:
            return (None,) * 11
        take = dict(rows=rows, at=(at_q, at_s)).pop
        d_act, d_down, d_w = _down_combine_backward(dy, down, w, offsets, row_of, src_of_row, take, wt_q, wt_s,
                                                    *ctx.needs_input_grad[:3])
        return (d_act, d_down, d_w) + (None,) * 8


def _down_combine_backward(dy, down, w, offsets, row_of, src_of_row, take, wt_q, wt_s, need_a, need_down, need_w):
    """(d_act, d_down, d_w) of y = combine(act @ down[e]^T, w), None where not needed: d_w over the forward's
    rows, d_rows' FP8 copies straight from dy when both GEMMs need them (else its bf16 gather). take(name)
    hands over the forward's "rows" and act's column-wise codes "at", each asked for once, where this
    function drops it after its last use."""
    dy = dy.contiguous()
    top_k = row_of.shape[1]
    rows = take("rows")
    d_w = ops.combine_weight_grad(dy, rows, row_of) if need_w else None
    del rows
    d_rows = codes = None
    if need_a and need_down:
        codes = _rowcol_of_gathered(dy, src_of_row, w, top_k)
    elif need_a or need_down:
        d_rows = ops.gather_rows(dy, src_of_row, w, top_k)
    at_q, at_s = take("at")
    d_act, d_down = _down_backward(d_rows, None, down, offsets, wt_q, wt_s, at_q, at_s, need_a, need_down, codes)
    return d_act, d_down, d_w


def _row_scales(w, src_of_row):
    """s [R] (w's dtype): s[r] = w.flatten()[src_of_row[r]], 0 for a padding row (src_of_row outside [0, T * K))."""
    n = w.numel()
    src = src_of_row.long()
    return F.pad(w.reshape(-1), (0, 1))[torch.where((src >= 0) & (src < n), src, n)]


def _down_combine_scaled_backward(dy, src_of_row, offsets, top_k, w2t_q, w2t_s, zt, need_down):
    """(d_z, d_down) of y = unweighted combine(z @ down[e]^T), z = s * act: d_rows' FP8 copies unweighted
    from dy, d_z = d_rows @ down[e] (FP8 dgrad), d_down = d_rows^T z on z's column-wise copy zt."""
    if need_down:
        g_row, g_col = _rowcol_of_gathered(dy, src_of_row, None, top_k)
    else:
        g_row, g_col = ops.quantize_fp8(ops.gather_rows(dy, src_of_row, None, top_k), ACT_RECIPE), None
    d_z = ops.grouped_mm_fp8(*g_row, w2t_q, w2t_s, offsets)
    del g_row
    d_down = ops.grouped_mm_fp8_wgrad(*g_col, *zt, offsets) if need_down else None  # [E, H, I]
    return d_z, d_down


class _Fp8MlpCombine(torch.autograd.Function):
    """y = combine(FP8GEMM2(q(SwiGLU(FP8GEMM1(q(x_rows))))), w) as one node, for every GEMM in FP8 with both
    weight gradients (FUSED_MLP_COMBINE): x_rows' two FP8 copies straight from x, act's two from h in the
    SwiGLU kernel (the column-wise one in col_recipe's blocks, scales MN-major: the weight gradient's
    operand), GEMM2 and the combine; the backward d_rows' copies straight from dy (as _Fp8DownCombine),
    the two GEMM2 gradients, then d_h's copies from h and d_act in the SwiGLU-backward kernel, and the
    two GEMM1 gradients. No bf16 x_rows, act, d_rows or d_h is written. With ROUTER_GRAD_IN_SWIGLU=False,
    gradients bit for bit those of the three nodes (_Fp8GateUp, _SwiGLUOf, _Fp8DownCombine).

    With ROUTER_GRAD_IN_SWIGLU (opt-in) the router weights enter as z = s * act (v53): the forward's
    SwiGLU kernel writes z's column-wise copy instead of act's, rows is dropped after the combine, and the
    backward takes d_w from the SwiGLU-backward kernel (d_s = d_z . act) instead of combine_weight_grad;
    then not the three nodes' bits (d_rows' copies unweighted, d_down on z), the same math.

    Memory: the intermediates the backward reads once (rows, act's codes, h, x_rows' codes) are held on
    ctx, not saved, so that the backward drops each after its last use, as the three nodes free theirs
    node by node; saved tensors would live to the end of this backward (+0.4-1.1 GiB peak measured on
    the bench shapes, performance log v52). So a second backward (retain_graph=True) is an error that
    says so."""

    @staticmethod
    def forward(ctx, x, gate_up, down, w, src_of_row, row_of, top_k, offsets, w1_q, w1_s, w2_q, w2_s, w1t_q, w1t_s,
                w2t_q, w2t_s, col_recipe, up):
        (x_q, x_s), xt = _rowcol_of_gathered(x, src_of_row, None, top_k, col_recipe)
        h = ops.grouped_mm_fp8(x_q, x_s, w1_q, w1_s, offsets)
        del x_q, x_s  # x_rows' row-wise codes: GEMM1's alone
        ctx.save_for_backward(down, w, src_of_row, row_of, offsets, w1t_q, w1t_s, w2t_q, w2t_s)
        ctx.top_k = top_k
        ctx.split = up is not None  # GEMM1's weight gradient as (d_gate, d_up)
        ctx.set_materialize_grads(False)
        if ROUTER_GRAD_IN_SWIGLU:
            # act's row-wise codes for GEMM2, z = s * act's column-wise codes for d_down
            row_scale = _row_scales(w, src_of_row)
            a_q, a_s, zt_q, zt_s, _ = ops.swiglu_scaled_quantize_fp8(h, None, row_scale, True, True, True, col_recipe)
            rows = ops.grouped_mm_fp8(a_q, a_s, w2_q, w2_s, offsets)
            del a_q, a_s
            ctx.inter = dict(h=h, xt=xt, zt=(zt_q, zt_s), row_scale=row_scale)
            return ops.combine(rows, row_of, src_of_row, w)
        _, a_q, a_s, at_q, at_s = ops.swiglu_quantize_fp8(h, None, True, True, False, True, col_recipe)
        rows = ops.grouped_mm_fp8(a_q, a_s, w2_q, w2_s, offsets)
        del a_q, a_s
        ctx.inter = dict(h=h, rows=rows, xt=xt, at=(at_q, at_s))
        return ops.combine(rows, row_of, src_of_row, w)

    @staticmethod
    def backward(ctx, dy):
        down, w, src_of_row, row_of, offsets, w1t_q, w1t_s, w2t_q, w2t_s = ctx.saved_tensors
        inter = ctx.inter
        if inter is None:
            raise RuntimeError(
                "mok: a second backward through the all-FP8 experts (retain_graph=True): their intermediates are "
                "freed by the first one; to backward twice, set mok._fp8_experts.FUSED_MLP_COMBINE = False (the "
                "three-node path, same bits, which keeps them)")
        if torch.compiler.is_compiling():
            take = inter.get  # traced: the compiled graph's own liveness decides (and ctx may not be mutated)
        else:
            ctx.inter = None  # the dict is this backward's alone: each pop drops an intermediate after its use
            take = inter.pop
        none = (None,) * 13  # the inputs after (x, gate_up, down, w) and before up
        if dy is None:
            return (None,) * 18
        need_x, need_w1, need_w2, need_w = ctx.needs_input_grad[:4]
        need_w1 = need_w1 or ctx.needs_input_grad[17]
        need_h = need_x or need_w1
        if "zt" in inter:
            d_x, d_gate_up, d_down, d_w, d_up = _mlp_combine_scaled_backward(
                dy, take, ctx.top_k, down, w, src_of_row, row_of, offsets, w1t_q, w1t_s, w2t_q, w2t_s, need_x, need_w1,
                need_w2, need_w, ctx.split)
            return (d_x, d_gate_up, d_down, d_w) + none + (d_up,)
        # GEMM2's and the combine's gradients, as _Fp8DownCombine's
        d_act, d_down, d_w = _down_combine_backward(dy, down, w, offsets, row_of, src_of_row, take, w2t_q, w2t_s,
                                                    need_h, need_w2, need_w)
        # GEMM1's gradients from d_h's FP8 copies, made from h and d_act by the SwiGLU-backward kernel
        d_x = d_gate_up = d_up = None
        h, (xt_q, xt_s) = take("h"), take("xt")
        if need_h:
            _, dq, ds, dqt, dst = ops.swiglu_quantize_fp8(h, d_act, need_x, need_w1, False, True, None)
            del h, d_act
            if need_x:
                d_x = ops.combine(ops.grouped_mm_fp8(dq, ds, w1t_q, w1t_s, offsets), row_of, src_of_row, None)
            del dq, ds
            if need_w1:
                d_gate_up, d_up = _gate_up_wgrad_fp8(dqt, dst, xt_q, xt_s, offsets, ctx.split)
        return (d_x, d_gate_up, d_down, d_w) + none + (d_up,)


def _mlp_combine_scaled_backward(dy, take, top_k, down, w, src_of_row, row_of, offsets, w1t_q, w1t_s, w2t_q, w2t_s,
                                 need_x, need_w1, need_w2, need_w, split):
    """_Fp8MlpCombine's backward with ROUTER_GRAD_IN_SWIGLU: (d_x, d_gate_up, d_down, d_w, d_up) (d_up with
    split, the pair's; else None)."""
    d_z, d_down = _down_combine_scaled_backward(dy.contiguous(), src_of_row, offsets, top_k, w2t_q, w2t_s,
                                                take("zt"), need_w2)
    h, (xt_q, xt_s), row_scale = take("h"), take("xt"), take("row_scale")
    # d_h's FP8 copies for d_act = s * d_z, and d_s = d_z . act, from h in one kernel (at least one copy is
    # made: the kernel's d_s comes with it)
    want_rows = need_x or not need_w1
    dq, ds, dqt, dst, d_s = ops.swiglu_scaled_quantize_fp8(h, d_z, row_scale, want_rows, need_w1, True, None)
    del h, d_z
    d_x = d_gate_up = d_up = None
    if need_x:
        d_x = ops.combine(ops.grouped_mm_fp8(dq, ds, w1t_q, w1t_s, offsets), row_of, src_of_row, None)
    del dq, ds
    if need_w1:
        d_gate_up, d_up = _gate_up_wgrad_fp8(dqt, dst, xt_q, xt_s, offsets, split)
    d_w = pair_grad_of_rows(d_s, row_of).to(w.dtype) if need_w else None
    return d_x, d_gate_up, d_down, d_w, d_up


class _Fp8Mlp(torch.autograd.Function):
    """rows = FP8GEMM2(q(SwiGLU(FP8GEMM1(q(x_rows))))) per expert as one node, so that SwiGLU and the
    quantisation of its result are one kernel both ways (FUSED_SWIGLU_QUANT): the forward makes act's
    row-wise codes (GEMM2's operand) and, with wgrad2, its column-wise codes (d_down's operand) from h
    without writing act; the backward makes d_h's row-wise codes (the FP8 dgrad of GEMM1) and / or its
    column-wise codes (d_gate_up's) from h and d_act. A bf16 act or d_h is written only where a BF16
    GEMM reads it. Gradients: those of _Fp8GateUp, _SwiGLUOf and _Fp8Down, bit for bit."""

    @staticmethod
    def forward(ctx, x, gate_up, down, src_of_row, row_of, top_k, offsets, w1_q, w1_s, w2_q, w2_s, w1t_q, w1t_s,
                w2t_q, w2t_s, wgrad1, wgrad2, keep_act, up):
        # gathered here, so that with wgrad1 only its FP8 copies outlive GEMM1 (and with GATHER_QUANT
        # x_rows is never written)
        x_rows = None if wgrad1 and GATHER_QUANT else ops.gather_rows(x, src_of_row, None, top_k, row_of)
        xt = None
        if wgrad1:
            (x_q, x_s), xt = _rowcol_of_rows(x, src_of_row, top_k, x_rows, wgrad_act_col_recipe(wgrad1))
            x_rows = None
        else:
            x_q, x_s = ops.quantize_fp8(x_rows, ACT_RECIPE)
        h = ops.grouped_mm_fp8(x_q, x_s, w1_q, w1_s, offsets)
        del x_q, x_s  # x_rows' row-wise codes: GEMM1's alone
        # act's codes straight from h; its bf16 values only for the BF16 weight gradient of down
        act, a_q, a_s, at_q, at_s = ops.swiglu_quantize_fp8(h, None, True, wgrad2, keep_act and not wgrad2)
        rows = ops.grouped_mm_fp8(a_q, a_s, w2_q, w2_s, offsets)
        at = (at_q, at_s.t().contiguous()) if wgrad2 else (None, None)
        ctx.save_for_backward(x, gate_up, down, src_of_row, row_of, offsets, x_rows, h,
                              act if act.numel() else None, w1t_q, w1t_s, w2t_q, w2t_s, *(xt or (None, None)), *at, up)
        ctx.top_k = top_k
        ctx.set_materialize_grads(False)
        return rows

    @staticmethod
    def backward(ctx, d_rows):
        (x, gate_up, down, src_of_row, row_of, offsets, x_rows, h, act, w1t_q, w1t_s, w2t_q, w2t_s, xt_q, xt_s,
         at_q, at_s, up) = ctx.saved_tensors
        none = (None,) * 15  # the inputs after (x, gate_up, down) and before up
        if d_rows is None:
            return (None,) * 19
        need_x, need_w1, need_w2 = ctx.needs_input_grad[:3]
        need_w1 = need_w1 or ctx.needs_input_grad[18]
        need_h = need_x or need_w1
        # GEMM2: d_act = d_rows @ down[e], d_down[e] = d_rows^T act
        d_act, d_down = _down_backward(d_rows.contiguous(), act, down, offsets, w2t_q, w2t_s, at_q, at_s, need_h,
                                       need_w2)
        d_x = d_gate_up = d_up = None
        if need_h:
            # SwiGLU's backward with d_h quantised for the FP8 GEMMs that read it; bf16 d_h for the BF16 ones
            dgrad1 = w1t_q is not None and need_x
            fp8_wgrad1 = xt_q is not None and need_w1
            bf16_x, bf16_w = need_x and not dgrad1, need_w1 and not fp8_wgrad1
            if (dgrad1 or fp8_wgrad1) and FUSED_SWIGLU_QUANT_BACKWARD:
                d_h, dq, ds, dqt, dst = ops.swiglu_quantize_fp8(h, d_act, dgrad1, fp8_wgrad1, bf16_x or bf16_w)
                dst = dst.t().contiguous() if fp8_wgrad1 else None
            else:
                d_h = ops.swiglu_backward(h, d_act)
                (dq, ds), (dqt, dst) = [t or (None, None) for t in _quantize_grad(d_h, dgrad1, fp8_wgrad1)]
            del d_act
            d_x, d_gate_up, d_up = gate_up_backward(d_h, x, src_of_row, row_of, ctx.top_k, gate_up, offsets,
                                                    x_rows, bf16_x, bf16_w, up)
            if dgrad1:
                d_x = ops.combine(ops.grouped_mm_fp8(dq, ds, w1t_q, w1t_s, offsets), row_of, src_of_row, None)
            if fp8_wgrad1:
                d_gate_up, d_up = _gate_up_wgrad_fp8(dqt, dst, xt_q, xt_s, offsets, up is not None)
        return (d_x, d_gate_up, d_down) + none + (d_up,)


def check_blockwise_args(x, gate_up_proj, up_proj=None):
    """The recipe's extra conditions, with errors that name the argument (up_proj: the up half of a
    (gate, up) pair, gate_up_proj then the gate [E, I, H])."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"mok: recipe='blockwise' needs bfloat16 x and weights, got {x.dtype}")
    _E, rows, H = gate_up_proj.shape
    I = rows if up_proj is not None else rows // 2
    if H % BLOCK or I % BLOCK:
        raise ValueError(
            f"mok: recipe='blockwise' needs the hidden size and the intermediate size to be multiples of {BLOCK} "
            f"(whole 128-wide scale blocks), got H={H}, I={I}"
        )


def experts_blockwise(x, plan, top_k, topk_w, gate_up_proj, down_proj, fp8_dgrad=False, fp8_wgrad=False,
                      up_proj=None):
    """y [T, H] of the routed experts under the blockwise recipe (inputs already checked). up_proj: the up
    half [E, I, H] of a (gate, up) pair, gate_up_proj then the gate half."""
    acc = torch.float32
    x = x.contiguous()
    w1t_q = w1t_s = w2t_q = w2t_s = None
    grad = torch.is_grad_enabled()
    if fp8_dgrad and grad:
        (w1_q, w1_s), (w1t_q, w1t_s) = cached_expert_weight_and_t(gate_up_proj, up_proj)
        (w2_q, w2_s), (w2t_q, w2t_s) = cached_expert_weight_and_t(down_proj)
    else:
        w1_q, w1_s = cached_expert_weight(gate_up_proj, up_proj)
        w2_q, w2_s = cached_expert_weight(down_proj)
    # column-wise copies of x_rows and act only where a weight gradient will be taken
    w1_grad = gate_up_proj.requires_grad or (up_proj is not None and up_proj.requires_grad)
    wgrad1 = bool(fp8_wgrad and grad and w1_grad)
    wgrad2 = bool(fp8_wgrad and grad and down_proj.requires_grad)
    if (FUSED_MLP_COMBINE and GATHER_QUANT and not FUSED_GATE_UP and wgrad1 and wgrad2 and w1t_q is not None
            and (torch.compiler.is_compiling() or not _saved_tensor_hooks_active())):
        return _Fp8MlpCombine.apply(x, gate_up_proj, down_proj, topk_w.to(acc).contiguous(), plan.src_of_row,
                                    plan.row_of, top_k, plan.offsets, w1_q, w1_s, w2_q, w2_s, w1t_q, w1t_s, w2t_q,
                                    w2t_s, wgrad_act_col_recipe(fp8_wgrad), up_proj)
    # (the one-node path's SwiGLU kernel quantises act 1 x 128 both ways: "tiled" takes the three nodes)
    if FUSED_SWIGLU_QUANT and not FUSED_GATE_UP and fp8_wgrad != "tiled":
        keep_act = bool(grad and down_proj.requires_grad)  # the BF16 d_down reads act
        rows = _Fp8Mlp.apply(x, gate_up_proj, down_proj, plan.src_of_row, plan.row_of, top_k, plan.offsets,
                             w1_q, w1_s, w2_q, w2_s, w1t_q, w1t_s, w2t_q, w2t_s, wgrad1 and fp8_wgrad, wgrad2, keep_act,
                             up_proj)
        return ops.combine(rows, plan.row_of, plan.src_of_row, topk_w.to(acc).contiguous())
    # the FP8 GEMM reads rows of A by TMA: one gathered copy of the token rows (also the BF16 weight
    # gradient's operand), or with wgrad1 and GATHER_QUANT only its FP8 copies, made from x
    x_rows = None
    if not (wgrad1 and GATHER_QUANT):
        x_rows = ops.gather_rows(x.detach(), plan.src_of_row, None, top_k, plan.row_of)
    h, act = _Fp8GateUp.apply(x, gate_up_proj, plan.src_of_row, plan.row_of, top_k, plan.offsets, x_rows, w1_q,
                              w1_s, w1t_q, w1t_s, wgrad1 and fp8_wgrad, up_proj)
    del x_rows  # with fp8_wgrad only its FP8 copies live on
    act = _SwiGLUOf.apply(h, act) if h.requires_grad else act
    if GATHER_QUANT and wgrad2 and w2t_q is not None:
        return _Fp8DownCombine.apply(act, down_proj, topk_w.to(acc).contiguous(), plan.offsets, plan.row_of,
                                     plan.src_of_row, w2_q, w2_s, w2t_q, w2t_s, fp8_wgrad)
    rows = _Fp8Down.apply(act, down_proj, plan.offsets, w2_q, w2_s, w2t_q, w2t_s, wgrad2 and fp8_wgrad)
    return ops.combine(rows, plan.row_of, plan.src_of_row, topk_w.to(acc).contiguous())
