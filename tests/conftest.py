"""What every test folder shares.

- A test marked `nvcc` needs the CUDA compiler and fails, never skips, without it (CI has
  nvcc; deselect such tests with -m "not nvcc").
- Parallel runs (pytest-xdist; `make test` runs `-n 3 --dist loadgroup`): the tests of a
  module that share a fixture wider than one test (a module-scoped workflow run, process
  group or nvcc build) run on one worker, so that fixture is made once, not once per
  worker; every other test goes wherever a worker is free. Tests marked `slurm` share one
  worker (group `slurm`): their jobs go to the test cluster one test after another. A module
  may name another group with `pytest.mark.xdist_group(name)`; tests of one group run on one
  worker. Groups with a test marked `slurm`, `slow` or `workflow` are handed out first, so
  that no long group starts last while the other workers sit idle (`make test` passes
  --no-loadscope-reorder, which keeps this order).
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
    if item.get_closest_marker("nvcc") and find_nvcc() is None:
        pytest.fail("this test needs nvcc, the CUDA compiler: none on PATH, in $CUDA_HOME/bin or "
                    "/usr/local/cuda/bin; install the CUDA toolkit, or deselect with -m \"not nvcc\"", pytrace=False)


def _group(item) -> str:
    if item.get_closest_marker("slurm") or "slurm" in item.path.parent.name:
        return "slurm"
    named = item.get_closest_marker("xdist_group")
    if named:
        return str(named.args[0] if named.args else named.kwargs.get("name", "default"))
    module = item.nodeid.split("::", 1)[0]
    if item.cls is not None or any(d.scope != "function" and d.baseid.startswith(module)
                                   for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs):
        return module  # shares a fixture of its module (or class) with its neighbours
    return item.nodeid  # on its own


def _rank(item) -> int:
    for rank, marker in enumerate(_FIRST):
        if item.get_closest_marker(marker) or (marker == "slurm" and _group(item) == "slurm"):
            return rank
    return len(_FIRST)


# tryfirst: xdist reads the xdist_group markers in its own hook of the same name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    groups: dict[str, int] = {}
    for item in items:
        group = _group(item)
        groups[group] = min(groups.get(group, len(_FIRST)), _rank(item))
        if group != item.nodeid and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    # A stable sort: each group keeps its tests' order, and the groups their collection order
    # within a rank. Module-scoped fixtures see their module's tests together, as before.
    order = {group: k for k, group in enumerate(dict.fromkeys(_group(item) for item in items))}
    items.sort(key=lambda item: (groups[_group(item)], order[_group(item)]))
