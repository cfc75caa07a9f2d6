"""What every test folder shares: a test marked `nvcc` needs the CUDA compiler and one marked
`browser` needs Chromium and its driver; each fails, never skips, without them (CI has nvcc
and installs Chromium; deselect such tests with -m "not nvcc", -m "not browser")."""
from __future__ import annotations

import pytest

from support import find_nvcc


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("browser"):
        from browser_pages import browser_binaries

        if None in browser_binaries():
            pytest.fail("this test opens a page in headless Chromium: install the distribution's chromium and "
                        "chromium-driver (bash .ci/chromium.sh, as root), or deselect with -m \"not browser\"",
                        pytrace=False)
    if item.get_closest_marker("nvcc") and find_nvcc() is None:
        pytest.fail("this test needs nvcc, the CUDA compiler: none on PATH, in $CUDA_HOME/bin or "
                    "/usr/local/cuda/bin; install the CUDA toolkit, or deselect with -m \"not nvcc\"", pytrace=False)
