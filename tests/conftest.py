"""What every test folder shares: a test marked `nvcc` needs the CUDA compiler and fails,
never skips, without it (CI has nvcc; deselect such tests with -m "not nvcc")."""
from __future__ import annotations

import pytest

from support import find_nvcc


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("nvcc") and find_nvcc() is None:
        pytest.fail("this test needs nvcc, the CUDA compiler: none on PATH, in $CUDA_HOME/bin or "
                    "/usr/local/cuda/bin; install the CUDA toolkit, or deselect with -m \"not nvcc\"", pytrace=False)
