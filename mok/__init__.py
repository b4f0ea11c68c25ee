"""mok: fused Mixture-of-Experts training kernels for Hopper GPUs, as a PyTorch extension.

    import mok
    layer = mok.MoE(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8)
    y = layer(x)                               # x [..., H]
    mok.swap_moe(hf_model)                     # put mok under a transformers v5 MoE model
"""
from . import _ops  # noqa: F401  (loads the library, registers fakes and autograd)
from . import fp8, fp8_gemm, functional, reference
from ._errors import check_errors
from ._lib import has_cuda_kernels
from .layers import MoE, GroupedExperts, SharedExpertMLP, TopKRouter
from .swap import swap_moe
from . import ep
from .ep import ExpertParallel, ExpertParallelExperts, VirtualExpertParallel

__version__ = "0.1.0"

__all__ = [
    "MoE",
    "GroupedExperts",
    "SharedExpertMLP",
    "TopKRouter",
    "swap_moe",
    "functional",
    "fp8",
    "fp8_gemm",
    "reference",
    "check_errors",
    "has_cuda_kernels",
    "ep",
    "ExpertParallel",
    "VirtualExpertParallel",
    "ExpertParallelExperts",
]
