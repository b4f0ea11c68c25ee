"""mok's functional API: routing and the routed-expert MLP, with input checks that name the
argument. Everything here runs on mok's operators (torch.ops.mok), with no host synchronisation,
so it traces under torch.compile(fullgraph=True) and captures in CUDA graphs."""
from typing import NamedTuple, Optional, Union

import torch

from . import _errors, _fp8_experts, _mxfp8_experts
from ._down_combine import down_combine
from ._gate_up import gate_up_h_act
from ._ops import ops, plan_tile_for

_SCORE_FUNCS = {"softmax": 0, "sigmoid": 1}
_DATA_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class Plan(NamedTuple):
    """Where each (token, k) pair lives in the expert-ordered, tile-padded row space."""

    counts: torch.Tensor  # [E] int32: pairs routed to each expert
    offsets: torch.Tensor  # [E + 1] int32: first row of each expert (padded to the tile)
    row_of: torch.Tensor  # [T, K] int32: row of each pair, -1 if skipped
    src_of_row: torch.Tensor  # [capacity] int32: t * K + k of each row, -1 for padding
    num_skipped: torch.Tensor  # [1] int32: pairs whose expert id was outside [0, E)


def _fail(name, expected, got):
    raise ValueError(f"mok: {name} must be {expected}, got {got}")


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        _fail(name, "a torch.Tensor", type(t).__name__)


def _eager() -> bool:
    return not torch.compiler.is_compiling()


def route_topk(logits, top_k, *, bias=None, score_func="softmax", n_group=1, topk_group=1, renormalize=True,
               scaling=1.0):
    """Fused top-k routing over router logits [T, E] (float32 or float64).

    Returns (topk_idx [T, K] int32, topk_w [T, K] in the dtype of logits). `bias` [E] shifts the
    scores used for selection only (aux-loss-free load balancing); n_group / topk_group restrict
    each token to its best groups (DeepSeek-V3); renormalize makes the K weights sum to one;
    scaling multiplies them. topk_w is differentiable with respect to logits."""
    _check_tensor(logits, "logits")
    if score_func not in _SCORE_FUNCS:
        _fail("score_func", "'softmax' or 'sigmoid'", repr(score_func))
    if logits.dim() != 2:
        _fail("logits", "2-D [T, E]", f"shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if bias is not None and bias.dtype != logits.dtype:
        bias = bias.to(logits.dtype)
    topk_w, topk_idx = ops.route_topk(logits.contiguous(), bias, int(top_k), _SCORE_FUNCS[score_func],
                                      int(n_group), int(topk_group), bool(renormalize), float(scaling))
    return topk_idx, topk_w


def _expert_ids_int32(topk_idx, num_experts):
    if topk_idx.dtype == torch.int32:
        return topk_idx.contiguous()
    # NOTE: clamp before narrowing, so an out-of-range int64 id stays out of range instead of wrapping.
    return topk_idx.clamp(-1, num_experts).to(torch.int32).contiguous()


def moe_plan(topk_idx, num_experts, *, tile=None, skip_invalid=False) -> Plan:
    """Builds the routing plan of topk_idx [T, K] on its device (no host sync). tile: the row
    alignment of each expert (default: 128 on CUDA, where GEMM tiles must not straddle experts;
    1 on the CPU)."""
    _check_tensor(topk_idx, "topk_idx")
    if topk_idx.dim() != 2:
        _fail("topk_idx", "2-D [T, K]", f"shape {tuple(topk_idx.shape)}")
    if topk_idx.dtype not in (torch.int32, torch.int64):
        _fail("topk_idx", "int32 or int64", topk_idx.dtype)
    if tile is None:
        tile = plan_tile_for(topk_idx.device)
    return Plan(*ops.moe_plan(_expert_ids_int32(topk_idx, num_experts), int(num_experts), int(tile),
                              bool(skip_invalid)))


def _gate_up_pair(gate_up_proj):
    """(gate_up, up): a [E, 2I, H] weight as given (up None), or a (gate [E, I, H], up [E, I, H])
    pair as its two tensors."""
    if isinstance(gate_up_proj, (tuple, list)):
        if len(gate_up_proj) != 2:
            _fail("gate_up_proj", "a tensor [E, 2I, H] or a pair (gate [E, I, H], up [E, I, H])",
                  f"a {type(gate_up_proj).__name__} of {len(gate_up_proj)}")
        return gate_up_proj[0], gate_up_proj[1]
    return gate_up_proj, None


def _check_experts_args(x, topk_idx, topk_w, gate_up_proj, down_proj, up_proj=None):
    split = up_proj is not None
    gate_name = "gate_up_proj[0] (gate)" if split else "gate_up_proj"
    tensors = [("x", x), ("topk_idx", topk_idx), ("topk_w", topk_w), (gate_name, gate_up_proj), ("down_proj", down_proj)]
    if split:
        tensors.append(("gate_up_proj[1] (up)", up_proj))
    for name, t in tensors:
        _check_tensor(t, name)
    if x.dim() != 2:
        _fail("x", "2-D [T, H]", f"shape {tuple(x.shape)}")
    if x.dtype not in _DATA_DTYPES:
        _fail("x", "bfloat16, float16, float32 or float64", x.dtype)
    if gate_up_proj.dim() != 3:
        _fail(gate_name, "3-D [E, I, H]" if split else "3-D [E, 2I, H]", f"shape {tuple(gate_up_proj.shape)}")
    if down_proj.dim() != 3:
        _fail("down_proj", "3-D [E, H, I]", f"shape {tuple(down_proj.shape)}")
    E, rows, H = gate_up_proj.shape
    if split:
        if tuple(up_proj.shape) != tuple(gate_up_proj.shape):
            _fail("gate_up_proj[1] (up)", f"of the shape of the gate {tuple(gate_up_proj.shape)}",
                  f"shape {tuple(up_proj.shape)}")
        two_i = 2 * rows
    else:
        two_i = rows
        if two_i % 2:
            _fail("gate_up_proj.shape[1]", "even (gate rows then up rows, 2I)", two_i)
    if H != x.shape[1]:
        _fail(f"{gate_name}.shape[2]", f"the hidden size of x ({x.shape[1]})", H)
    if tuple(down_proj.shape) != (E, H, two_i // 2):
        _fail("down_proj", f"of shape [E, H, I] = {(E, H, two_i // 2)} to match gate_up_proj",
              f"shape {tuple(down_proj.shape)}")
    weights = [(gate_name, gate_up_proj), ("down_proj", down_proj)] + ([("gate_up_proj[1] (up)", up_proj)] if split else [])
    for name, w in weights:
        if w.dtype != x.dtype:
            _fail(name, f"of the dtype of x ({x.dtype})", w.dtype)
        if w.device != x.device:
            _fail(name, f"on the device of x ({x.device})", w.device)
        if not w.is_contiguous():
            _fail(name, "contiguous (nn.Linear layout per expert; call .contiguous() once, not per step)",
                  f"strides {w.stride()}")
    if topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        _fail("topk_idx", f"of shape [T, K] with T = {x.shape[0]}", f"shape {tuple(topk_idx.shape)}")
    if topk_idx.dtype not in (torch.int32, torch.int64):
        _fail("topk_idx", "int32 or int64", topk_idx.dtype)
    if topk_idx.device != x.device:
        _fail("topk_idx", f"on the device of x ({x.device})", topk_idx.device)
    if tuple(topk_w.shape) != tuple(topk_idx.shape):
        _fail("topk_w", f"of the shape of topk_idx {tuple(topk_idx.shape)}", f"shape {tuple(topk_w.shape)}")
    if not topk_w.is_floating_point():
        _fail("topk_w", "a floating-point tensor", topk_w.dtype)
    if topk_w.device != x.device:
        _fail("topk_w", f"on the device of x ({x.device})", topk_w.device)
    K = topk_idx.shape[1]
    if K < 1 or K > E:
        _fail("topk_idx.shape[1] (top_k)", f"in [1, num_experts={E}]", K)


def _autocast(x, *weights):
    """Under torch.autocast, run the experts in the autocast dtype (weights cast per call, so fp32
    master weights get their gradients in fp32), like torch's own matmuls. None passes through."""
    device_type = x.device.type
    if not torch.is_autocast_enabled(device_type):
        return (x, *weights)
    dt = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dt) if t is not None and t.is_floating_point() else t for t in (x, *weights))


def moe_experts(x, topk_idx, topk_w, gate_up_proj, down_proj, *, skip_invalid=False, plan: Optional[Plan] = None,
                recipe: str = "bf16", fp8_dgrad: bool = False, fp8_wgrad: Union[bool, str] = False):
    """The routed experts of an MoE layer: y[t] = sum_k topk_w[t, k] * MLP_e(x[t]), e = topk_idx[t, k],
    MLP_e(v) = down_proj[e] @ (silu(gate[e] @ v) * (up[e] @ v)), [gate; up] = gate_up_proj[e].

    x [T, H]; topk_idx [T, K] int32/int64; topk_w [T, K] (any float dtype; used in fp32);
    gate_up_proj [E, 2I, H] and down_proj [E, H, I] (the Hugging Face transformers v5 layout, the
    dtype of x); gate_up_proj may also be a pair (gate [E, I, H], up [E, I, H]) of separate tensors
    (torchtitan's w1 and w3), the same bits as their concatenation without one per call: on CUDA the
    BF16 kernels read and write them where they are (I a multiple of 64 on sm_90a; otherwise, and on
    the CPU, the C++ layer concatenates and splits with a copy), and the FP8 and MXFP8 recipes cache
    their codes per version of the pair as they do for one weight.
    Returns y [T, H] in the dtype of x. Differentiable in x, topk_w and every weight.

    An expert id outside [0, E) is an error; with skip_invalid=True such pairs are skipped (the
    transformers expert-parallel convention for tokens routed to experts of other ranks). On CUDA
    the error is seen by the GPU and raised by the next mok call (or mok.check_errors()), as a
    synchronous check would stall the GPU.

    recipe: "bf16" (default), or "blockwise": both expert GEMMs of the forward in FP8 E4M3 with
    1 x 128 activation and 128 x 128 weight scales (DeepSeek-V3's recipe), the backward in BF16;
    needs bf16 x and weights, H and I multiples of 128 (mok/_fp8_experts.py). fp8_dgrad=True (with
    "blockwise") also runs the backward's two dgrad GEMMs in FP8 (gradients quantised 1 x 128), and
    fp8_wgrad=True (with "blockwise") its two weight-gradient GEMMs (gradients and activations
    quantised 1 x 128 along the rows), fp8_wgrad="tiled" the same with the activations' copies (x_rows,
    act) in 128 x 128 tiles instead (faster weight gradients, coarser activation scales; see
    mok/_fp8_experts.py); either of fp8_dgrad / fp8_wgrad may be given without the other. "mxfp8": every expert
    GEMM (forward, dgrad, weight gradient) on operands rounded to MXFP8 (E4M3, one E8M0 scale per
    1 x 32 block along that GEMM's contraction dimension), computed exactly on the BF16 kernels:
    Blackwell's MXFP8 training numerics on Hopper, at BF16 speed plus the rounding passes (Hopper has
    no block-scaled MMA); needs bf16, H and I multiples of 32 (mok/_mxfp8_experts.py)."""
    _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad)
    gate_up_proj, up_proj = _gate_up_pair(gate_up_proj)
    x, gate_up_proj, up_proj, down_proj = _autocast(x, gate_up_proj, up_proj, down_proj)
    _check_experts_args(x, topk_idx, topk_w, gate_up_proj, down_proj, up_proj)
    if recipe == "blockwise":
        _fp8_experts.check_blockwise_args(x, gate_up_proj, up_proj)
    elif recipe == "mxfp8":
        _mxfp8_experts.check_mxfp8_args(x, gate_up_proj, up_proj)
    if _eager() and x.is_cuda:
        _errors.check_errors()
    E = gate_up_proj.shape[0]
    K = topk_idx.shape[1]
    if plan is None:
        plan = moe_plan(topk_idx, E, skip_invalid=skip_invalid)
    if recipe == "blockwise":
        return _fp8_experts.experts_blockwise(x, plan, K, topk_w, gate_up_proj, down_proj, fp8_dgrad=fp8_dgrad,
                                              fp8_wgrad=fp8_wgrad, up_proj=up_proj)
    if recipe == "mxfp8":
        return _mxfp8_experts.experts_mxfp8(x, plan, K, topk_w, gate_up_proj, down_proj, up_proj)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.contiguous()
    x_rows = None
    weights_grad = gate_up_proj.requires_grad or (up_proj is not None and up_proj.requires_grad)
    if x.is_cuda and x.dtype == torch.bfloat16 and torch.is_grad_enabled() and weights_grad:
        # Training: one gathered copy of the token rows, read by GEMM1 as plain TMA rows and kept
        # for gate_up_proj's weight gradient, which would otherwise gather x again. (Gathering
        # on load in GEMM1 costs more than this copy: docs/performance-log.md, v11.)
        x_rows = ops.gather_rows(x.detach(), plan.src_of_row, None, K, plan.row_of)
    # GEMM1 + SwiGLU as one kernel whose autograd node hands back h (d_h frees h and d_act before
    # GEMM1's backward: mok/_gate_up.py); GEMM2 + the weighted combine as one node that keeps only h
    # for the backward and takes the router-weight gradient from d_act's side (mok/_down_combine.py).
    h, act = gate_up_h_act(x, plan.src_of_row, plan.row_of, K, gate_up_proj, plan.offsets, x_rows, up_proj)
    return down_combine(h, act, down_proj, topk_w.to(acc).contiguous(), plan.row_of, plan.src_of_row, plan.offsets)


check_errors = _errors.check_errors
