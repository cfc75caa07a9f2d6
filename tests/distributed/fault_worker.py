"""A rank of a distributed cell with a fault put into it: what tests/distributed/test_rank_faults.py
runs on every rank (the rank supervisor starts it as the cell's rank job).

`job_with_fault(spec)` takes the fault out of spec["fault"] ({"kind": ..., "rank": r, "marks": folder})
and runs flashwatt.distributed.job.job on the rest. Every rank writes its pid, its parent's
pid (the supervisor) and its process group into marks/rank<R>.json first; the faulty rank
writes the moment of its fault to marks/fault.json (a rank that never joins: the moment
the others begin their rendezvous is in their own marks). Faults, on rank `rank`, at its first
timed call (every other rank then waits in the barrier before its own):

    sigkill              the rank kills itself with SIGKILL
    oom                  torch.OutOfMemoryError
    backend_error        a collective the backend refuses (gloo: BAND over floats)
    never_joins          the rank never reaches the rendezvous (sleeps before the job starts)
    hang                 the rank sleeps forever, outside any collective
    hang_in_collective   the rank waits forever inside a receive nobody sends to, on a group
                         whose own timeout is an hour (it never times out by itself; gloo may
                         end it once a peer's exit closes the connection)
    fail_beside_blocked  the rank raises ValueError while every other rank is blocked inside
                         such a receive
"""
from __future__ import annotations

import datetime
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

FOREVER_S = 3600


def _mark(folder: str, name: str, data: dict) -> None:
    path = Path(folder) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _faulty(kind: str, faulty_rank: int, marks: str, timed):
    calls = {"n": 0}

    def median_ms(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            return timed(*args, **kwargs)
        rank = dist.get_rank()
        if kind in ("hang_in_collective", "fail_beside_blocked"):
            # Collective: every rank makes the group; its timeout is far beyond the test's bound.
            patient = dist.new_group(list(range(dist.get_world_size())), timeout=datetime.timedelta(hours=1))
        if rank != faulty_rank:
            if kind == "fail_beside_blocked":
                dist.recv(torch.zeros(4, dtype=torch.float64), src=faulty_rank, group=patient)
            return timed(*args, **kwargs)
        _mark(marks, "fault.json", {"kind": kind, "rank": rank, "time": time.time()})
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (a test's fault)")
        elif kind == "backend_error":
            dist.all_reduce(torch.ones(4, dtype=torch.float64), op=dist.ReduceOp.BAND)
        elif kind == "hang":
            time.sleep(FOREVER_S)
        elif kind == "hang_in_collective":
            source = (rank + 1) % dist.get_world_size()
            dist.recv(torch.zeros(4, dtype=torch.float64), src=source, group=patient)
        elif kind == "fail_beside_blocked":
            raise ValueError("a bug on this rank (a test's fault)")
        return timed(*args, **kwargs)

    return median_ms


def job_with_fault(spec: dict):
    import flashwatt.distributed.job as distributed_job

    spec = dict(spec)
    fault = spec.pop("fault")
    rank = int(os.environ["RANK"])
    _mark(fault["marks"], f"rank{rank}.json", {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                                                "time": time.time()})
    if rank == fault["rank"] and fault["kind"] == "never_joins":
        _mark(fault["marks"], "fault.json", {"kind": fault["kind"], "rank": rank, "time": time.time()})
        time.sleep(FOREVER_S)
    torch.set_num_threads(1)
    distributed_job.median_ms = _faulty(fault["kind"], fault["rank"], fault["marks"], distributed_job.median_ms)
    return distributed_job.job(spec)


def measure_with_fault(cell, spec: dict):
    """A multi-GPU model cell's rank (flashwatt.models.parallel_job.measure_on_rank) whose
    rank spec["fault"]["rank"] runs out of memory in its timed steps, while the others go on
    to the collective after them."""
    import flashwatt.models.step as step
    from flashwatt.models.parallel_job import measure_on_rank

    spec = dict(spec)
    fault = spec.pop("fault")
    rank = int(os.environ["RANK"])
    _mark(fault["marks"], f"rank{rank}.json", {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                                                "time": time.time()})
    if rank == fault["rank"]:
        def out_of_memory(*_args, **_kwargs):
            _mark(fault["marks"], "fault.json", {"kind": "oom", "rank": rank, "time": time.time()})
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB (a test's fault)")

        step.time_steps = out_of_memory
    return measure_on_rank(cell, spec)
