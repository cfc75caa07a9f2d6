"""GPU tests: marked `gpu`, selected with `-m gpu` on a GPU machine (tests/gpu/run_on_device.sh).

CI deselects them with `-m "not gpu"`. Where they are selected they must run: without a
CUDA device each one fails with a message, never skips, so a broken driver on a GPU
node cannot pass for a green run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parents[2] / "src"
if str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _cuda_device():
    import torch

    if not torch.cuda.is_available():
        pytest.fail("GPU test without a visible CUDA device: run it on a GPU machine (tests/gpu/run_on_device.sh)")
