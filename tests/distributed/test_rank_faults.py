"""A rank that fails ends its cell within the failure policy's bound, on the local executor:
two gloo ranks of a distributed cell through run_job (submitit's local executor), one fault
per test (tests/distributed/fault_worker.py), and for each: the time from the fault to
the job's end, the record (status, which rank, how) and that no process of the cell is
left (each rank's pid and process group, and its supervisor).

The policy is short here (FAILURE_TIMEOUT_S: a collective waits 8 s) so that the tests are; the default bound is
60 s (flashwatt.submit.failure_policy).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cell_processes import assert_nothing_left, fault_time
from flashwatt.distributed.cell import DistributedCell
from flashwatt.submit.failure_policy import ENV_FAILURE_TIMEOUT, ENV_STOP_GRACE, FailurePolicy

pytestmark = pytest.mark.slow  # a supervisor and two gloo ranks per test, each importing torch

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
FAILURE_TIMEOUT_S, STOP_GRACE_S = 18.0, 2.0
POLICY = FailurePolicy(FAILURE_TIMEOUT_S, STOP_GRACE_S)
CELL = DistributedCell("t", "zigzag", "math", "fp64", 2, 16, 1, 4, 2, 8, True, "fwd_bwd")


def _spec(kind: str, rank: int, marks: Path) -> dict:
    return CELL.spec(repeats=2, warmup=1, measure={"energy": False}, single_gpu=False,
                     fault={"kind": kind, "rank": rank, "marks": str(marks)})


@pytest.fixture
def cell_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, str(FAILURE_TIMEOUT_S))
    monkeypatch.setenv(ENV_STOP_GRACE, str(STOP_GRACE_S))
    monkeypatch.setenv("FLASHWATT_POLL_S", "0.2")  # the waiting side notices the job's end sooner
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")]))
    marks = tmp_path / "marks"
    marks.mkdir()
    return marks


def _run_cell(kind: str, rank: int, marks: Path, tmp_path: Path) -> tuple[dict, float]:
    from flashwatt.distributed.cell_run import run_distributed_cell
    from flashwatt.submit.jobs import run_job

    outcome = run_job(run_distributed_cell, CELL, _spec(kind, rank, marks), rank_job="fault_worker:job_with_fault",
                      job_name=f"fault-{kind}", folder=tmp_path / "submitit", executor="local",
                      resources={"gpus": 1, "tasks": 1}, log_path=tmp_path / "cell.log")
    return outcome.record, time.time()


CASES = [
    # kind, faulty rank, status, how, what the reason names
    ("sigkill", 1, "job_failed", "signal", "killed by SIGKILL"),
    ("oom", 1, "oom", "oom", "raised OutOfMemoryError"),
    ("backend_error", 1, "error", "exception", "Cannot use ReduceOp.BAND"),
    ("never_joins", 1, "error", "timeout", "did not answer"),
    ("hang", 1, "error", "timeout", "did not answer"),
    ("hang_in_collective", 1, "error", "timeout", "did not answer"),
    ("fail_beside_blocked", 0, "error", "exception", "raised ValueError"),
]


@pytest.mark.parametrize("kind, rank, status, how, says", CASES, ids=[c[0] for c in CASES])
def test_a_failed_rank_ends_the_cell_in_bounded_time_and_is_recorded(kind, rank, status, how, says, cell_env,
                                                                     tmp_path):
    record, ended = _run_cell(kind, rank, cell_env, tmp_path)
    after_fault = ended - fault_time(cell_env)
    print(f"{kind}: ended {after_fault:.1f} s after the fault; {record['status']}: {record['reason']}")
    assert after_fault <= POLICY.failure_timeout_s, f"{kind}: the cell ended {after_fault:.1f} s after the fault"
    assert record["status"] == status, (record["status"], record.get("reason"))
    ranks = record["ranks"]
    assert ranks["failed"] and ranks["how"] == how, ranks
    assert says in record["reason"], record["reason"]
    if how == "timeout":
        # The waiting rank raised; the rank that hung (or never joined) is named as not answering.
        assert ranks["not_answering"] == [rank] and ranks["failed_rank"] == 1 - rank, ranks
    else:
        assert ranks["failed_rank"] == rank, ranks
    states = {r["rank"]: r["state"] for r in ranks["per_rank"]}
    assert states[ranks["failed_rank"]] in ("signal", "raised")
    if kind == "sigkill":
        assert ranks["per_rank"][rank]["signal"] == "SIGKILL"
    if kind in ("oom", "backend_error", "fail_beside_blocked"):
        assert record["traceback"] and "fault_worker.py" in record["traceback"]
        # what the rank printed reaches the cell's log (each rank's stderr goes through a file)
        assert f"{says.split()[-1]}" in (tmp_path / "cell.log").read_text()
    blocked = rank if how == "timeout" else 1 - rank
    if kind in ("hang", "never_joins"):
        assert states[blocked] == "stopped", states  # only the supervisor could end it
    if kind in ("hang_in_collective", "fail_beside_blocked"):
        # Blocked in a receive: the supervisor stops it, unless gloo tells it first that its
        # peer is gone (the peer's exit closes the connection); either way it is over.
        blocked_rank = ranks["per_rank"][blocked]
        assert states[blocked] == "stopped" or "Connection closed" in blocked_rank["message"], blocked_rank
    assert_nothing_left(cell_env)


def test_a_cell_without_a_fault_ends_ok_with_every_rank_accounted_for(cell_env, tmp_path):
    record, _ = _run_cell("none", 1, cell_env, tmp_path)
    assert record["status"] == "ok", record.get("reason")
    ranks = record["ranks"]
    assert not ranks["failed"] and [r["state"] for r in ranks["per_rank"]] == ["ok", "ok"]
    assert ranks["policy"]["collective_timeout_s"] == POLICY.collective_timeout_s
    assert record["result"]["check"]["passed"]
    assert_nothing_left(cell_env)


CTRL_C_SCRIPT = """
import sys
from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.cell_run import run_distributed_cell
from flashwatt.submit.jobs import run_job
cell = DistributedCell("t", "zigzag", "math", "fp64", 2, 16, 1, 4, 2, 8, True, "fwd_bwd")
spec = cell.spec(repeats=2, warmup=1, measure={"energy": False}, single_gpu=False,
                 fault={"kind": "hang", "rank": 1, "marks": sys.argv[1]})
run_job(run_distributed_cell, cell, spec, rank_job="fault_worker:job_with_fault", job_name="ctrl-c",
        folder=sys.argv[2], executor="local", resources={"gpus": 1, "tasks": 1}, log_path=sys.argv[3])
"""


def test_ctrl_c_of_a_run_leaves_no_rank_alive(cell_env, tmp_path, monkeypatch):
    # A bound far beyond the test: only the interrupt can end this cell.
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, "600")
    run = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, str(cell_env), str(tmp_path / "submitit"),
                            str(tmp_path / "cell.log")], start_new_session=True)
    deadline = time.time() + 120
    while not (cell_env / "fault.json").exists():
        assert run.poll() is None and time.time() < deadline, "the cell never reached its fault"
        time.sleep(0.2)
    time.sleep(1.0)  # the other rank is in its barrier now
    os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
    try:
        code = run.wait(timeout=POLICY.failure_timeout_s)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert code != 0
    # The run has ended; its cell's processes end within the bound (each supervisor got the
    # SIGINT too and stops its ranks, SIGKILL `stop_grace_s` later; its controller kills it).
    assert_nothing_left(cell_env, grace_s=POLICY.failure_timeout_s)
