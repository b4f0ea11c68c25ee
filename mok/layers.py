"""The nn.Modules users swap in: TopKRouter, GroupedExperts and MoE."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import _fp8_experts, functional


class TopKRouter(nn.Module):
    """Router of an MoE layer: fp32 logits x @ weight^T, then fused top-k (mok.functional.route_topk).

    weight [E, H]. With `selection_bias=True` a buffer `e_score_correction_bias` [E] (fp32, the
    DeepSeek-V3 name) shifts the selection scores only: update it for aux-loss-free load balancing
    (MoE.update_selection_bias does the usual sign rule)."""

    def __init__(self, hidden_size, num_experts, top_k, *, score_func="softmax", norm_topk_prob=True, n_group=1,
                 topk_group=1, routed_scaling_factor=1.0, selection_bias=False, device=None, dtype=None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"mok: top_k must be in [1, num_experts={num_experts}], got {top_k}")
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"mok: score_func must be 'softmax' or 'sigmoid', got {score_func!r}")
        if n_group > 1 and num_experts % n_group:
            raise ValueError(f"mok: num_experts={num_experts} must be divisible by n_group={n_group}")
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.score_func, self.norm_topk_prob = score_func, norm_topk_prob
        self.n_group, self.topk_group, self.routed_scaling_factor = n_group, topk_group, routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        if selection_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device))
        else:
            self.e_score_correction_bias = None
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x):
        """x [T, H] -> (topk_idx [T, K] int32, topk_w [T, K] fp32, logits [T, E] fp32).
        (float64 inputs keep float64 router math, for gradient checks.)"""
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast(x.device.type, enabled=False):  # router logits in fp32 even under AMP
            logits = F.linear(x.to(acc), self.weight.to(acc))
        idx, w = functional.route_topk(logits, self.top_k, bias=self.e_score_correction_bias,
                                       score_func=self.score_func, n_group=self.n_group,
                                       topk_group=self.topk_group, renormalize=self.norm_topk_prob,
                                       scaling=self.routed_scaling_factor)
        return idx, w, logits


class GroupedExperts(nn.Module):
    """The routed experts: gate_up_proj [E, 2I, H] (gate rows, then up rows) and down_proj [E, H, I],
    each expert in nn.Linear layout (the transformers v5 layout). forward(x [T, H], topk_idx [T, K],
    topk_w [T, K]) -> [T, H]. recipe: "bf16", "blockwise" (FP8 forward GEMMs) or "mxfp8" (every
    expert GEMM on MXFP8-rounded operands, computed exactly on the BF16 kernels); see
    mok.functional.moe_experts. With recipe="blockwise", fp8_dgrad=True also runs the backward's two
    dgrad GEMMs in FP8 and fp8_wgrad=True (or "tiled") its two weight-gradient GEMMs (either, or both)."""

    def __init__(self, num_experts, hidden_size, intermediate_size, *, skip_invalid=False, recipe="bf16",
                 fp8_dgrad=False, fp8_wgrad=False, device=None, dtype=None):
        super().__init__()
        _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.skip_invalid, self.recipe = skip_invalid, recipe
        self.fp8_dgrad = bool(fp8_dgrad)
        self.fp8_wgrad = fp8_wgrad if fp8_wgrad == "tiled" else bool(fp8_wgrad)
        kw = dict(device=device, dtype=dtype)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **kw))
        self.reset_parameters()

    def reset_parameters(self):
        # The nn.Linear default, per expert: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        nn.init.uniform_(self.gate_up_proj, -1 / math.sqrt(self.hidden_size), 1 / math.sqrt(self.hidden_size))
        bound = 1 / math.sqrt(max(1, self.intermediate_size))
        nn.init.uniform_(self.down_proj, -bound, bound)

    def forward(self, x, topk_idx, topk_w, plan: Optional[functional.Plan] = None):
        return functional.moe_experts(x, topk_idx, topk_w, self.gate_up_proj, self.down_proj,
                                      skip_invalid=self.skip_invalid, plan=plan, recipe=self.recipe,
                                      fp8_dgrad=self.fp8_dgrad, fp8_wgrad=self.fp8_wgrad)


class SharedExpertMLP(nn.Module):
    """A dense SwiGLU MLP every token goes through (DeepSeek / Qwen2-MoE shared experts)."""

    def __init__(self, hidden_size, intermediate_size, *, device=None, dtype=None):
        super().__init__()
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """A Mixture-of-Experts layer: router, routed experts and optional shared experts.

    forward(x [..., H]) -> [..., H]. After each forward, `router_logits` ([T, E] fp32) holds the
    router's logits (for auxiliary losses) and `tokens_per_expert` ([E] fp32 buffer) has the step's
    per-expert counts added in training (for bias-based balancing); both stay on the device."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k, *, score_func="softmax",
                 norm_topk_prob=True, n_group=1, topk_group=1, routed_scaling_factor=1.0, num_shared_experts=0,
                 shared_intermediate_size=None, selection_bias=False, ep=None, recipe="bf16", fp8_dgrad=False,
                 fp8_wgrad=False, device=None, dtype=None):
        """ep: a mok.ExpertParallel (or VirtualExpertParallel) group: the experts are sharded over it
        (rank r holds experts [r E/W, (r+1) E/W)) and forward and backward exchange tokens through
        it. The router and the shared experts stay replicated; each rank routes its own tokens.
        recipe: "bf16" (default), "blockwise" (the routed experts' forward GEMMs in FP8 E4M3 with
        DeepSeek-V3's block scales, backward in BF16) or "mxfp8" (MXFP8 numerics on the BF16 kernels),
        with or without ep (the exchange moves bf16 rows). fp8_dgrad / fp8_wgrad (with
        recipe="blockwise"): the backward's dgrad / weight-gradient GEMMs of the routed experts in FP8
        too (see mok.functional.moe_experts)."""
        super().__init__()
        _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad)
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.router = TopKRouter(hidden_size, num_experts, top_k, score_func=score_func,
                                 norm_topk_prob=norm_topk_prob, n_group=n_group, topk_group=topk_group,
                                 routed_scaling_factor=routed_scaling_factor, selection_bias=selection_bias,
                                 device=device, dtype=dtype)
        if ep is None:
            self.experts = GroupedExperts(num_experts, hidden_size, intermediate_size, recipe=recipe,
                                          fp8_dgrad=fp8_dgrad, fp8_wgrad=fp8_wgrad, device=device, dtype=dtype)
        else:
            from .ep import ExpertParallelExperts

            if ep.num_experts != num_experts or ep.top_k != top_k or ep.hidden_size != hidden_size:
                raise ValueError("mok: MoE(ep=...) needs a group made for the same num_experts, top_k and hidden_size")
            self.experts = ExpertParallelExperts(ep, hidden_size, intermediate_size, recipe=recipe, fp8_dgrad=fp8_dgrad,
                                                 fp8_wgrad=fp8_wgrad, device=device, dtype=dtype)
        self.ep = ep
        self.shared_experts = None
        if num_shared_experts or shared_intermediate_size:
            size = shared_intermediate_size or intermediate_size * num_shared_experts
            self.shared_experts = SharedExpertMLP(hidden_size, size, device=device, dtype=dtype)
        self.register_buffer("tokens_per_expert", torch.zeros(num_experts, device=device), persistent=False)
        self.router_logits = None

    def forward(self, x):
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"mok: x.shape[-1] must be hidden_size={self.hidden_size}, got shape {tuple(x.shape)}")
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        idx, w, logits = self.router(x2)
        plan = functional.moe_plan(idx, self.num_experts)
        y = self.experts(x2, idx, w, plan=plan)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x2)
        self.router_logits = logits
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert.add_(plan.counts.to(self.tokens_per_expert.dtype))
        return y.reshape(shape)

    @torch.no_grad()
    def update_selection_bias(self, rate=1e-3):
        """Aux-loss-free balancing (DeepSeek-V3): move each expert's selection bias by `rate` towards
        the mean load (up when under-loaded), then reset the counts. Call once per optimizer step."""
        bias = self.router.e_score_correction_bias
        if bias is None:
            raise ValueError("mok: update_selection_bias needs MoE(..., selection_bias=True)")
        counts = self.tokens_per_expert
        delta = rate * torch.sign(counts.mean() - counts)
        bias.add_(delta - delta.mean())
        counts.zero_()
