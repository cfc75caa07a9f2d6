"""A rank that fails ends an NCCL cell within the failure policy's bound, every process of it
gone and no GPU memory left held: the fault of issue 40 (one rank of a multi-GPU cell
SIGKILLed while the others sit in an NCCL collective), and a rank that hangs (the others
wait in NCCL until the watchdog ends them).

A distributed cell on every GPU of the machine (bf16, flash blocks) through run_job and
submitit's local executor, its ranks running tests/distributed/fault_worker.py. Needs at
least two GPUs (on fewer it fails, saying so: tests/gpu/conftest.py).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "distributed"))
WORLD = torch.cuda.device_count()
FAILURE_TIMEOUT_S, STOP_GRACE_S = 40.0, 3.0


def _gpu_pids() -> set[int]:
    """Every process NVML sees holding memory on a GPU of this machine."""
    import pynvml

    pynvml.nvmlInit()
    try:
        pids = set()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pids
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize("kind, status, how", [("sigkill", "job_failed", "signal"), ("hang", "error", "timeout")])
def test_a_failed_nccl_rank_ends_the_cell_and_frees_every_gpu(kind, status, how, tmp_path, monkeypatch):
    from cell_processes import assert_nothing_left, cell_processes, fault_time

    from flashwatt.distributed.cell import DistributedCell
    from flashwatt.distributed.cell_run import run_distributed_cell
    from flashwatt.submit.failure_policy import ENV_FAILURE_TIMEOUT, ENV_STOP_GRACE
    from flashwatt.submit.jobs import run_job

    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    monkeypatch.setenv("FLASHWATT_POLL_S", "0.2")
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, str(FAILURE_TIMEOUT_S))
    monkeypatch.setenv(ENV_STOP_GRACE, str(STOP_GRACE_S))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS.parent / "src"), str(TESTS / "distributed"),
                                                      os.environ.get("PYTHONPATH", "")]))
    marks = tmp_path / "marks"
    marks.mkdir()
    cell = DistributedCell("t", "zigzag", "flash", "bf16", WORLD, 16384, 1, 8, 2, 128, True, "fwd_bwd")
    spec = cell.spec(repeats=3, warmup=1, measure={"energy": False}, single_gpu=False, context_parallel=False,
                     fault={"kind": kind, "rank": 1, "marks": str(marks)})
    outcome = run_job(run_distributed_cell, cell, spec, rank_job="fault_worker:job_with_fault",
                      job_name=f"nccl-{kind}", folder=tmp_path / "submitit", executor="local",
                      resources={"gpus": WORLD, "tasks": 1}, log_path=tmp_path / "cell.log")
    ended = time.time()
    record = outcome.record
    print(kind, f"{ended - fault_time(marks):.1f} s after the fault", record["status"], record["reason"])
    print(json.dumps(record["ranks"], indent=1))
    assert ended - fault_time(marks) <= FAILURE_TIMEOUT_S
    assert record["status"] == status and record["ranks"]["how"] == how, record["ranks"]
    if how == "signal":
        assert record["ranks"]["failed_rank"] == 1
    else:
        assert record["ranks"]["not_answering"] == [1]
    assert_nothing_left(marks, ranks=WORLD)
    pids, _ = cell_processes(marks)
    time.sleep(1.0)  # NVML lists a process until the driver has released its context
    assert not pids & _gpu_pids(), "a process of the cell still holds GPU memory"
