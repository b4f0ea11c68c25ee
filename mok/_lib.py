"""Loads mok's compiled library (mok/_C*.so), which registers the torch.ops.mok operators."""
import glob
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load() -> str:
    candidates = sorted(glob.glob(os.path.join(_HERE, "_C*.so")) + glob.glob(os.path.join(_HERE, "_C*.pyd")))
    if not candidates:
        raise ImportError(
            "mok's compiled library (mok/_C*.so) was not found: build it with "
            "`pip install --no-build-isolation -e .` in the mok checkout"
        )
    torch.ops.load_library(candidates[0])
    return candidates[0]


LIBRARY_PATH = _load()


def has_cuda_kernels() -> bool:
    """True when the library was built with the CUDA kernels."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("mok::grouped_mm", "CUDA")
