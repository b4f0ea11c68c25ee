"""Fake kernels and autograd of the expert-parallel exchange operators (csrc/torch/ep_ops.cpp).

mok::ep_dispatch and mok::ep_combine are functional: fresh outputs, static shapes (the receive
space holds W * C rows), true counts in device tensors. They communicate through workspaces named
by the pointer table (an int64 tensor): each call is a collective step of every rank of the group,
advancing device-side epochs, so calls must not be reordered or deduplicated across ranks.
The backward of a dispatch is a combine of the gradient rows, and vice versa."""
import torch

from . import _lib  # noqa: F401  (registers the schemas)

ops = torch.ops.mok


@torch.library.register_fake("mok::ep_dispatch")
def _ep_dispatch_fake(src, src_div, dst, pos, eid, counts, table, rank_base, world, capacity, buf_bytes, blocks,
                      timeout_us, silent_rank):
    R, H = src.shape[0], src.shape[2]
    slots = world * capacity
    return (src.new_empty((R, slots, H)), dst.new_empty((R, slots)), dst.new_empty((R, world)))


@torch.library.register_fake("mok::ep_combine")
def _ep_combine_fake(rows, recv_counts, dst, pos, table, rank_base, world, capacity, buf_bytes, blocks, timeout_us,
                     silent_rank):
    return rows.new_empty((dst.shape[0], dst.shape[1], rows.shape[2]))


def _sum_pairs(d_pairs, dst, top_k):
    if top_k == 1:
        return d_pairs
    R, P = dst.shape
    flat = torch.arange(P, device=dst.device, dtype=torch.int32).expand(R, P)
    src_of_row = torch.where(dst >= 0, flat, -1).contiguous()
    row_of = src_of_row.view(R, P // top_k, top_k)
    return torch.stack([ops.combine(d_pairs[r], row_of[r], src_of_row[r], None) for r in range(R)])


def _dispatch_setup(ctx, inputs, output):
    src, src_div, dst, pos, eid, counts, *common = inputs
    _recv, _eid, recv_counts = output
    ctx.save_for_backward(dst, pos, eid, recv_counts)
    ctx.src_div, ctx.common = src_div, common


def _dispatch_backward(ctx, g_recv, _g_eid, _g_cnt):
    dst, pos, eid, recv_counts = ctx.saved_tensors
    d_pairs = ops.ep_combine(g_recv.contiguous(), recv_counts, dst, pos, *ctx.common)
    return (_sum_pairs(d_pairs, dst, ctx.src_div),) + (None,) * 13


torch.library.register_autograd("mok::ep_dispatch", _dispatch_backward, setup_context=_dispatch_setup)


def _combine_setup(ctx, inputs, output):
    rows, recv_counts, dst, pos, *common = inputs
    ctx.save_for_backward(dst, pos)
    ctx.common = common


def _combine_backward(ctx, g_pairs):
    dst, pos = ctx.saved_tensors
    # Gradient rows go where the forward rows came from; the slot expert ids are not needed again.
    world = ctx.common[2]
    eid = torch.zeros_like(dst)
    counts = (dst.unsqueeze(-1) == torch.arange(world, device=dst.device)).sum(1, dtype=torch.int32)
    recv, _eid, _cnt = ops.ep_dispatch(g_pairs.contiguous(), 1, dst, pos, eid, counts, *ctx.common)
    return (recv,) + (None,) * 11


torch.library.register_autograd("mok::ep_combine", _combine_backward, setup_context=_combine_setup)

EP_OPS = ("ep_dispatch", "ep_combine", "ep_error_ptr", "ep_error_record")
