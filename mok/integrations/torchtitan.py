"""torchtitan-style grouped experts: a module with w1 [E, I, H] (gate), w3 [E, I, H] (up) and
w2 [E, H, I] (down) whose forward takes tokens already sorted by expert and the per-expert counts:
forward(x [N, H], num_tokens_per_expert [E]) -> [N, H]."""
import torch
from torch import nn

from .. import _fp8_experts, functional


def is_titan_grouped_experts(module: nn.Module) -> bool:
    ws = [getattr(module, n, None) for n in ("w1", "w2", "w3")]
    return all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in ws)


def check_supported(module: nn.Module, name: str = "experts") -> None:
    w1, w2, w3 = module.w1, module.w2, module.w3
    E, I, H = w1.shape
    if tuple(w3.shape) != (E, I, H) or tuple(w2.shape) != (E, H, I):
        raise ValueError(
            f"mok cannot run the grouped experts {name} ({type(module).__name__}): expected w1, w3 [E, I, H] and "
            f"w2 [E, H, I], got w1 {tuple(w1.shape)}, w3 {tuple(w3.shape)}, w2 {tuple(w2.shape)}"
        )


class MokTitanGroupedExperts(nn.Module):
    """Drop-in for torchtitan's GroupedExperts, holding the same w1/w2/w3 Parameter objects."""

    def __init__(self, original: nn.Module, *, recipe: str = "bf16", fp8_dgrad: bool = False, fp8_wgrad=False):
        super().__init__()
        _fp8_experts.check_recipe_options(recipe, fp8_dgrad, fp8_wgrad, "mok.integrations.torchtitan.MokTitanGroupedExperts")
        self.w1, self.w2, self.w3 = original.w1, original.w2, original.w3
        self.num_experts = original.w1.shape[0]
        self.original_class = type(original).__name__
        # the experts' numerics (mok.functional.moe_experts' options); under the FP8 / MXFP8 recipes the
        # w1 / w3 pair's codes are cached per version of both, as a single weight's are
        self.recipe, self.fp8_dgrad, self.fp8_wgrad = recipe, fp8_dgrad, fp8_wgrad

    def forward(self, x, num_tokens_per_expert):
        N = x.shape[0]
        E = self.num_experts
        # Rows arrive sorted by expert: row r belongs to the expert whose count segment holds it.
        # output_size keeps repeat_interleave free of a host sync.
        ids = torch.repeat_interleave(torch.arange(E, device=x.device, dtype=torch.int32),
                                      num_tokens_per_expert.to(torch.int64), output_size=N)
        ones = torch.ones(N, 1, device=x.device, dtype=torch.float32)
        # w1 and w3 go in as a pair: the kernels read them (and write their gradients) where they are,
        # with no [E, 2I, H] copy per call (functional.moe_experts says when one is made).
        return functional.moe_experts(x, ids[:, None], ones, (self.w1, self.w3), self.w2, recipe=self.recipe,
                                      fp8_dgrad=self.fp8_dgrad, fp8_wgrad=self.fp8_wgrad).to(x.dtype)

    def extra_repr(self):
        recipe = "" if self.recipe == "bf16" else (f", recipe={self.recipe!r}, fp8_dgrad={self.fp8_dgrad}, "
                                                   f"fp8_wgrad={self.fp8_wgrad!r}")
        return f"num_experts={self.num_experts}, replaces={self.original_class}{recipe}"
