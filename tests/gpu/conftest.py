"""GPU tests: marked `gpu`, selected with `-m gpu` on a GPU machine (tests/gpu/run_on_device.sh).

The policy, for every test in this folder: where they are selected they must run, so a
broken driver or a machine smaller than the test cannot pass for a green run. CI
deselects them with `-m "not gpu"`; nothing else decides that a GPU test does not run.

- No CUDA device, or fewer than a test's `@pytest.mark.gpus(n)` (default 1): the test
  fails, naming what it needs and what the machine shows.
- A tool the test needs is missing (nvcc: marker `nvcc`, tests/conftest.py;
  compute-sanitizer): the test fails naming it.
- torch is a dependency: imported, never importorskip'd.
- A feature the device lacks (wgmma before Hopper) is not a skip either: the test
  asserts the refusal the device must give instead.
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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # A hook, not an autouse fixture: module-scoped fixtures (an NVML handle) are set up
    # before function-scoped ones and would fail first with a less clear message.
    if not item.path.is_relative_to(Path(__file__).parent):
        return
    import torch

    marker = item.get_closest_marker("gpus")
    needed = marker.args[0] if marker else 1
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < needed:
        pytest.fail(f"GPU test needs {needed} CUDA device(s), this machine shows {visible}: run it on a GPU "
                    f"machine with enough of them (tests/gpu/run_on_device.sh)", pytrace=False)
