"""run_job: run one function as a job (local subprocess, Slurm, or in-process) and wait for it.

A Snakemake rule calls `run_job` once per cell; the rule's process waits for the job
and returns its result, so Snakemake stays in charge of the DAG while submitit handles
pickling, logs and Slurm.

Time limits and preemption: checkpoint + requeue. The function is wrapped in a
`submitit.helpers.Checkpointable`; Slurm sends USR2 `signal_delay_s` before the time
limit (or on preemption), submitit's handler requeues the same job id, and the
waiting side keeps waiting because a requeued job is still incomplete. A cell is
short and a partial timing is worthless, so the requeued job starts the function
again from the beginning; the result is returned exactly once, and the caller writes
it once (atomically). Snakemake-level retries are therefore not needed (retries: 0).

Several tasks or GPUs (resources tasks, nodes, gpus, gres): one job, the function runs
once per task (SLURM_PROCID / submitit's JobEnvironment give the rank), and the rank-0
result is returned; the other ranks' results are dropped. On Slurm, a task that fails or
is killed ends the step's other tasks (`step_ending_srun_args`). flashwatt's multi-GPU
cells run one task per node, which starts and supervises that node's ranks itself
(flashwatt.distributed.rank_supervisor).

Polling: the wait checks for the result file every `FLASHWATT_POLL_S` seconds (a
stat, default 1) and asks Slurm through submitit's shared sacct watcher, forcing a
refresh at most every `FLASHWATT_STATUS_INTERVAL_S` seconds (default 30), so a job
killed outside Python (scancel, out of memory, node failure) is noticed.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from flashwatt.submit.cancel import cancel, cancel_on_signal, track, untrack
from flashwatt.submit.resources import slurm_parameters
from flashwatt.submit.failure_policy import FailurePolicy
from flashwatt.submit.slots import OneNodeOnly, gpu_slots
from flashwatt.submit.supervision import SupervisorGone, ancestry_or_exit, first_gone

EXECUTORS = ("local", "slurm", "inprocess")

# Slurm states after which no result file will ever appear.
_KILLED_STATES = ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL")


class JobFailed(RuntimeError):
    """A job raised, was cancelled, or died; the message holds its id and traceback."""

    def __init__(self, message: str, job_id: str | None = None, state: str | None = None):
        super().__init__(message)
        self.job_id = job_id
        self.state = state


class _Call(submitit.helpers.Checkpointable):
    """fn(*args, **kwargs), requeued from scratch on USR2 (time limit or preemption)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def run_job(
    fn: Callable[..., Any],
    *args: Any,
    job_name: str,
    folder: str | Path,
    executor: str = "local",
    resources: Mapping[str, Any] | None = None,
    log_path: str | Path | None = None,
    **kwargs: Any,
) -> Any:
    """Run fn(*args, **kwargs) as a job, wait for it and return its result.

    fn must be importable (a module-level function). With several tasks the function
    runs once per task and the rank-0 result is returned. Submitit files go to
    folder/job_name; the job's stdout/stderr are appended to log_path when it ends.
    Raises JobFailed (job id + remote traceback) when the job raised, was cancelled or died.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"executor={executor!r}: allowed {', '.join(EXECUTORS)}")
    params = slurm_parameters(resources)
    log = Path(log_path) if log_path is not None else None
    if executor == "inprocess":
        return _run_inprocess(fn, args, kwargs, params, job_name, log)

    job_folder = Path(folder) / job_name
    if executor == "slurm":
        return _submit_and_wait(fn, args, kwargs, "slurm", params, job_name, job_folder, log)
    if params.get("nodes", 1) > 1:
        raise OneNodeOnly(f"the local executor runs on one node; job {job_name} spans {params['nodes']} nodes "
                          "(run it with executor: slurm)")
    gpus_wanted = params.get("gpus_per_node", 1)
    with gpu_slots(gpus_wanted) as gpus:
        gpus = gpus if gpus_wanted > 0 else []  # gpus=0: hold a slot but show the job no GPU
        local = {k: params[k] for k in ("timeout_min", "tasks_per_node") if k in params}
        local["gpus_per_node"] = len(gpus)
        if gpus and all(g.isdigit() for g in gpus):
            local["visible_gpus"] = tuple(int(g) for g in gpus)
        elif gpus:  # UUID or MIG entries: submitit only takes indices, so set the variable directly
            local["setup"] = [f"export CUDA_VISIBLE_DEVICES={shlex.quote(','.join(gpus))}"]
        _log(log, f"[flashwatt.submit] {job_name}: local slot(s) {', '.join(gpus) or 'cpu'}")
        return _submit_and_wait(fn, args, kwargs, "local", local, job_name, job_folder, log)


def _run_inprocess(fn, args, kwargs, params, job_name, log):  # type: ignore[no-untyped-def]
    with gpu_slots(params.get("gpus_per_node", 1)):
        _log(log, f"[flashwatt.submit] {job_name}: running in-process")
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            trace = traceback.format_exc()
            _log(log, trace)
            raise JobFailed(f"job {job_name} (in-process) raised:\n{trace}", job_id=None, state="FAILED") from error


def _make_executor(cluster: str, folder: Path, params: dict[str, Any], job_name: str) -> Any:
    if cluster == "local":
        # LocalExecutor directly: AutoExecutor does not pass visible_gpus through to it.
        local = submitit.LocalExecutor(folder=folder)
        local.update_parameters(**params)
        return local
    if shutil.which("srun") is None:
        raise JobFailed(f"executor=slurm for {job_name}, but no srun on PATH: submit from a Slurm login node")
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    params = dict(params)
    extra = params.pop("slurm_additional_parameters", None)
    if extra:
        executor.update_parameters(slurm_additional_parameters=extra)
    executor.update_parameters(name=job_name, slurm_srun_args=step_ending_srun_args(), **params)
    return executor


def step_ending_srun_args() -> list[str]:
    """srun options that end every task of a job's step when one task ends: a task killed or
    failing ends the others at once (--kill-on-bad-exit), and tasks still running the failure
    policy's bound after the first one exited are ended too (--wait). A multi-node cell runs
    one task per node, each supervising its node's ranks; a task ended by Slurm stops its
    ranks on SIGTERM (flashwatt.distributed.rank_supervisor)."""
    bound = FailurePolicy.from_environment().failure_timeout_s
    return ["--kill-on-bad-exit=1", f"--wait={int(bound) + 1}"]


def _submit_and_wait(fn, args, kwargs, cluster, params, job_name, folder, log):  # type: ignore[no-untyped-def]
    executor = _make_executor(cluster, folder, params, job_name)
    supervisors = ancestry_or_exit(job_name)
    holder: dict[str, Any] = {}
    with cancel_on_signal(holder):
        env = submitit.helpers.clean_env() if os.environ.get("SLURM_JOB_ID") else contextlib.nullcontext()
        try:
            with env:
                job = executor.submit(_Call(fn), *args, **kwargs)
        except (FailedJobError, subprocess.SubprocessError, OSError) as error:
            _log(log, f"[flashwatt.submit] {job_name}: submission to {cluster} failed: {error}")
            raise JobFailed(f"{cluster} submission of {job_name} failed: {error}", state="NOT_SUBMITTED") from None
        holder["job"] = job
        track(job)
        _log(log, f"[flashwatt.submit] {job_name}: submitted {cluster} job {job.job_id} (files in {folder})")
        outcome = "ended"
        try:
            _wait(job, supervisors)
            if not _result_files_appear(job, cluster):
                state = "INTERRUPTED" if cluster == "local" else _state(job)
                outcome = f"failed ({state})"
                raise JobFailed(f"{cluster} job {job.job_id} ({job_name}) ended without a result, state {state}"
                                f"{_stderr_tail(job)}", job_id=job.job_id, state=state)
            results = job.results()
            outcome = "completed"
            return results[0]
        except (FailedJobError, UncompletedJobError) as error:
            # The function raised: FAILED whatever accounting says yet (sacct lags the job's end).
            if isinstance(error, FailedJobError):
                state = "FAILED"
            else:
                state = "INTERRUPTED" if cluster == "local" else _state(job)
            outcome = f"failed ({state})"
            raise JobFailed(
                f"{cluster} job {job.job_id} ({job_name}) failed, state {state}:\n{error}", job_id=job.job_id, state=state
            ) from None
        except JobFailed:
            raise
        except BaseException as error:
            reason = "Snakemake is gone" if isinstance(error, SupervisorGone) else holder.get("cancelled", type(error).__name__)
            outcome = f"interrupted ({reason})"
            if "cancelled" not in holder:
                cancel(job)
            raise
        finally:
            untrack(job)
            _append_logs(job, log, f"{cluster} job {job.job_id} ({job_name}) {outcome}")


def _wait(job: Any, supervisors: list) -> None:
    poll_s = float(os.environ.get("FLASHWATT_POLL_S", "1"))
    status_s = float(os.environ.get("FLASHWATT_STATUS_INTERVAL_S", "30"))
    last_forced = time.monotonic()
    while True:
        force = time.monotonic() - last_forced >= status_s
        if force:
            last_forced = time.monotonic()
        if job.done(force_check=force):
            return
        gone = first_gone(supervisors)
        if gone is not None:  # Snakemake was killed without telling its jobs
            raise SupervisorGone(f"process {gone.pid} (Snakemake or its job shell) is gone; cancelling job {job.job_id}")
        time.sleep(poll_s)


def _tasks(job: Any) -> list[Any]:
    return [job.task(k) for k in range(job.num_tasks)]


def _result_files_appear(job: Any, cluster: str) -> bool:
    """Whether every task's result file is there, waiting a grace period for late ones.

    A shared file system can show a new file late (submitit's own wait is 15 s). A job
    that Slurm killed (scancel, time limit, out of memory) never writes one, and a local
    job writes it before its process exits, so those cases get one second.
    """
    tasks = _tasks(job)

    def present() -> bool:
        return all(task.paths.result_pickle.exists() for task in tasks)

    if present():
        return True
    if cluster == "local" or _state(job).upper().startswith(_KILLED_STATES):
        grace = 1.0
    else:
        grace = float(os.environ.get("FLASHWATT_RESULT_GRACE_S", "15"))
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if present():
            return True
    return False


def _stderr_tail(job: Any, lines: int = 20) -> str:
    parts = []
    for k, task in enumerate(_tasks(job)):
        try:
            text = Path(task.paths.stderr).read_text(errors="replace")
        except OSError:
            continue
        tail = "\n".join(text.rstrip("\n").splitlines()[-lines:])
        if tail:
            parts.append(f"\n--- task {k} stderr (last {lines} lines of {task.paths.stderr}) ---\n{tail}")
    return "".join(parts)


def _state(job: Any) -> str:
    try:
        info = job.get_info(mode="force")
        return str(info.get("State") or info.get("jobState") or job.state)
    except Exception:
        return "UNKNOWN"


def _append_logs(job: Any, log_path: Path | None, header: str) -> None:
    if log_path is None:
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"==> {header}\n")
        for k, task in enumerate(_tasks(job)):
            paths = task.paths
            for kind, path in (("stdout", paths.stdout), ("stderr", paths.stderr)):
                try:
                    text = Path(path).read_text(errors="replace")
                except OSError:
                    continue
                if text:
                    log.write(f"--- job {job.job_id} task {k} {kind} ({path}) ---\n{text}")
                    if not text.endswith("\n"):
                        log.write("\n")


def _log(log_path: Path | None, line: str) -> None:
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as log:
            log.write(line.rstrip("\n") + "\n")
