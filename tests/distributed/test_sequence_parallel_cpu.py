"""Sequence-parallel attention on CPU: gloo, 2, 3 and 4 processes, float64 blocks.

One spawned process group per world size runs every case (ring, zigzag, Ulysses; hybrid
on a 2 x 2 mesh and the default mesh with 4; causal and full; GQA, MQA) forward and
backward, and the bad inputs. Output, dQ, dK, dV must match a single-process float64
reference to 1e-10 relative.
"""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

import sp_worker
from support import free_ports

pytestmark = pytest.mark.slow  # a gloo process group per world size, each rank importing torch

TOLERANCE = 1e-10


@pytest.fixture(scope="module", params=[2, 3, 4])
def report(request, tmp_path_factory):
    world = request.param
    path = tmp_path_factory.mktemp(f"world{world}") / "report.json"
    mp.spawn(sp_worker.main, args=(world, free_ports()[0], str(path)), nprocs=world, join=True)
    return world, json.loads(path.read_text())


def test_every_case_ran_and_matches_float64(report):
    world, result = report
    assert not result["failures"], "\n".join(f"{k}:\n{v}" for k, v in result["failures"].items())
    expected = {c[0] for c in sp_worker.cases(world)}
    assert set(result["errors"]) == expected
    bad = {name: err for name, err in result["errors"].items() if not err <= TOLERANCE}
    assert not bad, f"world {world}: relative error above {TOLERANCE}: {bad}"


def test_bad_inputs_raise_errors_that_name_the_problem(report):
    world, result = report
    problems = {k: v for k, v in result["bad_inputs"].items()
                if v.startswith("MISSING") or v == "NO ERROR RAISED"}
    assert not problems, f"world {world}: {problems}"
