"""mok.swap_moe: put mok's kernels under an existing model, in place."""
from torch import nn

from . import _fp8_experts
from .integrations import hf, torchtitan


def _set_child(model: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def swap_moe(model: nn.Module, *, skip_invalid: bool = False, recipe: str = "bf16", fp8_dgrad: bool = False,
             fp8_wgrad=False) -> int:
    """Replaces, in place, the routed experts of every MoE layer mok recognises:

    - Hugging Face transformers v5 experts modules (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
      DeepSeek-V3, ...: `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`), by MokHFExperts;
    - torchtitan-style grouped experts (`w1`, `w2`, `w3`), by MokTitanGroupedExperts.

    The new modules hold the same Parameter objects under the same names, so state_dict keys and
    optimizer state carry over; routers, their hooks and shared experts are left untouched.
    `skip_invalid=True` makes expert ids outside [0, E) mark pairs to skip (the transformers
    expert-parallel convention); otherwise they are an error. A recognised module mok cannot run
    (gpt-oss: transposed, biased, clamped SwiGLU experts) raises a ValueError naming it: nothing
    is skipped silently. recipe, fp8_dgrad, fp8_wgrad: the routed experts' numerics, as in
    mok.functional.moe_experts ("blockwise" FP8 needs a bf16 model with hidden and expert intermediate
    sizes multiples of 128, checked at the first forward). Returns the number of modules replaced."""
    _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad, "mok.swap_moe")
    options = dict(recipe=recipe, fp8_dgrad=fp8_dgrad, fp8_wgrad=fp8_wgrad)
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, (hf.MokHFExperts, torchtitan.MokTitanGroupedExperts)):
            continue
        if hf.is_hf_experts(module):
            hf.check_supported(module, name)
            targets.append((name, hf.MokHFExperts(module, skip_invalid=skip_invalid, **options)))
        elif torchtitan.is_titan_grouped_experts(module):
            torchtitan.check_supported(module, name)
            targets.append((name, torchtitan.MokTitanGroupedExperts(module, **options)))
    for name, new in targets:
        if not name:
            raise ValueError("mok.swap_moe: the model itself is an experts module; swap its parent instead")
        _set_child(model, name, new)
    return len(targets)
