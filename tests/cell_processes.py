"""What a test of a failing cell checks afterwards, from the marks its ranks wrote
(tests/distributed/fault_worker.py): when the fault happened, and that no process of the
cell (a rank, its supervisor, a member of a rank's process group) is left."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil


def cell_processes(marks: Path) -> tuple[set[int], set[int]]:
    """The pids (ranks and their supervisor) and process groups (the ranks') the cell had."""
    pids, groups = set(), set()
    for path in marks.glob("rank*.json"):
        rank = json.loads(path.read_text())
        pids |= {rank["pid"], rank["ppid"]}
        groups.add(rank["pgid"])
    return pids, groups


def alive_processes(pids: set[int], groups: set[int]) -> list[tuple[int, str]]:
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.pid in pids or os.getpgid(proc.pid) in groups:
                alive.append((proc.pid, " ".join(proc.cmdline())[:120]))
        except (psutil.Error, ProcessLookupError):
            continue
    return alive


def assert_nothing_left(marks: Path, ranks: int = 2, grace_s: float = 0.0) -> None:
    """No rank, supervisor or member of a rank's process group is alive, now or, with
    `grace_s`, within that many seconds (a Slurm job's task may still be exiting when its
    result is read; the ranks it supervised are gone before it writes one)."""
    pids, groups = cell_processes(marks)
    assert len(groups) == ranks, f"every rank should have written its mark: {sorted(marks.iterdir())}"
    deadline = time.monotonic() + grace_s
    alive = alive_processes(pids, groups)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = alive_processes(pids, groups)
    assert not alive, f"processes of the cell still alive: {alive}"


def fault_time(marks: Path) -> float:
    """When the cell began to wait on the fault: the fault itself, or, for a rank that never
    joins, the moment the others went into the rendezvous (just after their marks)."""
    fault = json.loads((marks / "fault.json").read_text())
    if fault["kind"] != "never_joins":
        return fault["time"]
    return max(json.loads((marks / f"rank{r}.json").read_text())["time"] for r in (0, 1) if r != fault["rank"])
