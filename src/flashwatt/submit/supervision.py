"""The processes whose end means "cancel this job": Snakemake and the shells below it.

When Snakemake is killed outright (`kill -9`, the OOM killer) it cannot tell its jobs,
and the processes waiting on them live on as orphans. Each wait therefore watches the
processes between it and the nearest Snakemake ancestor and cancels its job when one of
them is gone. psutil compares each process's start time too, so a reused pid does not
pass for the process that died.
"""
from __future__ import annotations

import sys

import psutil

# How far up to look for Snakemake: the wait runs in Snakemake's script job, at most a
# shell or two below it. Further up is someone else's process tree.
MAX_DEPTH = 6


class SupervisorGone(SystemExit):
    """The Snakemake process that started this wait is gone (e.g. killed with SIGKILL)."""


def snakemake_ancestry(max_depth: int = MAX_DEPTH) -> list[psutil.Process]:
    """Ancestors of this process up to and including the nearest Snakemake process.

    Empty when no Snakemake is among the first `max_depth` ancestors (a user calling
    run_job directly), so that a login shell ending never cancels anything.
    """
    chain: list[psutil.Process] = []
    try:
        process = psutil.Process().parent()
        for _ in range(max_depth):
            if process is None or process.pid <= 1:
                return []
            chain.append(process)
            if "snakemake" in " ".join(process.cmdline()):
                return chain
            process = process.parent()
    except psutil.Error:  # an ancestor ended while we looked, or is not ours to read
        return []
    return []


def ancestry_or_exit(job_name: str) -> list[psutil.Process]:
    """The Snakemake ancestry, checked before submitting: a Snakemake script job whose
    Snakemake is already gone (killed while this process was starting) submits nothing."""
    chain = snakemake_ancestry()
    if not chain and "/.snakemake/scripts/" in (sys.argv[0] if sys.argv else ""):
        raise SupervisorGone(f"{job_name}: the Snakemake that started this job is gone; not submitting")
    return chain


def first_gone(chain: list[psutil.Process]) -> psutil.Process | None:
    """The first process of `chain` that has ended (a zombie has ended too), or None."""
    for process in chain:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            pass
        return process
    return None
