"""Plain PyTorch versions of everything mok computes: the specification every kernel is tested
against. Written for clarity (per-expert loops, explicit orders), not speed; run them in float64
on the CPU to get the reference values.

Conventions shared with the kernels:
- routing: ties in a top-k go to the lower expert id (and the lower group id);
- the plan: each expert's rows are its (token, k) pairs in increasing t * K + k order, padded to a
  multiple of the tile;
- combine: a token's K expert outputs are weighted and summed in k order, in the accumulation type.
"""
import torch
import torch.nn.functional as F

SOFTMAX, SIGMOID = "softmax", "sigmoid"


def _order_desc(scores, allowed=None):
    """Indices that sort the last dim by descending score, ties to the lower index, NaN after every number (the
    lower index first among NaNs; torch.sort alone puts NaN first), entries not `allowed` after all others:
    mok_route_topk's order (csrc/core/mok_core.h)."""
    nan = torch.isnan(scores)
    order = torch.sort(scores.masked_fill(nan, float("-inf")), dim=-1, descending=True, stable=True).indices
    rank = nan.gather(-1, order).to(torch.int8)
    if allowed is not None:
        rank = rank + 2 * (~allowed).gather(-1, order).to(torch.int8)
    return order.gather(-1, torch.sort(rank, dim=-1, stable=True).indices)


def _topk_stable(scores, k, allowed=None):
    """Indices of the k best scores per row in _order_desc's order."""
    return _order_desc(scores, allowed)[..., :k]


def route_topk(logits, top_k, *, bias=None, score_func=SOFTMAX, n_group=1, topk_group=1, renormalize=True,
               scaling=1.0):
    """Top-k routing. logits [T, E] (float). Returns (topk_idx [T, K] int64, topk_w [T, K], in the
    dtype of logits). See mok_route_topk in csrc/core/mok_core.h for the exact rule."""
    T, E = logits.shape
    if score_func == SOFTMAX:
        scores = torch.softmax(logits, dim=-1)
    elif score_func == SIGMOID:
        scores = torch.sigmoid(logits)
    else:
        raise ValueError(f"score_func must be 'softmax' or 'sigmoid', got {score_func!r}")
    choice = scores + bias if bias is not None else scores
    if n_group > 1:
        per = E // n_group
        grouped = choice.view(T, n_group, per)
        top2 = grouped.gather(-1, _topk_stable(grouped, min(2, per)))
        group_scores = top2[..., 0] + top2[..., 1] if per >= 2 else top2[..., 0]
        keep = _topk_stable(group_scores, topk_group)
        allowed = torch.zeros(T, n_group, dtype=torch.bool, device=logits.device)
        allowed.scatter_(1, keep, True)
        allowed = allowed.repeat_interleave(per, dim=1)
    else:
        allowed = None
    idx = _topk_stable(choice, top_k, allowed)
    w = scores.gather(1, idx)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * scaling


def plan_capacity(num_tokens, top_k, num_experts, tile):
    pairs = num_tokens * top_k
    if pairs == 0:
        return 0
    return -(-(pairs + min(num_experts, pairs) * (tile - 1)) // tile) * tile


def moe_plan(topk_idx, num_experts, tile, skip_invalid=False):
    """The routing plan (counts, offsets, row_of, src_of_row, num_skipped), built with a loop."""
    T, K = topk_idx.shape
    flat = topk_idx.reshape(-1).tolist()
    valid = [0 <= e < num_experts for e in flat]
    if not skip_invalid and not all(valid):
        raise ValueError(f"topk_idx holds an expert id outside [0, {num_experts})")
    counts = [0] * num_experts
    for e, ok in zip(flat, valid):
        if ok:
            counts[e] += 1
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + -(-c // tile) * tile)
    cap = plan_capacity(T, K, num_experts, tile)
    row_of = [-1] * (T * K)
    src_of_row = [-1] * cap
    fill = list(offsets[:-1])
    for pair, (e, ok) in enumerate(zip(flat, valid)):
        if ok:
            row_of[pair] = fill[e]
            src_of_row[fill[e]] = pair
            fill[e] += 1
    i32 = dict(dtype=torch.int32)
    return (torch.tensor(counts, **i32), torch.tensor(offsets, **i32), torch.tensor(row_of, **i32).view(T, K),
            torch.tensor(src_of_row, **i32), torch.tensor([valid.count(False)], **i32))


def swiglu(h):
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_scaled_backward(h, d_z, src_of_row, w):
    """Backward of z = s * swiglu(h) with s[r] = w.flatten()[src_of_row[r]] (0 where src_of_row < 0),
    for the incoming d_z: (d_h, z, d_s), d_s[r] = sum_j d_z[r, j] * swiglu(h)[r, j]."""
    src = src_of_row.long()
    s = torch.where(src >= 0, w.double().flatten()[src.clamp(min=0)], torch.zeros((), dtype=torch.float64))
    h = h.detach().double().requires_grad_(True)
    act = swiglu(h)
    z = s[:, None] * act
    (d_h,) = torch.autograd.grad(z, h, d_z.double())
    return d_h, z.detach(), (d_z.double() * act.detach()).sum(1)


def _expert_of_rows(offsets, rows):
    """Expert id of each row index (rows at or past offsets[-1] get -1)."""
    r = torch.arange(rows)
    e = torch.searchsorted(offsets[1:].long(), r, right=True)
    return torch.where(r < offsets[-1].long(), e, torch.full_like(e, -1))


def grouped_mm(a, b, offsets, trans_b, a_gather=None, a_gather_div=1):
    """Rows [offsets[e], offsets[e+1]) of A times b[e]^T (trans_b) or b[e]; rows past offsets[E] are 0.
    A row r is a[a_gather[r] // a_gather_div] (zeros where a_gather[r] < 0) when a_gather is given."""
    if a_gather is not None:
        src = a_gather.long()
        A = torch.where((src >= 0)[:, None], a[(src.clamp(min=0) // a_gather_div)], torch.zeros((), dtype=a.dtype))
    else:
        A = a
    R = A.shape[0]
    N = b.shape[1] if trans_b else b.shape[2]
    out = torch.zeros(R, N, dtype=a.dtype)
    off = offsets.long().tolist()
    for e in range(b.shape[0]):
        lo, hi = off[e], min(off[e + 1], R)
        if hi > lo:
            w = b[e].t() if trans_b else b[e]
            out[lo:hi] = A[lo:hi] @ w
    return out


def grouped_mm_wgrad(a, b, offsets, b_gather=None, b_gather_div=1):
    """out[e] = a_e^T @ B_e over the rows of expert e."""
    B = b if b_gather is None else grouped_mm_rows(b, b_gather, b_gather_div)
    off = offsets.long().tolist()
    E = len(off) - 1
    out = torch.zeros(E, a.shape[1], B.shape[1], dtype=a.dtype)
    for e in range(E):
        lo, hi = off[e], off[e + 1]
        out[e] = a[lo:hi].t() @ B[lo:hi]
    return out


def grouped_mm_rows(x, src_of_row, top_k, w=None):
    """gather_rows: row r is w[src] * x[src // K] for src = src_of_row[r] >= 0, zeros otherwise."""
    src = src_of_row.long()
    rows = x[src.clamp(min=0) // top_k]
    if w is not None:
        rows = rows * w.reshape(-1)[src.clamp(min=0)].to(rows.dtype)[:, None]
    return torch.where((src >= 0)[:, None], rows, torch.zeros((), dtype=x.dtype))


gather_rows = grouped_mm_rows


def combine(rows, row_of, w=None):
    """y[t] = sum over k (in order) of w[t, k] * rows[row_of[t, k]], skipping row_of < 0."""
    T, K = row_of.shape
    y = torch.zeros(T, rows.shape[1], dtype=rows.dtype)
    for k in range(K):
        r = row_of[:, k].long()
        contrib = rows[r.clamp(min=0)]
        if w is not None:
            contrib = contrib * w[:, k : k + 1].to(rows.dtype)
        y = y + torch.where((r >= 0)[:, None], contrib, torch.zeros((), dtype=rows.dtype))
    return y


def moe_experts(x, topk_idx, topk_w, gate_up_proj, down_proj, *, skip_invalid=False):
    """The routed experts of an MoE layer with a per-expert loop: y[t] = sum_k w[t,k] * MLP_e(x[t])
    with MLP_e(v) = down[e] @ (silu(gate[e] @ v) * (up[e] @ v)) and e = topk_idx[t, k]; the K terms
    are summed in k order. Pairs with an id outside [0, E) are skipped when skip_invalid, else an error."""
    T, K = topk_idx.shape
    E = gate_up_proj.shape[0]
    idx = topk_idx.long()
    valid = (idx >= 0) & (idx < E)
    if not skip_invalid and not bool(valid.all()):
        raise ValueError(f"topk_idx holds an expert id outside [0, {E})")
    outs = torch.zeros(T, K, x.shape[1], dtype=x.dtype, device=x.device)
    for e in range(E):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        h = x[tok] @ gate_up_proj[e].t()
        outs[tok, slot] = (swiglu(h) @ down_proj[e].t()).to(outs.dtype)  # (autocast runs these in bf16)
    y = torch.zeros_like(x)
    for k in range(K):
        y = y + outs[:, k] * topk_w[:, k : k + 1].to(x.dtype)
    return y


def moe_layer(x, router_weight, gate_up_proj, down_proj, top_k, *, bias=None, score_func=SOFTMAX, n_group=1,
              topk_group=1, renormalize=True, scaling=1.0, shared=None):
    """A whole MoE layer: router (fp32 logits), routed experts, optional shared expert MLP given as
    (gate_proj [Is, H], up_proj [Is, H], down_proj [H, Is]). x [..., H]."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(x.device.type, enabled=False):  # router logits in fp32 even under AMP
        logits = x2.to(acc) @ router_weight.t().to(acc)
    idx, w = route_topk(logits, top_k, bias=bias, score_func=score_func, n_group=n_group, topk_group=topk_group,
                        renormalize=renormalize, scaling=scaling)
    y = moe_experts(x2, idx, w, gate_up_proj, down_proj)
    if shared is not None:
        g, u, d = shared
        y = y + (F.silu(x2 @ g.t()) * (x2 @ u.t())) @ d.t()
    return y.reshape(shape)


# ------------------------------------------------------------------------------------------------
# FP8 quantisation (the C core's rules, csrc/core/mok_core.h, written with torch's float8 dtypes)
# ------------------------------------------------------------------------------------------------

FP8_E4M3_MAX = 448.0


def _e4m3_codes(v):
    """E4M3 codes (uint8) of float32 v: round-to-nearest-even with saturation to +-448."""
    return v.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _blocks(x, rows, cols):
    """x [M, N] float32, zero-padded to multiples of (rows, cols), as [M/rows, rows, N/cols, cols]."""
    M, N = x.shape
    Mp, Np = -(-M // rows) * rows, -(-N // cols) * cols
    xp = torch.zeros(Mp, Np, dtype=torch.float32)
    xp[:M, :N] = x
    return xp.view(Mp // rows, rows, Np // cols, cols)


def _nonfinite_blocks(xb):
    return (~torch.isfinite(xb)).any(dim=3).any(dim=1)


def quantize_fp8(x, recipe):
    """(q [M, N] float8_e4m3fn, scales) by the recipe's rule; see mok.fp8.quantize."""
    x = x.detach().float().cpu()
    M, N = x.shape
    if recipe in ("blockwise_1x128", "blockwise_128x128"):
        rows = 128 if recipe == "blockwise_128x128" else 1
        xb = _blocks(x, rows, 128)
        amax = xb.abs().amax(dim=3).amax(dim=1)
        scale = amax / FP8_E4M3_MAX
        scale = torch.where(amax == 0, torch.ones_like(scale), scale)
        bad = _nonfinite_blocks(xb)
        scale = torch.where(bad, torch.full_like(scale, float("nan")), scale)
        q = _e4m3_codes(xb / scale[:, None, :, None])
        q = torch.where(bad[:, None, :, None], torch.full_like(q, 0x7F), q)
        scales = scale if recipe == "blockwise_128x128" else scale.view(M, scale.shape[-1])
    elif recipe == "mxfp8":
        xb = _blocks(x, 1, 32)
        amax = xb.abs().amax(dim=3).amax(dim=1)
        ratio = amax / FP8_E4M3_MAX
        mant, expo = torch.frexp(ratio)  # ratio = mant * 2^expo, mant in [0.5, 1)
        e = (expo - 1) + (mant != 0.5).to(expo.dtype)  # ceil(log2(ratio)), exact
        e = e.clamp(-127, 127)
        e = torch.where(amax == 0, torch.full_like(e, -127), e)
        bad = _nonfinite_blocks(xb)
        q = _e4m3_codes(torch.ldexp(xb, (-e)[:, None, :, None].to(torch.float32)))
        q = torch.where(bad[:, None, :, None], torch.full_like(q, 0x7F), q)
        code = (e + 127).to(torch.uint8)
        scales = torch.where(bad, torch.full_like(code, 0xFF), code).view(M, code.shape[-1])
    else:
        raise ValueError(f"recipe must be blockwise_1x128, blockwise_128x128 or mxfp8, got {recipe!r}")
    Mp, Np = q.shape[0] * q.shape[1], q.shape[2] * q.shape[3]
    q = q.reshape(Mp, Np)[:M, :N].contiguous().view(torch.float8_e4m3fn)
    return q, scales


def dequantize_fp8(q, scales, recipe):
    """float32 [M, N] = e4m3(q) * scale of its block."""
    M, N = q.shape
    v = q.float()
    if recipe == "mxfp8":
        s = torch.where(scales == 0xFF, torch.tensor(float("nan")), torch.ldexp(torch.ones(()), scales.float() - 127))
        return v * s.repeat_interleave(32, dim=1)[:, :N]
    s = scales.repeat_interleave(128, dim=1)[:, :N]
    if recipe == "blockwise_128x128":
        s = s.repeat_interleave(128, dim=0)[:M]
    return v * s


def grouped_mm_fp8_blockwise(a_q, a_scales, b_q, b_scales, offsets):
    """The FP8 blockwise grouped GEMM (mok.fp8_gemm.grouped_mm_blockwise) in float64 on the CPU:
    a = dequantize(a_q, a_scales) ("blockwise_1x128"), b[e] = dequantize(b_q[e], b_scales[e])
    ("blockwise_128x128"), both exact in float64; rows [offsets[e], offsets[e+1]) are a @ b[e]^T,
    other rows 0. Returns float64 [R, N] (the op rounds this to bf16)."""
    a_q, a_scales, b_q, b_scales = (t.detach().cpu() for t in (a_q, a_scales, b_q, b_scales))
    # float64 scales make the products e4m3 * scale exact (float32 would round them).
    A = dequantize_fp8(a_q, a_scales.double(), "blockwise_1x128")
    E, N, _ = b_q.shape
    R = A.shape[0]
    out = torch.zeros(R, N, dtype=torch.float64)
    off = offsets.long().tolist()
    for e in range(E):
        lo, hi = off[e], min(off[e + 1], R)
        if hi > lo:
            B = dequantize_fp8(b_q[e], b_scales[e].double(), "blockwise_128x128")
            out[lo:hi] = A[lo:hi] @ B.t()
    return out


def grouped_mm_fp8_wgrad_blockwise(a_q, a_scales, b_q, b_scales, offsets):
    """The FP8 blockwise weight-gradient GEMM (mok.fp8_gemm.grouped_mm_wgrad_blockwise) in float64 on
    the CPU: a = dequantize(a_q, a_scales^T), b = dequantize(b_q, b_scales^T) ("blockwise_1x128" along
    R; the scales come MN-major, [ceil(R/128), M] and [ceil(R/128), N], or b's per 128 x 128 block,
    [ceil(R/128), ceil(N/128)]; exact in float64);
    out[e] = a[:, lo:hi] @ b[:, lo:hi]^T over expert e's rows [lo, hi) = [offsets[e], offsets[e+1]),
    zeros for an expert with no rows. Returns float64 [E, M, N] (the op
    rounds this to bf16)."""
    a_q, a_scales, b_q, b_scales = (t.detach().cpu() for t in (a_q, a_scales, b_q, b_scales))
    A = dequantize_fp8(a_q, a_scales.double().t(), "blockwise_1x128")
    N = b_q.shape[0]
    if N > 1 and b_scales.shape[1] == (N + 127) // 128:  # 128 x 128 blocks: scales of b's tiles
        B = dequantize_fp8(b_q, b_scales.double().t(), "blockwise_128x128")
    else:
        B = dequantize_fp8(b_q, b_scales.double().t(), "blockwise_1x128")
    off = offsets.long().tolist()
    E = len(off) - 1
    out = torch.zeros(E, A.shape[0], B.shape[0], dtype=torch.float64)
    for e in range(E):
        lo, hi = off[e], off[e + 1]
        if hi > lo:
            out[e] = A[:, lo:hi] @ B[:, lo:hi].t()
    return out
