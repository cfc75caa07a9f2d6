"""A Slurm job's life as the tests of tests/slurm see it, read from the controller: its
fields, its time limit, waits bounded by that limit instead of by a guess at how fast this
machine is, and the release of a job that USR2 requeued."""
from __future__ import annotations

import math
import subprocess
import threading
import time

from support import wait_until

# States in which the controller still holds the job and may yet run it.
ALIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
         "RESIZING", "SUSPENDED")

# How long the controller may take to end a job's processes: SIGKILL KillWait (5 s) after
# SIGTERM, UnkillableStepTimeout (180 s) before it gives up on them (both in
# .ci/slurm/slurm.conf.in), and accounting's lag; fixed by the cluster, not by load.
JOB_END_S = 5 + 180 + 30


def sh(*cmd: str, timeout: float = 30) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip()


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict ({} once the controller has forgotten the job)."""
    try:
        out = sh("scontrol", "show", "job", "-o", job_id)
    except subprocess.CalledProcessError:
        return {}
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def time_limit_s(job_id: str) -> float:
    """The job's own time limit in seconds: Slurm has ended the job by then, whatever the load."""
    limit = job_fields(job_id).get("TimeLimit", "")
    if not limit:  # the controller forgets a job MinJobAge after its end; accounting does not
        limit = sh("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "Timelimit").partition("\n")[0]
    if not limit or not limit[0].isdigit():
        raise AssertionError(f"job {job_id} has no time limit ({limit!r}); give the test's job a runtime")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days or 0) * 24 + parts[0]) * 3600 + parts[1] * 60 + parts[2]


def wait_while_job_lives(job_id: str, predicate, what: str):
    """Poll `predicate` until it returns something truthy. Fails at once, naming the job's
    state, when the job ends first, and otherwise after the job's own time limit (when
    Slurm has ended it anyway): a slow machine makes the wait longer, never the test wrong."""
    deadline_s = time_limit_s(job_id) + JOB_END_S

    def settled():
        value = predicate()
        if value:
            return value
        state = job_fields(job_id).get("JobState", "gone")
        if state not in ALIVE:
            raise AssertionError(f"job {job_id} ended ({state}) before {what}")
        return None

    return wait_until(settled, deadline_s, f"{what} (job {job_id})", step=0.5)


def release_requeued(job_id: str, restarts: int = 1) -> None:
    """Start a job that USR2 requeued now, instead of after the hold Slurm puts on every
    requeued job (its start moved about two minutes on).

    The hold is set when the requeue completes, once the old run's processes have exited;
    until then the job shows COMPLETING (or REQUEUED), and a StartTime sent then is
    overwritten by the hold. On a loaded machine the old run takes seconds to exit, so the
    relaunch used to come two minutes late. Here: wait for the job to be PENDING for its
    BeginTime after `restarts` restarts; move its start to a whole second after that
    (slurmd compares credential times in whole seconds and refuses a relaunch in the second
    of the requeue, which fails the job); and send it again for as long as the hold shows."""
    def held() -> float:
        fields = job_fields(job_id)
        if (fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime"
                and int(fields.get("Restarts", 0)) >= restarts):
            return time.time()
        return 0.0

    requeued_at = wait_while_job_lives(job_id, held, "the requeue to complete")
    time.sleep(max(0.0, math.floor(requeued_at) + 1.05 - time.time()))  # the next whole second

    def started() -> bool:
        fields = job_fields(job_id)
        if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
            sh("scontrol", "update", f"jobid={job_id}", "StartTime=now")
            return False
        return True

    wait_while_job_lives(job_id, started, "the requeued job to start again")


def join_waiter(thread: threading.Thread, job_id: str) -> None:
    """Wait for the thread in which run_job waits on job `job_id`. run_job returns once the
    job has ended, and Slurm ends every run of it by its time limit (a requeued job starts
    a new run), so the wait lasts while the job lives and JOB_END_S after; past that the
    test fails naming the job."""
    ended_at = None
    while thread.is_alive():
        thread.join(timeout=2.0)
        if job_fields(job_id).get("JobState", "gone") in ALIVE:
            ended_at = None
        elif ended_at is None:
            ended_at = time.monotonic()
        elif time.monotonic() - ended_at > JOB_END_S:
            raise AssertionError(f"job {job_id} ended {JOB_END_S} s ago and run_job still waits on it")
