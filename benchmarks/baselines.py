"""The peers mok is measured against, written from their public descriptions, all with mok's
signature: experts(x [T, H], topk_idx [T, K], topk_w [T, K] fp32, gate_up_proj [E, 2I, H],
down_proj [E, H, I]) -> [T, H].

- grouped_mm_experts: the torchtitan-style MoE experts: sort the (token, k) pairs by expert,
  gather the token rows, torch._grouped_mm for gate/up, SwiGLU, torch._grouped_mm for down,
  scale by the routing weight, scatter-add back. No host synchronisation (counts stay on the GPU).
- naive_experts: a per-expert Python loop (mok.reference.moe_experts; syncs on every expert).
- compiled_grouped_mm_experts(): grouped_mm_experts under torch.compile.

torch._grouped_mm needs sm_90+ on CUDA (bf16, 16-byte aligned strides, device offsets). Where it
does not run (older GPUs, some CPU builds) grouped_mm_experts falls back to the naive loop, so the
CPU smoke tests still run; `grouped_mm_available(device, dtype)` says which one you get."""
import functools

import torch
import torch.nn.functional as F

import mok
from mok import reference


@functools.lru_cache(maxsize=None)
def grouped_mm_available(device_type: str, dtype: torch.dtype) -> bool:
    """Probes torch._grouped_mm (forward and backward) once per device type and dtype."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device_type == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        return False
    try:
        with torch.enable_grad():  # the probe may first run under no_grad
            _probe(device_type, dtype)
        return True
    except Exception:
        return False


def _probe(device_type, dtype):
    a = torch.randn(32, 16, device=device_type, dtype=dtype, requires_grad=True)
    b = torch.randn(2, 16, 16, device=device_type, dtype=dtype, requires_grad=True)
    offs = torch.tensor([16, 32], device=device_type, dtype=torch.int32)
    y = torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
    # NOTE: a contiguous gradient: some builds reject the expanded one of y.sum().backward()
    torch.autograd.grad(y, [a, b], torch.randn_like(y))


def _grouped_mm_experts(x, topk_idx, topk_w, gate_up_proj, down_proj):
    T, K = topk_idx.shape
    E, two_i, _ = gate_up_proj.shape
    I = two_i // 2
    flat = topk_idx.reshape(-1)
    # Pairs in expert order (stable: within an expert, in t * K + k order, like mok's plan).
    order = torch.argsort(flat, stable=True)
    # NOTE: histc with explicit bounds stays on the GPU; torch.bincount reads the max back to the host.
    counts = torch.histc(flat.float(), bins=E, min=0, max=E)
    offs = torch.cumsum(counts.to(torch.int32), 0, dtype=torch.int32)  # END offset of each expert
    token = order // K
    xs = x.index_select(0, token)  # [T*K, H] permuted copy
    # torch._grouped_mm wants B as [E, K, N]: the transposed view of nn.Linear-layout weights.
    h = torch._grouped_mm(xs, gate_up_proj.transpose(-2, -1), offs=offs)  # [T*K, 2I]
    act = F.silu(h[:, :I]) * h[:, I:]  # gate rows first, then up rows
    o = torch._grouped_mm(act, down_proj.transpose(-2, -1), offs=offs)  # [T*K, H]
    # torchtitan scales in fp32, casts back, and scatter-adds in the activation dtype.
    o = (o.float() * topk_w.reshape(-1)[order].float().unsqueeze(-1)).to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token, o)


def naive_experts(x, topk_idx, topk_w, gate_up_proj, down_proj):
    """The per-expert loop (host syncs on every expert's token list)."""
    return reference.moe_experts(x, topk_idx, topk_w, gate_up_proj, down_proj)


def grouped_mm_experts(x, topk_idx, topk_w, gate_up_proj, down_proj):
    """torchtitan-style experts on torch._grouped_mm; the naive loop where that does not run."""
    if not grouped_mm_available(x.device.type, x.dtype):
        return naive_experts(x, topk_idx, topk_w, gate_up_proj, down_proj)
    return _grouped_mm_experts(x, topk_idx, topk_w, gate_up_proj, down_proj)


def compiled_grouped_mm_experts(device_type: str, dtype: torch.dtype):
    """grouped_mm_experts under torch.compile (one compilation per shape: dynamic=False); the
    naive loop, uncompiled, where torch._grouped_mm does not run."""
    if not grouped_mm_available(device_type, dtype):
        return naive_experts
    # NOTE: one benchmark run visits several shapes; past the default limit of 8 recompiles
    # dynamo silently runs the function eagerly.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(_grouped_mm_experts, dynamic=False)


class GroupedMMExperts(mok.GroupedExperts):
    """mok.GroupedExperts with the same parameters (gate_up_proj, down_proj) and state-dict keys,
    computed by the torchtitan-style peer: swap it in for a like-for-like training comparison."""

    def forward(self, x, topk_idx, topk_w, plan=None):  # plan: mok's, ignored
        return grouped_mm_experts(x, topk_idx, topk_w, self.gate_up_proj, self.down_proj)
