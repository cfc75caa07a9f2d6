"""Run one function as a job (local subprocess, Slurm, or in-process) and wait for it.

This is the only module that imports submitit. A Snakemake rule calls `run_job` once
per cell; the rule's process waits for the job and returns its result, so Snakemake
stays in charge of the DAG while submitit handles pickling, logs and Slurm.

Executors
    local      one subprocess per job on this machine (submitit's local executor).
               Cells in flight are capped by the number of GPUs: each job holds one
               slot lock per GPU it uses and sees only those GPUs; with no GPU there
               is one "cpu" slot, so CPU timings never overlap.
    slurm      one sbatch job per call; Slurm does the placement.
    inprocess  calls fn directly (for debugging); still takes a slot lock.

Time limits and preemption: checkpoint + requeue. The function is wrapped in a
`submitit.helpers.Checkpointable`; Slurm sends USR2 `signal_delay_s` before the time
limit (or on preemption), submitit's handler requeues the same job id, and the
waiting side keeps waiting because a requeued job is still incomplete. A cell is
short and a partial timing is worthless, so the requeued job starts the function
again from the beginning; the result is returned exactly once, and the caller writes
it once (atomically). Snakemake-level retries are therefore not needed (retries: 0).

Job arrays: not used. Snakemake schedules one job per cell and each waits for its own
result, so there is never a batch of submissions in one process to pack into an
array; arrays would also make one cell's rerun or cancellation touch its siblings.
Slurm's own per-user limits (or Snakemake's --jobs) cap what is in flight.

Interruption: while waiting, SIGINT/SIGTERM/SIGHUP cancel the job (scancel, or
SIGINT to the local job's controller) before the exception propagates, and an
atexit hook cancels anything still in flight. Signal handlers can only be installed
from the main thread; elsewhere only the atexit hook applies. When Snakemake itself
is killed outright (`kill -9`, OOM killer) its job processes live on as
orphans: the wait watches the processes between it and the nearest Snakemake
ancestor and cancels its job when one of them disappears. Only a waiting process
that is itself killed with SIGKILL cannot cancel its job.

Snakemake's own behaviour (9.x, local rules): on Ctrl-C it stops the running cells
(the SIGINT reaches their process group; each cancels its job) but still starts the
cells it had already queued, which then run to completion; on SIGTERM it waits for
running cells. Bound unattended runs with `timeout -k 60 -s INT LIMIT snakemake ...`:
`timeout` signals its whole process group, so a plain `-s KILL` would also kill the
waiting processes before they can cancel their jobs.

Several tasks or GPUs (resources tasks, gpus, gres): one job, the function runs once
per task (SLURM_PROCID / submitit's JobEnvironment give the rank), and the rank-0
result is returned; the other ranks' results are dropped.

Polling: the wait checks for the result file every `FLASHWATT_POLL_S` seconds (a
stat, default 1) and asks Slurm through submitit's shared sacct watcher, forcing a
refresh at most every `FLASHWATT_STATUS_INTERVAL_S` seconds (default 30), so a job
killed outside Python (scancel, out of memory, node failure) is noticed.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from filelock import FileLock, Timeout

from flashwatt.devices import visible_gpu_ids

EXECUTORS = ("local", "slurm", "inprocess")
DEFAULT_TIMEOUT_MIN = 60
DEFAULT_SLOT_DIR = "results/.slots"

# Snakemake resource name -> submitit (AutoExecutor) parameter name.
_RESOURCE_TO_PARAMETER = {
    "slurm_partition": "slurm_partition",
    "partition": "slurm_partition",
    "slurm_account": "slurm_account",
    "account": "slurm_account",
    "gpus": "gpus_per_node",
    "gpu": "gpus_per_node",
    "gres": "slurm_gres",
    "cpus_per_task": "cpus_per_task",
    "qos": "slurm_qos",
    "constraint": "slurm_constraint",
    "tasks": "tasks_per_node",
    "nodes": "nodes",
}
# Resources Snakemake adds to every job (mem and disk are its human-readable copies of
# mem_mb and disk_mb); they say nothing the mapping needs.
_IGNORED_RESOURCES = frozenset({"_cores", "_nodes", "tmpdir", "mem_mib", "disk_mb", "disk_mib", "mem", "disk"})
_KNOWN_RESOURCES = frozenset(_RESOURCE_TO_PARAMETER) | {"mem_mb", "runtime", "slurm_extra"}
KNOWN_RESOURCE_NAMES = tuple(sorted(_KNOWN_RESOURCES))

# Short sbatch options accepted in slurm_extra, by their long name.
_SHORT_OPTIONS = {
    "A": "account", "C": "constraint", "G": "gpus", "N": "nodes", "c": "cpus_per_task",
    "n": "ntasks", "p": "partition", "q": "qos", "t": "time", "w": "nodelist", "x": "exclude",
}


class JobFailed(RuntimeError):
    """A job raised, was cancelled, or died; the message holds its id and traceback."""

    def __init__(self, message: str, job_id: str | None = None, state: str | None = None):
        super().__init__(message)
        self.job_id = job_id
        self.state = state


# ---- resources -------------------------------------------------------------------------

def _as_dict(resources: Any) -> dict[str, Any]:
    if resources is None:
        return {}
    if hasattr(resources, "items"):  # a Mapping or Snakemake's Resources object
        return {str(k): v for k, v in resources.items()}
    raise TypeError(f"resources must be a mapping of Snakemake resource names, got {type(resources).__name__}")


def _minutes(value: Any) -> int:
    """Snakemake gives runtime in minutes; also accept '90', '2h', '1h30m', '01:30:00'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(1, int(round(value)))
    text = str(value).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return max(1, int(round(float(text))))
    if re.fullmatch(r"(\d+-)?\d+:\d+(:\d+)?", text):  # [D-]HH:MM[:SS]
        days, _, clock = text.rpartition("-")
        parts = [int(p) for p in clock.split(":")] + [0]
        minutes = int(days or 0) * 1440 + parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
        return max(1, minutes)
    match = re.fullmatch(r"(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m(?:in)?)?\s*(?:(\d+)s)?", text)
    if match and any(match.groups()):
        d, h, m, s = (int(g or 0) for g in match.groups())
        return max(1, d * 1440 + h * 60 + m + (1 if s else 0))
    raise ValueError(f"resource runtime={value!r}: give minutes (e.g. 30) or a duration such as '1h30m'")


def _parse_slurm_extra(extra: str) -> dict[str, Any]:
    """'--qos=high --exclusive -C a100' -> {'qos': 'high', 'exclusive': True, 'constraint': 'a100'}."""
    options: dict[str, Any] = {}
    tokens = shlex.split(str(extra))
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--"):
            key, eq, value = token[2:].partition("=")
            if not eq:
                if i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                    value, i = tokens[i + 1], i + 1
                else:
                    value = True
        elif token.startswith("-") and len(token) >= 2 and token[1] in _SHORT_OPTIONS:
            key = _SHORT_OPTIONS[token[1]]
            value = token[2:]
            if not value:
                if i + 1 >= len(tokens):
                    raise ValueError(f"slurm_extra={extra!r}: option {token} needs a value")
                value, i = tokens[i + 1], i + 1
        else:
            raise ValueError(f"slurm_extra={extra!r}: cannot read {token!r} (use --long-option=value)")
        options[key.replace("-", "_")] = value
        i += 1
    return options


def unknown_resources(names) -> list[str]:
    """The resource names in `names` that no executor of flashwatt knows (misspellings)."""
    return sorted(n for n in names if n not in _KNOWN_RESOURCES and n not in _IGNORED_RESOURCES)


def refuse_unknown_resources(rule: str, names) -> None:
    """ValueError naming the unknown resources set for `rule`, and the known ones."""
    unknown = unknown_resources(names)
    if unknown:
        raise ValueError(f"unknown resource(s) for rule {rule}: {', '.join(unknown)}; "
                         f"known: {', '.join(KNOWN_RESOURCE_NAMES)}")


def slurm_parameters(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    """Map Snakemake resources onto submitit AutoExecutor parameters.

    The one place where resource names meet submitit's. Unknown names raise, except
    those Snakemake adds to every job (_cores, _nodes, tmpdir, mem_mib, disk_mb, disk_mib).
    """
    res = _as_dict(resources)
    unknown = unknown_resources(res)
    if unknown:
        raise ValueError(
            f"unknown resource(s) {', '.join(map(repr, unknown))} for a submitted job; "
            f"known: {', '.join(sorted(_KNOWN_RESOURCES))}"
        )
    params: dict[str, Any] = {}
    for key, value in res.items():
        if value is None or key in _IGNORED_RESOURCES:
            continue
        if key == "mem_mb":
            params["slurm_mem"] = f"{int(value)}M"
        elif key == "runtime":
            params["timeout_min"] = _minutes(value)
        elif key == "slurm_extra":
            if str(value).strip():
                params["slurm_additional_parameters"] = _parse_slurm_extra(value)
        else:
            name = _RESOURCE_TO_PARAMETER[key]
            if name in ("gpus_per_node", "cpus_per_task", "tasks_per_node", "nodes"):
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"resource {key}={value!r}: must be an integer") from None
            else:
                value = str(value)
            if name in params and params[name] != value:
                raise ValueError(f"resource {key}={value!r} conflicts with an alias given {params[name]!r}")
            params[name] = value
    params.setdefault("timeout_min", DEFAULT_TIMEOUT_MIN)
    return params


# ---- job side ----------------------------------------------------------------------------

def current_job_id() -> str | None:
    """The id of the job this code runs in (Slurm job id, local pid), or None outside a job."""
    array_id, task_id = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_id and task_id:
        return f"{array_id}_{task_id}"
    if os.environ.get("SLURM_JOB_ID"):
        return os.environ["SLURM_JOB_ID"]
    try:
        return submitit.JobEnvironment().job_id
    except RuntimeError:  # not inside a submitit job
        return None


def current_job_info() -> dict[str, Any]:
    """Job id, executor, restart count and task rank, for result records."""
    executor = os.environ.get("SUBMITIT_EXECUTOR") or ("slurm" if os.environ.get("SLURM_JOB_ID") else None)
    return {
        "job_id": current_job_id(),
        "executor": executor or "inprocess",
        "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        "rank": int(os.environ.get("SLURM_PROCID") or os.environ.get("SUBMITIT_LOCAL_GLOBALID") or 0),
        "ntasks": int(os.environ.get("SLURM_NTASKS") or os.environ.get("SUBMITIT_LOCAL_NTASKS") or 1),
    }


class _Call(submitit.helpers.Checkpointable):
    """fn(*args, **kwargs), requeued from scratch on USR2 (time limit or preemption)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


# ---- GPU slots (local executor) -----------------------------------------------------------

def _slot_dir() -> Path:
    return Path(os.environ.get("FLASHWATT_SLOT_DIR", DEFAULT_SLOT_DIR))


@contextlib.contextmanager
def gpu_slots(count: int = 1, poll_s: float = 0.5) -> Iterator[list[str]]:
    """Hold `count` free slot locks (one per GPU, or the one "cpu" slot) and yield their GPUs.

    Yields [] when the machine has no GPU. Slots are taken all at once or not at all,
    so two multi-GPU jobs never deadlock holding half each.
    """
    gpus = visible_gpu_ids()
    names = gpus or ["cpu"]
    count = max(1, count) if gpus else 1
    if count > len(names):
        raise ValueError(f"job asks for {count} GPUs; this machine shows {len(names)}: {', '.join(names)}")
    folder = _slot_dir()
    folder.mkdir(parents=True, exist_ok=True)
    locks = {name: FileLock(str(folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock")) for name in names}
    held: list[str] = []
    try:
        while True:
            for name in names:
                if len(held) == count:
                    break
                try:
                    locks[name].acquire(timeout=0)
                    held.append(name)
                except Timeout:
                    pass
            if len(held) == count:
                break
            for name in held:  # all or nothing
                locks[name].release()
            held = []
            time.sleep(poll_s)
        yield held if gpus else []
    finally:
        for name in held:
            locks[name].release()


# ---- waiting and cancelling ------------------------------------------------------------

_IN_FLIGHT: dict[int, Any] = {}
_IN_FLIGHT_LOCK = threading.Lock()


def _cancel(job: Any) -> None:
    if isinstance(job, submitit.SlurmJob):
        _scancel(job.job_id)
        return
    try:
        job.cancel(check=False)
    except Exception:  # the job may already be gone; nothing else to do
        return
    process = getattr(job, "_process", None)
    if process is not None:  # local: let the controller stop its tasks before the slot is freed
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _scancel(job_id: str, attempts: int = 3) -> None:
    """scancel in a session of its own. The signal that triggers a cancel often reaches the
    whole process group twice (the terminal's, then `timeout` or srun forwarding it, or a
    second Ctrl-C): an scancel in that group would be killed before it reached slurmctld."""
    for attempt in range(attempts):
        try:
            done = subprocess.run(["scancel", str(job_id)], start_new_session=True, capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 or "Invalid job id" in done.stderr:  # cancelled, or already gone
            return
        time.sleep(0.5 * (attempt + 1))  # slurmctld busy: try again


@atexit.register
def _cancel_all_in_flight() -> None:
    with _IN_FLIGHT_LOCK:
        jobs = list(_IN_FLIGHT.values())
        _IN_FLIGHT.clear()
    for job in jobs:
        _cancel(job)


@contextlib.contextmanager
def _cancel_on_signal(holder: dict[str, Any]) -> Iterator[None]:
    """Cancel holder['job'] when a termination signal arrives, then re-raise it as usual."""
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
                _cancel(job)
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


class SupervisorGone(SystemExit):
    """The Snakemake process that started this wait is gone (e.g. killed with SIGKILL)."""


def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _supervisors(max_depth: int = 6) -> list[tuple[int, str]]:
    """Ancestors of this process up to the nearest Snakemake process, with their start times.

    Empty when no Snakemake is among the first few ancestors (a user calling run_job
    directly), so that a login shell ending never cancels anything.
    """
    chain: list[tuple[int, str]] = []
    pid = os.getppid()
    for _ in range(max_depth):
        start = _proc_start(pid)
        if pid <= 1 or start is None:
            return []
        chain.append((pid, start))
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return []
        if "snakemake" in cmdline:
            return chain
        pid = ppid
    return []


def _supervisors_or_exit(job_name: str) -> list[tuple[int, str]]:
    """The supervisor chain, checked before submitting: a Snakemake script job whose
    Snakemake is already gone (killed while this process was starting) submits nothing."""
    chain = _supervisors()
    if not chain and "/.snakemake/scripts/" in (sys.argv[0] if sys.argv else ""):
        raise SupervisorGone(f"{job_name}: the Snakemake that started this job is gone; not submitting")
    return chain


def _wait(job: Any, supervisors: list[tuple[int, str]]) -> None:
    poll_s = float(os.environ.get("FLASHWATT_POLL_S", "1"))
    status_s = float(os.environ.get("FLASHWATT_STATUS_INTERVAL_S", "30"))
    last_forced = time.monotonic()
    while True:
        force = time.monotonic() - last_forced >= status_s
        if force:
            last_forced = time.monotonic()
        if job.done(force_check=force):
            return
        for pid, start in supervisors:
            if _proc_start(pid) != start:  # Snakemake was killed without telling its jobs
                raise SupervisorGone(f"process {pid} (Snakemake or its job shell) is gone; cancelling job {job.job_id}")
        time.sleep(poll_s)


def _append_logs(job: Any, log_path: Path | None, header: str) -> None:
    if log_path is None:
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tasks = range(job.num_tasks)
    with open(log_path, "a") as log:
        log.write(f"==> {header}\n")
        for k in tasks:
            paths = job.task(k).paths if job.num_tasks > 1 else job.paths
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


# ---- the entry point ---------------------------------------------------------------------

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
        raise ValueError(f"job {job_name}: the local executor runs on one node (nodes={params['nodes']})")
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
    executor.update_parameters(name=job_name, **params)
    return executor


def _submit_and_wait(fn, args, kwargs, cluster, params, job_name, folder, log):  # type: ignore[no-untyped-def]
    executor = _make_executor(cluster, folder, params, job_name)
    supervisors = _supervisors_or_exit(job_name)
    holder: dict[str, Any] = {}
    with _cancel_on_signal(holder):
        env = submitit.helpers.clean_env() if os.environ.get("SLURM_JOB_ID") else contextlib.nullcontext()
        try:
            with env:
                job = executor.submit(_Call(fn), *args, **kwargs)
        except (FailedJobError, subprocess.SubprocessError, OSError) as error:
            _log(log, f"[flashwatt.submit] {job_name}: submission to {cluster} failed: {error}")
            raise JobFailed(f"{cluster} submission of {job_name} failed: {error}", state="NOT_SUBMITTED") from None
        holder["job"] = job
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT[id(job)] = job
        _log(log, f"[flashwatt.submit] {job_name}: submitted {cluster} job {job.job_id} (files in {folder})")
        outcome = "ended"
        try:
            _wait(job, supervisors)
            _set_result_grace(job, cluster)
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
        except BaseException as error:
            reason = "Snakemake is gone" if isinstance(error, SupervisorGone) else holder.get("cancelled", type(error).__name__)
            outcome = f"interrupted ({reason})"
            if "cancelled" not in holder:
                _cancel(job)
            raise
        finally:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.pop(id(job), None)
            _append_logs(job, log, f"{cluster} job {job.job_id} ({job_name}) {outcome}")


# Slurm states after which no result file will ever appear.
_KILLED_STATES = ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL")


def _set_result_grace(job: Any, cluster: str) -> None:
    """How long job.results() waits for a result file that is not there yet.

    submitit waits 15 s, for shared file systems that show a new file late. A job that
    Slurm killed (scancel, time limit, out of memory) never writes one, and a local job
    writes it before its process exits, so those cases are reported at once.
    """
    jobs = list(getattr(job, "_sub_jobs", None) or [job])
    if all(j.paths.result_pickle.exists() for j in jobs):
        return
    if cluster == "local":
        grace = 1.0
    elif _state(job).upper().startswith(_KILLED_STATES):
        grace = 1.0
    else:
        grace = float(os.environ.get("FLASHWATT_RESULT_GRACE_S", "15"))
    for j in [job, *jobs]:
        j._results_timeout_s = grace


def _state(job: Any) -> str:
    try:
        info = job.get_info(mode="force")
        return str(info.get("State") or info.get("jobState") or job.state)
    except Exception:
        return "UNKNOWN"
