"""A cell over two nodes, on one host: two node supervisors (the two tasks of a Slurm job, one
per node, made here by setting Slurm's variables by hand), each with two gloo ranks. The
hybrid strategy runs Ulysses inside each node and a ring across the two; a rank killed on
the second node ends every rank of both, and the first node's record names it.

The same over the CI's real Slurm, two node names on one host: tests/slurm/test_multi_node_slurm.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cell_processes import assert_nothing_left, fault_time
from support import free_ports

# Two supervisors and four gloo ranks per test, each importing torch. Heavy: `make test` runs
# the same two cells over the real Slurm's two nodes (tests/slurm/test_multi_node_slurm.py).
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
NODE_TASK = """
import json, sys
from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.cell_run import run_distributed_cell
cell = DistributedCell("t", "hybrid", "math", "fp64", 4, 16, 1, 4, 2, 8, True, "fwd_bwd", nodes=2)
spec = cell.spec(repeats=1, warmup=0, measure={"energy": False}, single_gpu=False,
                 fault={"kind": sys.argv[1], "rank": 3, "marks": sys.argv[2]})
outcome = run_distributed_cell(cell, spec, rank_job="fault_worker:job_with_fault")
json.dump(None if outcome is None else outcome.record, open(sys.argv[3], "w"), default=str)
"""


def _two_nodes(kind: str, tmp_path: Path) -> tuple[dict | None, dict | None, float]:
    marks = tmp_path / "marks"
    marks.mkdir()
    port = free_ports(1)[0]
    runs = []
    for node in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
        env.update(SLURM_NODEID=str(node), SLURM_NNODES="2", SLURM_JOB_ID="4242", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), FLASHWATT_RANK_FAILURE_TIMEOUT_S="20", FLASHWATT_RANK_STOP_GRACE_S="2",
                   PYTHONPATH=os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")]))
        runs.append(subprocess.Popen([sys.executable, "-c", NODE_TASK, kind, str(marks), str(tmp_path / f"{node}.json")],
                                     env=env))
    try:
        for run in runs:
            assert run.wait(timeout=240) == 0
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    ended = time.time()
    first, second = (json.loads((tmp_path / f"{node}.json").read_text()) for node in (0, 1))
    return first, second, ended


def test_a_hybrid_cell_over_two_nodes_rings_across_them(tmp_path):
    record, other, _ = _two_nodes("none", tmp_path)
    assert other is None  # the second node's task returns nothing: the first writes the record
    assert record["status"] == "ok", record.get("reason")
    result = record["result"]
    assert result["world_size"] == 4 and result["nodes"] == 2 and result["check"]["passed"], result.get("check")
    ranks = record["ranks"]
    assert ranks["nodes"] == 2 and [(r["rank"], r["node"]) for r in ranks["per_rank"]] == [(0, 0), (1, 0), (2, 1),
                                                                                          (3, 1)]
    assert all(r["state"] == "ok" for r in ranks["per_rank"])
    assert_nothing_left(tmp_path / "marks", ranks=4)


def test_a_rank_killed_on_the_second_node_ends_both_and_is_named_by_the_first(tmp_path):
    record, other, ended = _two_nodes("sigkill", tmp_path)
    assert other is None
    assert ended - fault_time(tmp_path / "marks") <= 20
    assert record["status"] == "job_failed", record["reason"]
    ranks = record["ranks"]
    assert ranks["failed_rank"] == 3 and ranks["how"] == "signal", ranks
    dead = next(r for r in ranks["per_rank"] if r["rank"] == 3)
    assert dead["node"] == 1 and dead["signal"] == "SIGKILL"
    assert "rank 3" in record["reason"] and "killed by SIGKILL" in record["reason"]
    assert_nothing_left(tmp_path / "marks", ranks=4)
