"""Build of mok: the C core (compiled as C11), the CUDA kernels (sm_90a) when a CUDA build of torch
and nvcc are present, and the thin C++ torch-op layer, linked into one library `mok/_C*.so` that
`mok/__init__.py` loads with torch.ops.load_library.

    pip install --no-build-isolation -e .      # CUDA where possible, CPU-only otherwise
    MOK_FORCE_CPU=1 pip install ...            # CPU-only build even where CUDA is present
    MOK_NVCC_DEFINES="-DMOK_SM90_FP8_HALF_PIPE=8" pip install ...
                                               # kernels built with a compile-time experiment switched on
                                               # (docs/performance-log.md), e.g. to run the GPU suite on it
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def want_cuda() -> bool:
    if os.getenv("MOK_FORCE_CPU") == "1":
        return False
    if os.getenv("MOK_FORCE_CUDA") == "1":
        return True
    # A visible GPU is not needed to build, only a CUDA torch and nvcc.
    return CUDA_HOME is not None and torch.version.cuda is not None


def torch_libstdcxx():
    """The shared libstdc++ this (torch-importing) process has loaded, or None (not Linux).

    Linked explicitly so that the extension uses the same C++ runtime as torch. Some toolchains
    (seen on the H200 machine: /opt/gcc's g++ 13) link libstdc++.a by default; the extension then
    carries a private, partly initialised copy of the C++ runtime, and formatting a number in an
    error message (c10::str of an int64) crashed the process instead of raising."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libstdc++.so" in path and os.path.exists(path):
                    return path
    except OSError:
        pass
    return None


def rel(pattern: str) -> list:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


USE_CUDA = want_cuda()
CORE_SOURCES = rel("csrc/core/*.c")
TORCH_SOURCES = rel("csrc/torch/*.cpp")
CUDA_SOURCES = rel("csrc/cuda/**/*.cu")

cxx_flags = ["-O3"] + (["-DMOK_WITH_CUDA"] if USE_CUDA else [])
LIBSTDCXX = torch_libstdcxx()
link_flags = [LIBSTDCXX] if LIBSTDCXX else []
nvcc_flags = [
    "-O3",
    # NOTE: an explicit -gencode stops torch from adding its own arch flags; the sm_90a target is
    # what wgmma / setmaxnreg need (the -arch=sm_90a shorthand also runs a plain sm_90 pass).
    "-gencode=arch=compute_90a,code=sm_90a",
    "-lineinfo",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-DMOK_WITH_CUDA",
]


def experiment_defines() -> list:
    """MOK_NVCC_DEFINES: space-separated -DNAME[=VALUE] options added to the CUDA kernels' nvcc flags (the
    opt-in kernel experiments are compile-time switches). Anything else is refused, so that the variable
    cannot change how the library is built in other ways."""
    defines = os.getenv("MOK_NVCC_DEFINES", "").split()
    bad = [d for d in defines if not d.startswith("-D") or len(d) < 3]
    if bad:
        raise SystemExit(f"MOK_NVCC_DEFINES: expected -DNAME or -DNAME=VALUE options, got {bad}")
    return defines


nvcc_flags += experiment_defines()


class MokBuildExt(BuildExtension):
    """Compiles the C core with the C compiler (torch's ninja rules would compile .c as C++) and
    links the objects into the extension."""

    def build_extensions(self):
        objects = self.compiler.compile(
            CORE_SOURCES,
            output_dir=self.build_temp,
            extra_postargs=["-std=c11", "-O3", "-fPIC", "-ffp-contract=off", "-Wall", "-Wextra"],
        )
        for ext in self.extensions:
            ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extensions()


if USE_CUDA:
    ext = CUDAExtension(
        "mok._C",
        TORCH_SOURCES + CUDA_SOURCES,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=link_flags,
    )
else:
    ext = CppExtension("mok._C", TORCH_SOURCES, extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags)

setup(
    packages=find_packages(include=["mok", "mok.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": MokBuildExt.with_options(use_ninja=True)},
)
