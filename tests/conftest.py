"""What every test folder shares.

- A test marked `nvcc` needs the CUDA compiler and one marked `browser` needs Chromium and
  its driver; each fails, never skips, without them (CI has nvcc and installs Chromium;
  deselect such tests with -m "not nvcc", -m "not browser").
- Parallel runs (pytest-xdist; `make test` runs `-n 3 --dist loadscope
  --no-loadscope-reorder`): each module is one unit of work, run whole on one worker, so a
  module-scoped fixture (a workflow run, a process group, an nvcc build) is made once, not
  once per worker; the Slurm tests (tests/slurm/) are one unit together, their jobs sent to
  the test cluster one test after another. Units with a test marked `slurm`, `slow` or
  `workflow` are handed out first, in that order, so that no long unit starts last while
  the other workers sit idle (--no-loadscope-reorder keeps this order).
- On a parallel worker, torch computes on one thread (OMP_NUM_THREADS=1, inherited by the
  jobs and processes a test starts).
"""
from __future__ import annotations

import os

import pytest

from support import find_nvcc

# Handed out first, in this order: the Slurm tests wait on jobs (their worker is mostly
# idle), then the long tiers; within a rank, collection order.
_FIRST = ("slurm", "slow", "workflow")


def pytest_configure(config):
    # On parallel workers, one compute thread each (torch's OpenMP pool, in the worker and in
    # what it starts: jobs, Snakemake, spawned ranks): the workers already fill the cores,
    # and pools of two threads per worker would spin against each other on two cores.
    # Set before the test modules import torch.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


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


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: `slurm` for the Slurm tests, else its module."""
    module = nodeid.split("::", 1)[0]
    return "slurm" if "slurm" in module.split("/")[:-1] else module


def _rank(item) -> int:
    return next((rank for rank, marker in enumerate(_FIRST) if item.get_closest_marker(marker)), len(_FIRST))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each unit's tests together, the units ranked by _FIRST, else in collection order (a
    stable sort: a module's tests keep their order, so its fixtures see them together)."""
    rank: dict[str, int] = {}
    first: dict[str, int] = {}
    for k, item in enumerate(items):
        unit = unit_of(item.nodeid)
        rank[unit] = min(rank.get(unit, len(_FIRST)), _rank(item))
        first.setdefault(unit, k)
    items.sort(key=lambda item: (rank[unit_of(item.nodeid)], first[unit_of(item.nodeid)]))


# Through xdist's scheduler hook rather than xdist_group marks: with pytest 9.2, xdist 3.8
# can no longer add a group to a test's id, and `--dist loadgroup` runs every test alone.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)
