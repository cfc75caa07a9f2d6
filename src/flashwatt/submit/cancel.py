"""Cancelling a job: scancel for Slurm, SIGINT for a local job's controller.

A waiting process cancels its job when a termination signal reaches it (SIGINT,
SIGTERM, SIGHUP) and, through an atexit hook, when it exits with the job still in
flight. Signal handlers can only be installed from the main thread; elsewhere only
the atexit hook applies. Only a waiting process killed with SIGKILL cannot cancel.
"""
from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import psutil
import submitit
import tenacity

# How long a local job's controller gets to stop its tasks after SIGINT before it is
# killed: its GPU slot is freed only once it has stopped.
LOCAL_STOP_S = 10.0
SCANCEL_ATTEMPTS = 3

_IN_FLIGHT: dict[int, Any] = {}
_IN_FLIGHT_LOCK = threading.Lock()


def track(job: Any) -> None:
    """Cancel `job` at exit unless `untrack` is called first."""
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT[id(job)] = job


def untrack(job: Any) -> None:
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.pop(id(job), None)


@atexit.register
def _cancel_all_in_flight() -> None:
    with _IN_FLIGHT_LOCK:
        jobs = list(_IN_FLIGHT.values())
        _IN_FLIGHT.clear()
    for job in jobs:
        cancel(job)


def cancel(job: Any) -> None:
    """Cancel a submitit job; never raises (the job may already be gone)."""
    if isinstance(job, submitit.SlurmJob):
        scancel(job.job_id)
    else:
        _stop_local(job)


def _stop_local(job: Any) -> None:
    try:
        job.cancel(check=False)  # SIGINT to the controller, which stops its tasks
    except Exception:  # the job may already be gone; nothing else to do
        return
    deadline = time.monotonic() + LOCAL_STOP_S
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not job.done():
        # submitit's local job id is the pid of the job's controller process
        # (pyproject.toml pins submitit's version for this).
        with contextlib.suppress(psutil.Error, ValueError):
            psutil.Process(int(job.job_id)).kill()


class _ScancelRefused(RuntimeError):
    pass


@tenacity.retry(stop=tenacity.stop_after_attempt(SCANCEL_ATTEMPTS),
                wait=tenacity.wait_incrementing(start=0.5, increment=0.5),
                retry=tenacity.retry_if_exception_type((_ScancelRefused, OSError, subprocess.SubprocessError)),
                reraise=True)
def _scancel_once(job_id: str) -> None:
    # In a session of its own: the signal that triggers a cancel often reaches the whole
    # process group twice (the terminal's, then `timeout` or srun forwarding it, or a
    # second Ctrl-C), and an scancel in that group would be killed before it reached slurmctld.
    done = subprocess.run(["scancel", str(job_id)], start_new_session=True, capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0 and "Invalid job id" not in done.stderr:  # already gone is fine
        raise _ScancelRefused(done.stderr.strip() or f"exit status {done.returncode}")


def scancel(job_id: str) -> bool:
    """scancel `job_id`, retrying while slurmctld is busy. False (and a line on stderr naming
    the job, for the user to cancel by hand) when every attempt failed."""
    try:
        _scancel_once(job_id)
        return True
    except (_ScancelRefused, OSError, subprocess.SubprocessError) as error:
        print(f"flashwatt: could not cancel Slurm job {job_id} ({error}); cancel it with `scancel {job_id}`",
              file=sys.stderr, flush=True)
        return False


@contextlib.contextmanager
def cancel_on_signal(holder: dict[str, Any]) -> Iterator[None]:
    """Cancel holder['job'] when a termination signal arrives, then re-raise it as usual
    (KeyboardInterrupt for SIGINT, SystemExit(128 + signal) otherwise)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    previous = {s: signal.getsignal(s) for s in signals}

    def handler(signum: int, frame: Any) -> None:
        # Ignore repeats while cancelling: a second SIGINT raised inside subprocess.run
        # would kill the scancel it is waiting for.
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        job = holder.get("job")
        try:
            if job is not None:
                holder["cancelled"] = signal.Signals(signum).name
                cancel(job)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    for s in signals:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
