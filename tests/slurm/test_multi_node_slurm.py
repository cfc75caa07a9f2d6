"""A distributed cell over two nodes through the CI's real Slurm (.ci/slurm/up.sh: two node
names on this one host, partition `nodes`): one task per node, each supervising two gloo
ranks, the rendezvous taken from Slurm's variables (SLURM_NODEID, SLURM_NNODES, and the
first host of SLURM_JOB_NODELIST through `scontrol show hostnames`), the hybrid strategy
with Ulysses inside each node and a ring across the two; then a rank killed on the second
node, which must end the step's tasks on both within the failure policy's bound.
"""
from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

import pytest

from cell_processes import assert_nothing_left, fault_time
from slurm_jobs import JOB_END_S, wait_while_job_lives
from support import wait_until
from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.cell_run import run_distributed_cell
from flashwatt.submit.failure_policy import ENV_FAILURE_TIMEOUT, ENV_STOP_GRACE
from flashwatt.submit.jobs import run_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm", "fast_wait")]

TESTS = Path(__file__).resolve().parents[1]
FAILURE_TIMEOUT_S = 20
CELL = DistributedCell("t", "hybrid", "math", "fp64", 4, 16, 1, 4, 2, 8, True, "fwd_bwd", nodes=2)


def _environment(monkeypatch, bound_s: float) -> None:
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, str(bound_s))
    monkeypatch.setenv(ENV_STOP_GRACE, "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS.parent / "src"), str(TESTS / "distributed"),
                                                      os.environ.get("PYTHONPATH", "")]))


def _run(kind: str, tmp_path: Path, monkeypatch) -> tuple[dict, Path, float]:
    _environment(monkeypatch, FAILURE_TIMEOUT_S)
    marks = tmp_path / "marks"
    marks.mkdir()
    spec = CELL.spec(repeats=1, warmup=0, measure={"energy": False}, single_gpu=False,
                     fault={"kind": kind, "rank": 3, "marks": str(marks)})
    outcome = run_job(run_distributed_cell, CELL, spec, rank_job="fault_worker:job_with_fault",
                      job_name=f"fw-test-nodes-{kind}-{uuid.uuid4().hex[:6]}", folder=tmp_path / "jobs",
                      executor="slurm",
                      resources={"slurm_partition": "nodes", "nodes": 2, "tasks": 1, "runtime": 5},
                      log_path=tmp_path / "cell.log")
    return outcome.record, marks, time.time()


def test_a_hybrid_cell_over_two_slurm_nodes(tmp_path, monkeypatch):
    record, marks, _ = _run("none", tmp_path, monkeypatch)
    assert record["status"] == "ok", record.get("reason")
    assert record["result"]["nodes"] == 2 and record["result"]["check"]["passed"]
    ranks = record["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks["per_rank"]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    # The step's tasks end together when one fails (flashwatt.submit.jobs.step_ending_srun_args).
    script = next((tmp_path / "jobs").rglob("*_submission.sh")).read_text()
    assert re.search(r"srun .*--kill-on-bad-exit=1 --wait=\d+", script), script
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert_nothing_left(marks, ranks=4, grace_s=15)


def test_a_rank_killed_on_the_second_slurm_node_ends_the_cell_on_both(tmp_path, monkeypatch):
    record, marks, ended = _run("sigkill", tmp_path, monkeypatch)
    assert ended - fault_time(marks) <= FAILURE_TIMEOUT_S
    assert record["status"] == "job_failed", record["reason"]
    assert record["ranks"]["failed_rank"] == 3 and record["ranks"]["how"] == "signal"
    assert next(r for r in record["ranks"]["per_rank"] if r["rank"] == 3)["node"] == 1
    assert_nothing_left(marks, ranks=4, grace_s=15)


CANCELLED_RUN = """
import sys
from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.cell_run import run_distributed_cell
from flashwatt.submit.jobs import run_job
cell = DistributedCell("t", "hybrid", "math", "fp64", 4, 16, 1, 4, 2, 8, True, "fwd_bwd", nodes=2)
spec = cell.spec(repeats=1, warmup=0, measure={"energy": False}, single_gpu=False,
                 fault={"kind": "hang", "rank": 3, "marks": sys.argv[1]})
run_job(run_distributed_cell, cell, spec, rank_job="fault_worker:job_with_fault", job_name=sys.argv[4],
        folder=sys.argv[2], executor="slurm", resources={"slurm_partition": "nodes", "nodes": 2, "tasks": 1,
        "runtime": 5}, log_path=sys.argv[3])
"""


def test_ctrl_c_of_a_two_node_run_scancels_it_and_leaves_no_rank_on_either(tmp_path, monkeypatch):
    """Ctrl-C while rank 3 hangs (a bound far beyond the test: only the interrupt ends the
    cell): the waiting process scancels the job, Slurm sends SIGTERM to the step's tasks,
    and each node's supervisor stops its ranks."""
    import signal
    import subprocess
    import sys

    _environment(monkeypatch, 600)
    marks = tmp_path / "marks"
    marks.mkdir()
    run = subprocess.Popen([sys.executable, "-c", CANCELLED_RUN, str(marks), str(tmp_path / "jobs"),
                            str(tmp_path / "cell.log"), f"fw-test-nodes-cancel-{uuid.uuid4().hex[:6]}"],
                           start_new_session=True)
    try:
        job_id = wait_until(lambda: _submitted(tmp_path / "cell.log"), 120, "the submission")
        wait_while_job_lives(job_id, lambda: (marks / "fault.json").exists(), "rank 3's fault")
        time.sleep(1.0)  # the other ranks are in their barrier now
        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=JOB_END_S) != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert "interrupted" in (tmp_path / "cell.log").read_text()
    assert_nothing_left(marks, ranks=4, grace_s=JOB_END_S)  # what Slurm itself allows a step to end in


def _submitted(log: Path) -> str:
    text = log.read_text() if log.exists() else ""
    match = re.search(r"submitted slurm job (\d+)", text)
    return match.group(1) if match else ""
