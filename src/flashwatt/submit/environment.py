"""The job this process runs in: its id, executor, restart count and task rank.

Read from the variables Slurm and submitit's local executor set in a job's environment
(submitit's JobEnvironment reads the same ones), without importing submitit: every
record's provenance asks for this, and reading a few variables should not load the
submission machinery.
"""
from __future__ import annotations

import os
from typing import Any


def current_job_id() -> str | None:
    """The id of the job this code runs in (Slurm job id, local job id), or None outside a job."""
    env = os.environ
    array_id, task_id = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_id and task_id:
        return f"{array_id}_{task_id}"
    return env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or None


def current_job_info() -> dict[str, Any]:
    """Job id, executor, restart count and task rank, for result records."""
    env = os.environ
    executor = env.get("SUBMITIT_EXECUTOR") or ("slurm" if env.get("SLURM_JOB_ID") else None)
    return {
        "job_id": current_job_id(),
        "executor": executor or "inprocess",
        "restarts": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "rank": int(env.get("SLURM_PROCID") or env.get("SUBMITIT_LOCAL_GLOBALID") or 0),
        "ntasks": int(env.get("SLURM_NTASKS") or env.get("SUBMITIT_LOCAL_NTASKS") or 1),
    }
