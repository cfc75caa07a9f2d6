"""Run one function as a job (local subprocess, Slurm, or in-process) and wait for it.

The only package that imports submitit. A Snakemake rule calls `run_job` once per cell;
the rule's process waits for the job and returns its result, so Snakemake stays in
charge of the DAG while submitit handles pickling, logs and Slurm.

    resources    Snakemake resources -> executor parameters; misspelt names refused
    environment  the job this process runs in: id, executor, restarts, rank
    slots        GPU slot locks of the local executor
    supervision  Snakemake's ancestry, whose end cancels a job
    cancel       scancel / the local controller, on signals and at exit
    jobs         run_job: submit, wait, return the result or raise JobFailed
    failure_policy  how long a job of several processes waits on one that failed (config
                 key `ranks`), and the NCCL watchdog settings its ranks start with

Executors
    local      one subprocess per job on this machine (submitit's local executor).
               Cells in flight are capped by the number of GPUs: each job holds one
               slot lock per GPU it uses and sees only those GPUs; with no GPU there
               is one "cpu" slot, so CPU timings never overlap.
    slurm      one sbatch job per call; Slurm does the placement.
    inprocess  calls fn directly (for debugging); still takes a slot lock.

Job arrays: not used. Snakemake schedules one job per cell and each waits for its own
result, so there is never a batch of submissions in one process to pack into an
array; arrays would also make one cell's rerun or cancellation touch its siblings.
Slurm's own per-user limits (or Snakemake's --jobs) cap what is in flight.

Interruption: while waiting, SIGINT/SIGTERM/SIGHUP cancel the job before the exception
propagates, an atexit hook cancels anything still in flight, and the wait cancels its
job when Snakemake is killed outright (supervision). Snakemake's own behaviour (9.x,
local rules): on Ctrl-C it stops the running cells (the SIGINT reaches their process
group; each cancels its job) but still starts the cells it had already queued, which
then run to completion; on SIGTERM it waits for running cells. Bound unattended runs
with `timeout -k 60 -s INT LIMIT snakemake ...`: `timeout` signals its whole process
group, so a plain `-s KILL` would also kill the waiting processes before they can
cancel their jobs.

The names below stay importable from `flashwatt.submit`; each is loaded from its
module on first use, so that importing `flashwatt.submit.environment` (every record's
provenance) or `flashwatt.submit.resources` (the Snakefile) does not load submitit.
"""
from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "run_job": "jobs", "JobFailed": "jobs", "EXECUTORS": "jobs",
    "SupervisorGone": "supervision",
    "gpu_slots": "slots",
    "current_job_id": "environment", "current_job_info": "environment",
    "slurm_parameters": "resources", "refuse_unknown_resources": "resources",
    "unknown_resources": "resources", "runtime_minutes": "resources", "KNOWN_RESOURCE_NAMES": "resources",
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'flashwatt.submit' has no attribute {name!r}")
    return getattr(importlib.import_module(f"flashwatt.submit.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
