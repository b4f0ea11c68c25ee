"""Hugging Face transformers v5: the routed experts of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
DeepSeek-V3 (and any `@use_experts_implementation` experts module with the same layout).

Two ways in:
- `mok.swap_moe(model)` replaces each experts module by a `MokHFExperts` that holds the same
  Parameter objects under the same names (so state_dict keys, optimizers and checkpoints are
  unchanged); the router (`mlp.gate`), its hooks and the shared experts stay as they are.
- `register()` adds "mok" to transformers' ExpertsInterface, so
  `from_pretrained(..., experts_implementation="mok")` uses mok without swapping modules (BF16:
  the interface passes no options; `swap_moe(model, recipe=...)` takes the FP8 / MXFP8 recipes).
"""
import torch
from torch import nn

from .. import _fp8_experts, functional


def is_hf_experts(module: nn.Module) -> bool:
    """A transformers v5 experts module: 3-D gate_up_proj / down_proj (or up_proj) parameters and the
    layout flags set by @use_experts_implementation."""
    return (
        hasattr(module, "is_transposed")
        and hasattr(module, "has_gate")
        and isinstance(getattr(module, "down_proj", None), torch.Tensor)
        and getattr(module, "down_proj").dim() == 3
    )


def _is_silu(act) -> bool:
    if isinstance(act, nn.SiLU):
        return True
    name = type(act).__name__.lower()
    return name in ("siluactivation", "silu", "swish")


def _has_custom_gate(module: nn.Module) -> bool:
    gate = getattr(type(module), "_apply_gate", None)
    if gate is None:
        return False
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # not a transformers module: no gate hook to honour
        return True
    return gate is not _default_apply_gate


def check_supported(module: nn.Module, name: str = "experts") -> None:
    """Raises a ValueError saying why mok cannot run this experts module."""
    why = []
    if getattr(module, "is_transposed", False):
        why.append("is_transposed=True (weights stored [E, H, 2I]; mok needs [E, 2I, H])")
    if not getattr(module, "is_concatenated", True):
        why.append("is_concatenated=False (interleaved gate/up columns)")
    if getattr(module, "has_bias", False):
        why.append("has_bias=True (expert biases)")
    if not getattr(module, "has_gate", True):
        why.append("has_gate=False (no gated activation)")
    if not _is_silu(getattr(module, "act_fn", None)):
        why.append(f"activation {type(getattr(module, 'act_fn', None)).__name__} (mok implements SiLU-gated SwiGLU)")
    if _has_custom_gate(module):
        why.append("a custom _apply_gate (e.g. gpt-oss clamped SwiGLU)")
    gate_up = getattr(module, "gate_up_proj", None)
    if not isinstance(gate_up, torch.Tensor) or gate_up.dim() != 3:
        why.append("no 3-D gate_up_proj parameter")
    if why:
        raise ValueError(f"mok cannot run the experts module {name} ({type(module).__name__}): " + "; ".join(why))


class MokHFExperts(nn.Module):
    """Drop-in for a transformers v5 experts module: forward(hidden_states [T, H], top_k_index [T, K],
    top_k_weights [T, K]) -> [T, H], computed by mok. Holds the original Parameter objects."""

    def __init__(self, original: nn.Module, *, skip_invalid: bool = False, recipe: str = "bf16",
                 fp8_dgrad: bool = False, fp8_wgrad=False):
        super().__init__()
        _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad, "mok.integrations.hf.MokHFExperts")
        self.gate_up_proj = original.gate_up_proj
        self.down_proj = original.down_proj
        self.num_experts = original.gate_up_proj.shape[0]
        self.skip_invalid = skip_invalid
        # the routed experts' numerics (mok.functional.moe_experts' recipe, fp8_dgrad, fp8_wgrad)
        self.recipe, self.fp8_dgrad, self.fp8_wgrad = recipe, fp8_dgrad, fp8_wgrad
        self.original_class = type(original).__name__
        # Attributes other code reads off an experts module.
        for attr in ("hidden_dim", "intermediate_dim", "act_fn", "config", "has_gate", "has_bias", "is_transposed",
                     "is_concatenated"):
            if hasattr(original, attr):
                setattr(self, attr, getattr(original, attr))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return mok_experts_forward(self, hidden_states, top_k_index, top_k_weights)

    def extra_repr(self):
        recipe = "" if self.recipe == "bf16" else (f", recipe={self.recipe!r}, fp8_dgrad={self.fp8_dgrad}, "
                                                   f"fp8_wgrad={self.fp8_wgrad!r}")
        return f"num_experts={self.num_experts}, replaces={self.original_class}, skip_invalid={self.skip_invalid}{recipe}"


def mok_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The ExpertsInterface signature. Sentinel ids >= num_experts (transformers' expert-parallel
    convention) are skipped when the module says so (MokHFExperts.skip_invalid), else an error. The
    recipe options come from the module (MokHFExperts: swap_moe's; BF16 otherwise)."""
    skip = getattr(self, "skip_invalid", False)
    y = functional.moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                               skip_invalid=skip, recipe=getattr(self, "recipe", "bf16"),
                               fp8_dgrad=getattr(self, "fp8_dgrad", False), fp8_wgrad=getattr(self, "fp8_wgrad", False))
    return y.to(hidden_states.dtype)


def _registry_forward(self, hidden_states, top_k_index, top_k_weights):
    # Through the registry, transformers' own expert-parallel sentinels (ids >= E) may appear.
    check_supported(self)
    y = functional.moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                               skip_invalid=True)
    return y.to(hidden_states.dtype)


def register() -> None:
    """Registers "mok" in transformers' ExpertsInterface (experts_implementation="mok")."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register("mok", _registry_forward)
