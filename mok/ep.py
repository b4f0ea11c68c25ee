"""Expert parallelism: the routed experts of an MoE layer sharded over W ranks, tokens exchanged
by dispatch (token rows to the rank owning their expert) and combine (expert outputs back).

    ep = mok.ep.ExpertParallel(group, num_experts=E, max_tokens=T_max, top_k=K, hidden_size=H,
                               dtype=torch.bfloat16, device="cuda")
    y = ep.moe_experts(x, topk_idx, topk_w, gate_up_local, down_local)   # x [T <= T_max, H]

Semantics (identical on every backend):
- rank r owns experts [r * E / W, (r + 1) * E / W) (contiguous shards, E divisible by W);
- every (token t, slot k) pair with expert id e in [0, E) goes to rank e // (E / W); an id of -1 (any
  negative id) marks a pair that is not routed (padding); an id >= E is an error;
- rank d receives into a static receive space of W * C rows, C = capacity per (source, destination)
  pair (default T_max * K: nothing can overflow). Rows from source s sit at [s * C, s * C + n_s), in
  the source's (t, k) order, so each local expert sees its rows in the order of the W = 1 plan of the
  concatenated tokens of ranks 0..W-1: results equal W = 1 bitwise in the deterministic default;
- the local experts run on the received rows (each row its own token, K = 1, weight 1), in any of the
  layers' recipes (recipe="bf16", "blockwise" with fp8_dgrad / fp8_wgrad, "mxfp8"), combine
  returns each output row to its source, where y[t] = sum_k topk_w[t, k] * out[t, k] in k order
  (mok.ops.combine, the W = 1 kernel);
- backward: combine-backward is a dispatch of topk_w-weighted dy rows plus the topk_w gradient on
  the source rank; dispatch-backward is a combine of the d_x rows, summed over k on the source.
  Expert weight gradients stay local.

Backends (chosen automatically, or with backend=...):
- "symm_mem": GPU-initiated exchange kernels (csrc/cuda/ep_*.cu) over pointer tables built from
  torch.distributed._symmetric_memory handles; no host sync, CUDA-graph capturable;
- "torch": torch.distributed.all_to_all_single (NCCL on GPUs, gloo on CPU) with equal, static splits
  of C rows per (source, destination) pair, so that no split sizes ever travel to the host (the
  price: every call moves W * C rows per rank, empty slots included). Used when peers are not
  reachable through symmetric memory, on the CPU, or on request;
- VirtualExpertParallel: W ranks in ONE process on one device (the correctness harness): the same
  kernels launched once for all ranks (rank = blockIdx.y) over tables of plain buffers, or on the
  CPU a pure-torch simulation of the exchange.
"""
import math
from typing import List, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import _ep_ops  # noqa: F401  (fakes and autograd of mok::ep_dispatch / mok::ep_combine)
from . import _fp8_experts, _mxfp8_experts
from ._gate_up import gate_up_swiglu
from ._ops import ops
from .functional import moe_plan

__all__ = ["ExpertParallel", "VirtualExpertParallel", "ExpertParallelExperts", "Layout", "make_layout"]

# Codes of the layout's dst entries besides a rank (read by the kernels, see mok_ep_cuda.h).
DST_NONE = -1  # not routed (expert id < 0, or dropped in overflow="drop" mode)
DST_BAD_ID = -2  # expert id >= num_experts: an error
DST_OVERFLOW = -3  # beyond the capacity of its (source, destination) pair: an error by default


class Layout(NamedTuple):
    """Where each local (token, k) pair goes; [R, ...] = one entry per rank held by this process."""

    dst: torch.Tensor  # [R, P] int32: destination rank, or DST_* < 0
    pos: torch.Tensor  # [R, P] int32: row in the destination's slot segment of this source, -1 if none
    eid: torch.Tensor  # [R, P] int32: local expert id at the destination, -1 if none
    counts: torch.Tensor  # [R, W] int32: pairs sent to each destination (at most C)
    row_of: torch.Tensor  # [R, T, K] int32: t * K + k for routed pairs, -1 otherwise (mok.ops.combine)
    src_of_row: torch.Tensor  # [R, P] int32: the same, flat
    num_dropped: torch.Tensor  # [R] int32: pairs dropped for capacity (overflow="drop" only)


def make_layout(topk_idx, num_experts, world, capacity, drop=False) -> Layout:
    """Layout of topk_idx [R, T, K] (pure torch, on its device, no host sync). Deterministic: the
    pairs a source sends to one destination keep their (t, k) order."""
    R, T, K = topk_idx.shape
    P = T * K
    per_rank = num_experts // world
    dev = topk_idx.device
    e = topk_idx.reshape(R, P).to(torch.int64)
    bad = e >= num_experts
    dst = torch.where((e >= 0) & ~bad, torch.div(e, per_rank, rounding_mode="floor"), -1)
    hit = (dst.unsqueeze(-1) == torch.arange(world, device=dev)).to(torch.int32)  # [R, P, W]
    csum = hit.cumsum(1, dtype=torch.int32)
    pos = (csum * hit).sum(-1, dtype=torch.int32) - 1
    if P > 0:
        counts = csum[:, -1, :]
    else:
        counts = torch.zeros(R, world, dtype=torch.int32, device=dev)
    over = (pos >= capacity) & (dst >= 0)
    num_dropped = over.sum(1, dtype=torch.int32)
    dst = torch.where(over, DST_NONE if drop else DST_OVERFLOW, dst)
    if not drop:
        num_dropped = torch.zeros_like(num_dropped)
    dst = torch.where(bad, DST_BAD_ID, dst)
    counts = counts.clamp(max=capacity)
    routed = dst >= 0
    pos = torch.where(routed, pos, -1)
    eid = torch.where(routed, e - dst.clamp(min=0) * per_rank, -1)
    flat = torch.arange(P, device=dev, dtype=torch.int64).expand(R, P)
    src_of_row = torch.where(routed, flat, -1).to(torch.int32).contiguous()
    return Layout(dst.to(torch.int32).contiguous(), pos.to(torch.int32).contiguous(),
                  eid.to(torch.int32).contiguous(), counts.contiguous(), src_of_row.view(R, T, K),
                  src_of_row, num_dropped)


def sum_pairs(d_pairs, layout: Layout, top_k):
    """[R, T * K, H] pair rows -> [R, T, H]: the unweighted sum over k of each token's rows, in k
    order (mok.ops.combine, the kernel the W = 1 backward uses)."""
    if top_k == 1:
        return d_pairs
    return torch.stack([ops.combine(d_pairs[r], layout.row_of[r], layout.src_of_row[r], None)
                        for r in range(d_pairs.shape[0])])


# ------------------------------------------------------------------------------------------------
# exchange backends: raw (non-differentiable) dispatch and combine on stacked [R, ...] tensors
# ------------------------------------------------------------------------------------------------


class _SimExchange:
    """W virtual ranks in one process, exchange done with torch indexing (any device)."""

    def __init__(self, world, capacity):
        self.world, self.capacity, self.ranks, self.rank_base = world, capacity, world, 0

    def dispatch(self, src, src_div, lay: Layout):
        W, C = self.world, self.capacity
        R, P = lay.dst.shape
        H = src.shape[-1]
        rows = src[:, torch.arange(P, device=src.device) // src_div]  # [R, P, H]
        ok = lay.dst >= 0
        srcr = torch.arange(R, device=src.device).unsqueeze(1)
        # NOTE: unrouted pairs go to one trash row past the end (discarded), so no boolean indexing
        # (which would need the host to know how many rows there are).
        flat = torch.where(ok, lay.dst.long() * (W * C) + srcr * C + lay.pos.long(), W * W * C)
        recv = src.new_zeros(W * W * C + 1, H).index_copy_(0, flat.reshape(-1), rows.reshape(-1, H))
        eid = lay.eid.new_full((W * W * C + 1,), -1).index_copy_(0, flat.reshape(-1), lay.eid.reshape(-1))
        recv_counts = lay.counts.t().contiguous()  # [dst, src]
        return recv[:-1].view(W, W * C, H), eid[:-1].view(W, W * C), recv_counts

    def combine(self, rows, recv_counts, lay: Layout):
        W, C = self.world, self.capacity
        R, P = lay.dst.shape
        H = rows.shape[-1]
        srcr = torch.arange(R, device=rows.device).unsqueeze(1)
        flat = torch.where(lay.dst >= 0, lay.dst.long() * (W * C) + srcr * C + lay.pos.long(), W * W * C)
        # Slots past each source's count are never read: only routed pairs gather.
        ext = torch.cat([rows.reshape(-1, H), rows.new_zeros(1, H)])
        return ext.index_select(0, flat.reshape(-1)).view(R, P, H)


class _DistExchange:
    """One rank per process over torch.distributed.all_to_all_single with C rows per peer."""

    def __init__(self, group, world, rank, capacity):
        self.group, self.world, self.capacity, self.ranks, self.rank_base = group, world, capacity, 1, rank

    def _a2a(self, t):
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t, group=self.group)
        return out

    def dispatch(self, src, src_div, lay: Layout):
        W, C = self.world, self.capacity
        P = lay.dst.shape[1]
        H = src.shape[-1]
        rows = src[0, torch.arange(P, device=src.device) // src_div]
        flat = torch.where(lay.dst[0] >= 0, lay.dst[0].long() * C + lay.pos[0].long(), W * C)
        send = src.new_zeros(W * C + 1, H).index_copy_(0, flat, rows)
        eid = lay.eid.new_full((W * C + 1,), -1).index_copy_(0, flat, lay.eid[0])
        recv = self._a2a(send[:-1].contiguous())
        recv_eid = self._a2a(eid[:-1].contiguous())
        recv_counts = (recv_eid.view(W, C) >= 0).sum(1, dtype=torch.int32)
        return recv.unsqueeze(0), recv_eid.unsqueeze(0), recv_counts.unsqueeze(0)

    def combine(self, rows, recv_counts, lay: Layout):
        W, C = self.world, self.capacity
        H = rows.shape[-1]
        # Slot s * C + j holds the row of source s: the receive space is already in peer order.
        back = self._a2a(rows[0].contiguous())
        flat = torch.where(lay.dst[0] >= 0, lay.dst[0].long() * C + lay.pos[0].long(), W * C)
        ext = torch.cat([back, back.new_zeros(1, H)])
        return ext.index_select(0, flat).unsqueeze(0)


class _KernelExchange:
    """The CUDA exchange kernels (mok::ep_dispatch / mok::ep_combine) over a pointer table."""

    def __init__(self, table, world, ranks, rank_base, capacity, buf_bytes, blocks, timeout_s):
        self.table, self.world, self.ranks, self.rank_base = table, world, ranks, rank_base
        self.capacity, self.buf_bytes, self.blocks = capacity, buf_bytes, blocks
        self.timeout_us = max(1, int(timeout_s * 1e6))
        self.silent_rank = -1  # debug: this rank neither sends nor signals (timeout test)

    def _common(self):
        return (self.table, self.rank_base, self.world, self.capacity, self.buf_bytes, self.blocks,
                self.timeout_us, self.silent_rank)

    def dispatch(self, src, src_div, lay: Layout):
        return ops.ep_dispatch(src, src_div, lay.dst, lay.pos, lay.eid, lay.counts, *self._common())

    def combine(self, rows, recv_counts, lay: Layout):
        return ops.ep_combine(rows, recv_counts, lay.dst, lay.pos, *self._common())


class _DispatchFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src, ex, src_div, lay):
        recv, eid, cnt = ex.dispatch(src, src_div, lay)
        ctx.ex, ctx.src_div, ctx.lay = ex, src_div, lay
        ctx.save_for_backward(cnt)
        ctx.mark_non_differentiable(eid, cnt)
        return recv, eid, cnt

    @staticmethod
    def backward(ctx, g_recv, _g_eid, _g_cnt):
        (cnt,) = ctx.saved_tensors
        d_pairs = _CombineFn.apply(g_recv.contiguous(), cnt, ctx.ex, ctx.lay)
        return sum_pairs(d_pairs, ctx.lay, ctx.src_div), None, None, None


class _CombineFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, cnt, ex, lay):
        ctx.ex, ctx.lay = ex, lay
        return ex.combine(rows, cnt, lay)

    @staticmethod
    def backward(ctx, g_pairs):
        recv, _eid, _cnt = _DispatchFn.apply(g_pairs.contiguous(), ctx.ex, 1, ctx.lay)
        return recv, None, None, None


# ------------------------------------------------------------------------------------------------
# the expert-parallel group
# ------------------------------------------------------------------------------------------------


def _buffer_bytes(world, capacity, row_bytes):
    """Bytes of one rank's exchange buffer: slot expert ids [W * C] int32 (padded to 256 bytes),
    then W * C rows (mok_ep_buffer_bytes in csrc/cuda/mok_ep_cuda.h: keep the two equal)."""
    meta = (world * capacity * 4 + 255) // 256 * 256
    return meta + world * capacity * row_bytes


def _flag_words(world):
    """uint64 flag words of one rank (MOK_EP_FLAG_WORDS in mok_ep_cuda.h)."""
    return 3 * world + 2


def _kernels_available():
    return torch._C._dispatch_has_kernel_for_dispatch_key("mok::ep_dispatch", "CUDA")


FP8_PLAN_TILE = 128  # the local plans' row alignment under the FP8 recipes (see _local_experts)


def _local_experts(recv, eid, gate_up, down, recipe="bf16", fp8_dgrad=False, fp8_wgrad=False):
    """The local experts on received rows [W * C, H] (slot expert ids eid [W * C], -1 = empty):
    each row its own token with K = 1; empty slots come out as zero rows. recipe / fp8_dgrad /
    fp8_wgrad: as mok.functional.moe_experts'."""
    if recipe == "bf16":
        plan = moe_plan(eid.view(-1, 1), gate_up.shape[0], skip_invalid=True)
        act = gate_up_swiglu(recv, plan.src_of_row, plan.row_of, 1, gate_up, plan.offsets)
        rows = ops.grouped_mm(act, None, 1, down, plan.offsets, True)
        return ops.combine(rows, plan.row_of, plan.src_of_row, None)
    # The FP8 recipes' experts with routing weight 1 (applied by the source's combine): bf16(1 * row) is
    # the row, so the outputs are those of an unweighted combine. The plan is 128-aligned on every device
    # (CUDA's default) so that a column-wise block of the weight gradients never straddles two experts:
    # each expert's rows and blocks are then those of the W = 1 plan, and the results equal W = 1's
    # (with a 128-aligned plan) bitwise.
    plan = moe_plan(eid.view(-1, 1), gate_up.shape[0], tile=FP8_PLAN_TILE, skip_invalid=True)
    ones = torch.ones(recv.shape[0], 1, dtype=torch.float32, device=recv.device)
    if recipe == "blockwise":
        return _fp8_experts.experts_blockwise(recv, plan, 1, ones, gate_up, down, fp8_dgrad=fp8_dgrad,
                                              fp8_wgrad=fp8_wgrad)
    return _mxfp8_experts.experts_mxfp8(recv, plan, 1, ones, gate_up, down)



class _ExpertParallelBase:
    world: int
    num_experts: int
    max_tokens: int
    top_k: int
    capacity: int

    def _init_common(self, world, num_experts, max_tokens, top_k, capacity, overflow, timeout_s):
        if num_experts % world:
            raise ValueError(f"mok.ExpertParallel: num_experts={num_experts} must be divisible by the "
                             f"world size {world}")
        if overflow not in ("error", "drop"):
            raise ValueError(f"mok.ExpertParallel: overflow must be 'error' or 'drop', got {overflow!r}")
        self.world, self.num_experts, self.max_tokens, self.top_k = world, num_experts, max_tokens, top_k
        self.local_experts = num_experts // world
        self.capacity = int(capacity) if capacity is not None else max_tokens * top_k
        if self.capacity < 1:
            raise ValueError(f"mok.ExpertParallel: capacity must be >= 1, got {self.capacity}")
        self.drop = overflow == "drop"
        self.timeout_s = float(timeout_s)
        self._ex = None
        self._dev_err = None  # [3] int32 device counters (torch paths): bad ids, overflows, dropped

    # --- errors -------------------------------------------------------------------------------
    def _note_layout_errors(self, lay: Layout):
        if isinstance(self._ex, _KernelExchange):
            return  # the kernels report these in the host-mapped record
        bad = (lay.dst == DST_BAD_ID).sum(dtype=torch.int32)
        over = (lay.dst == DST_OVERFLOW).sum(dtype=torch.int32)
        if lay.dst.device.type == "cpu" and not torch.compiler.is_compiling():
            self._raise_layout(int(bad), int(over))
        else:
            if self._dev_err is None or self._dev_err.device != lay.dst.device:
                self._dev_err = torch.zeros(3, dtype=torch.int32, device=lay.dst.device)
            self._dev_err.add_(torch.stack([bad, over, lay.num_dropped.sum(dtype=torch.int32)]))

    def _raise_layout(self, bad, over):
        if bad:
            raise ValueError(f"mok.ExpertParallel: topk_idx holds {bad} expert id(s) >= num_experts="
                             f"{self.num_experts} (use -1 for pairs that are not routed)")
        if over:
            raise RuntimeError(f"mok.ExpertParallel: {over} (token, k) pair(s) exceed the capacity of "
                               f"{self.capacity} rows per (source, destination) rank pair; raise capacity= "
                               f"or pass overflow='drop'")

    def check_errors(self, synchronize=False):
        """Raises the error an earlier exchange reported (a peer that timed out, an expert id out of
        range, a capacity overflow) and clears it. Without synchronize, only finished launches are
        seen (the record is host-mapped memory: reading it does not wait for the GPU)."""
        if synchronize and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        if isinstance(self._ex, _KernelExchange):
            rec = ops.ep_error_record(True)
            if rec[0]:
                raise RuntimeError(
                    f"mok.ExpertParallel: rank {rec[1] - 1} timed out waiting for rank {rec[2] - 1} "
                    f"(no answer within timeout_s={self.timeout_s}); the expert-parallel group is unusable "
                    f"now: is every rank running the same sequence of MoE calls?")
            if rec[3] or rec[4]:
                self._raise_layout(int(rec[3]), int(rec[4]))
        elif self._dev_err is not None and synchronize:
            bad, over, _dropped = self._dev_err.tolist()  # ok: host (error check, after a sync)
            self._dev_err.zero_()
            self._raise_layout(bad, over)

    # --- exchange (stacked [R, ...]) ------------------------------------------------------------
    def layout(self, topk_idx) -> Layout:
        lay = make_layout(topk_idx, self.num_experts, self.world, self.capacity, self.drop)
        self._note_layout_errors(lay)
        return lay

    def dispatch(self, src, lay: Layout, src_div):
        """src [R, T, H] (token rows, src_div = K) or [R, T * K, H] (pair rows, src_div = 1) ->
        (recv [R, W * C, H], recv_eid [R, W * C] int32 (-1 = empty slot), recv_counts [R, W] int32).
        Differentiable in src."""
        return _DispatchFn.apply(src.contiguous(), self._ex, src_div, lay)

    def combine(self, rows, recv_counts, lay: Layout):
        """rows [R, W * C, H] in receive-slot order -> [R, T * K, H] in the sources' pair order
        (zero rows for pairs that were not routed). Differentiable in rows."""
        return _CombineFn.apply(rows.contiguous(), recv_counts, self._ex, lay)

    def _moe_stacked(self, x, topk_idx, topk_w, gate_up: List, down: List, recipe="bf16", fp8_dgrad=False,
                     fp8_wgrad=False):
        _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad, "mok.ExpertParallel")
        if recipe == "blockwise":
            _fp8_experts.check_blockwise_args(x, gate_up[0])
        elif recipe == "mxfp8":
            _mxfp8_experts.check_mxfp8_args(x, gate_up[0])
        if not torch.compiler.is_compiling():
            self.check_errors()
        R, T, H = x.shape
        K = topk_idx.shape[-1]
        if T > self.max_tokens:
            raise ValueError(f"mok.ExpertParallel: x has {T} tokens, more than max_tokens={self.max_tokens}")
        if K != self.top_k:
            raise ValueError(f"mok.ExpertParallel: topk_idx.shape[-1] must be top_k={self.top_k}, got {K}")
        lay = self.layout(topk_idx)
        recv, eid, cnt = self.dispatch(x, lay, K)
        out = torch.stack([_local_experts(recv[r], eid[r], gate_up[r], down[r], recipe, fp8_dgrad, fp8_wgrad)
                           for r in range(R)])
        pairs = self.combine(out, cnt, lay)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        w = topk_w.to(acc).contiguous()
        return torch.stack([ops.combine(pairs[r], lay.row_of[r], lay.src_of_row[r], w[r]) for r in range(R)])

    @property
    def backend(self) -> str:
        return self._backend


class ExpertParallel(_ExpertParallelBase):
    """The expert-parallel group of this process (one rank per process).

    group: a torch.distributed process group (default: the world); num_experts E (divisible by the
    group size W); max_tokens: the most tokens a rank passes per call (static: buffers are sized once);
    top_k, hidden_size and dtype of the token rows; capacity: rows per (source, destination) pair
    (default max_tokens * top_k, which cannot overflow); overflow: 'error' (default) or 'drop'
    (dropped pairs count as not routed); timeout_s: bound of every wait of the exchange kernels;
    backend: 'auto' (symmetric memory where every peer is reachable, else torch.distributed),
    'symm_mem' or 'torch'. Collective: every rank of the group must construct it, and call its MoE
    steps in the same order."""

    def __init__(self, group=None, *, num_experts, max_tokens, top_k, hidden_size, dtype=torch.bfloat16,
                 device=None, capacity=None, overflow="error", timeout_s=30.0, backend="auto", blocks=16):
        group = group if group is not None else dist.group.WORLD
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self._init_common(world, num_experts, max_tokens, top_k, capacity, overflow, timeout_s)
        self.group, self.rank, self.hidden_size, self.dtype = group, rank, hidden_size, dtype
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
        if backend not in ("auto", "symm_mem", "torch"):
            raise ValueError(f"mok.ExpertParallel: backend must be 'auto', 'symm_mem' or 'torch', got {backend!r}")
        self._backend = "torch"
        if backend != "torch" and self.device.type == "cuda" and _kernels_available():
            ok, err = True, None
            try:
                self._setup_symm_mem(blocks)
            except Exception as e:  # peers not reachable through symmetric memory
                ok, err = False, e
            if backend == "auto":
                ok = self._all_agree(ok)
            if ok:
                self._backend = "symm_mem"
            elif backend == "symm_mem":
                raise RuntimeError(f"mok.ExpertParallel: symmetric memory is not usable here: {err}") from err
        elif backend == "symm_mem":
            raise RuntimeError("mok.ExpertParallel: backend='symm_mem' needs a CUDA device and mok's CUDA kernels")
        if self._backend == "torch":
            self._ex = _DistExchange(group, world, rank, self.capacity)

    def _all_agree(self, ok):
        dev = self.device if "nccl" in str(dist.get_backend(self.group)) else torch.device("cpu")
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())  # ok: host (set-up, once per group)

    def _setup_symm_mem(self, blocks):
        import torch.distributed._symmetric_memory as symm_mem

        W, C = self.world, self.capacity
        row_bytes = self.hidden_size * torch.empty((), dtype=self.dtype).element_size()
        self.buf_bytes = _buffer_bytes(W, C, row_bytes)
        name = self.group.group_name
        self._buf = symm_mem.empty(self.buf_bytes, dtype=torch.uint8, device=self.device)
        self._flags = symm_mem.empty(_flag_words(W), dtype=torch.int64, device=self.device)
        self._flags.zero_()
        self._hbuf = symm_mem.rendezvous(self._buf, name)
        self._hflags = symm_mem.rendezvous(self._flags, name)
        ptrs = []
        for h, t in ((self._hbuf, self._buf), (self._hflags, self._flags)):
            off = t.data_ptr() - h.buffer_ptrs[h.rank]  # hdl.offset: where the tensor starts in its block
            ptrs += [h.buffer_ptrs[r] + off for r in range(W)]
        ptrs.append(ops.ep_error_ptr())
        self._table = torch.tensor(ptrs, dtype=torch.int64, device=self.device)
        torch.cuda.synchronize(self.device)
        self._hflags.barrier(channel=0)  # every rank's flags are zero before anyone signals
        self._ex = _KernelExchange(self._table, W, 1, self.rank, C, self.buf_bytes, blocks, self.timeout_s)

    def moe_experts(self, x, topk_idx, topk_w, gate_up_local, down_local, *, recipe="bf16", fp8_dgrad=False,
                    fp8_wgrad=False):
        """x [T, H] (T <= max_tokens, may differ per rank), topk_idx [T, K] global expert ids (-1: not
        routed), topk_w [T, K]; gate_up_local [E/W, 2I, H], down_local [E/W, H, I]: this rank's experts.
        recipe, fp8_dgrad, fp8_wgrad: the local experts' numerics, as in mok.functional.moe_experts
        (the exchange moves bf16 rows either way). Returns y [T, H]; differentiable in x, topk_w and the
        local weights."""
        y = self._moe_stacked(x.unsqueeze(0), topk_idx.unsqueeze(0), topk_w.unsqueeze(0), [gate_up_local],
                              [down_local], recipe, fp8_dgrad, fp8_wgrad)
        return y[0]


class VirtualExpertParallel(_ExpertParallelBase):
    """W ranks held by one process on one device: the test harness of the exchange. Every call
    works on all ranks at once (stacked [W, ...] tensors). On CUDA with mok's kernels the exchange is
    ONE launch of the real kernels for all ranks (rank = blockIdx.y; W * blocks <= SMs keeps every
    rank resident, so the spin-waits cannot deadlock), over pointer tables of W plain buffers; else a
    pure-torch simulation (backend='torch')."""

    def __init__(self, world, *, num_experts, max_tokens, top_k, hidden_size, dtype=torch.bfloat16,
                 device="cpu", capacity=None, overflow="error", timeout_s=10.0, backend="auto", blocks=None):
        self._init_common(world, num_experts, max_tokens, top_k, capacity, overflow, timeout_s)
        self.device, self.hidden_size, self.dtype = torch.device(device), hidden_size, dtype
        use_kernels = backend in ("auto", "kernel") and self.device.type == "cuda" and _kernels_available()
        if backend == "kernel" and not use_kernels:
            raise RuntimeError("mok.VirtualExpertParallel: backend='kernel' needs a CUDA device and mok's kernels")
        if not use_kernels:
            self._backend = "torch"
            self._ex = _SimExchange(world, self.capacity)
            return
        self._backend = "kernel"
        W, C = world, self.capacity
        row_bytes = hidden_size * torch.empty((), dtype=dtype).element_size()
        self.buf_bytes = _buffer_bytes(W, C, row_bytes)
        self._bufs = [torch.zeros(self.buf_bytes, dtype=torch.uint8, device=self.device) for _ in range(W)]
        self._flags = [torch.zeros(_flag_words(W), dtype=torch.int64, device=self.device) for _ in range(W)]
        ptrs = [b.data_ptr() for b in self._bufs] + [f.data_ptr() for f in self._flags] + [ops.ep_error_ptr()]
        self._table = torch.tensor(ptrs, dtype=torch.int64, device=self.device)
        if blocks is None:
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            blocks = max(1, min(16, sms // W))
        self._ex = _KernelExchange(self._table, W, W, 0, C, self.buf_bytes, blocks, timeout_s)

    def moe_experts(self, x, topk_idx, topk_w, gate_up, down, *, recipe="bf16", fp8_dgrad=False, fp8_wgrad=False):
        """x [W, T, H], topk_idx [W, T, K] (-1: not routed; pads ranks with fewer tokens), topk_w
        [W, T, K]; gate_up [E, 2I, H] and down [E, H, I]: ALL experts, rank r using its shard; recipe,
        fp8_dgrad, fp8_wgrad as in ExpertParallel.moe_experts. Returns y [W, T, H]."""
        El = self.local_experts
        gu = [gate_up[r * El:(r + 1) * El] for r in range(self.world)]
        dn = [down[r * El:(r + 1) * El] for r in range(self.world)]
        return self._moe_stacked(x, topk_idx, topk_w, gu, dn, recipe, fp8_dgrad, fp8_wgrad)


class ExpertParallelExperts(nn.Module):
    """The routed experts of one rank under expert parallelism: gate_up_proj [E/W, 2I, H] and
    down_proj [E/W, H, I] hold this rank's shard (experts [r E/W, (r+1) E/W)); forward(x [T, H],
    topk_idx [T, K] global ids, topk_w [T, K]) -> [T, H], like mok.GroupedExperts."""

    def __init__(self, ep: ExpertParallel, hidden_size, intermediate_size, *, recipe="bf16", fp8_dgrad=False,
                 fp8_wgrad=False, device=None, dtype=None):
        super().__init__()
        _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad, "mok.ExpertParallelExperts")
        self.ep = ep
        self.recipe, self.fp8_dgrad, self.fp8_wgrad = recipe, fp8_dgrad, fp8_wgrad
        self.num_experts, self.hidden_size, self.intermediate_size = ep.num_experts, hidden_size, intermediate_size
        El = ep.local_experts
        kw = dict(device=device, dtype=dtype)
        self.gate_up_proj = nn.Parameter(torch.empty(El, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = nn.Parameter(torch.empty(El, hidden_size, intermediate_size, **kw))
        nn.init.uniform_(self.gate_up_proj, -1 / math.sqrt(hidden_size), 1 / math.sqrt(hidden_size))
        bound = 1 / math.sqrt(max(1, intermediate_size))
        nn.init.uniform_(self.down_proj, -bound, bound)

    @classmethod
    def from_experts(cls, experts, ep: ExpertParallel):
        """This rank's shard of a full mok.GroupedExperts (the weights are copied; its recipe kept)."""
        El, r = ep.local_experts, ep.rank
        gu, dn = experts.gate_up_proj, experts.down_proj
        m = cls(ep, experts.hidden_size, experts.intermediate_size, recipe=getattr(experts, "recipe", "bf16"),
                fp8_dgrad=getattr(experts, "fp8_dgrad", False), fp8_wgrad=getattr(experts, "fp8_wgrad", False),
                device=gu.device, dtype=gu.dtype)
        with torch.no_grad():
            m.gate_up_proj.copy_(gu[r * El:(r + 1) * El])
            m.down_proj.copy_(dn[r * El:(r + 1) * El])
        return m

    def forward(self, x, topk_idx, topk_w, plan: Optional[object] = None):
        del plan  # the W = 1 plan of the local tokens does not apply to the received rows
        return self.ep.moe_experts(x, topk_idx, topk_w, self.gate_up_proj, self.down_proj, recipe=self.recipe,
                                   fp8_dgrad=self.fp8_dgrad, fp8_wgrad=self.fp8_wgrad)
