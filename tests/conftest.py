import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


# Devices every op test runs on: the CPU always, the GPU when there is one (marked "gpu").
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def _fresh_seed():
    # Fresh random inputs each run; the seed is printed on failure so a case can be replayed.
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed
