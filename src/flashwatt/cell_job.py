"""The submitting side of a cell's job, shared by the rules that run cells: hand the cell to
a submitit executor (local subprocess, Slurm job, or in-process), wait, and write its
trace and record once, atomically.

The executor is read from the config, not passed as a rule param: where a cell runs is
not what it measures, so switching to Slurm must not replan measured cells.
"""
from __future__ import annotations

import os
from typing import Any

from flashwatt import failures
from flashwatt.job_frame import CellOutcome, job_failed
from flashwatt.kind import Kind, resolve
from flashwatt.provenance import utc_now
from flashwatt.records import write_record, write_trace
from flashwatt.submit.failure_policy import FailurePolicy
from flashwatt.submit.jobs import JobFailed, run_job
from flashwatt.submit.slots import TOO_FEW_GPUS_REASON, TooFewGpus


def submit_and_record(kind: Kind, cell: Any, spec: dict, snakemake: Any) -> dict:
    """Run the kind's job for `cell` and write its outputs; returns the record. A job that
    died without returning one is recorded from the kind's envelope."""
    log = snakemake.log[0]
    base_record = kind.envelope
    # How long a job of several processes waits on one that failed: the job reads it from its
    # environment, which the executors pass on (a spec key would rerun measured cells).
    os.environ.update(FailurePolicy.from_config(snakemake.config).submission_environment())
    try:
        outcome = run_job(
            resolve(kind.job), cell, spec,
            job_name=cell.job_name,
            folder=snakemake.params.submitit_folder,
            executor=snakemake.config["executor"],
            resources=dict(snakemake.resources.items()),
            log_path=log,
        )
    except TooFewGpus as shortage:
        # A cell asking for more GPUs than this machine has (local executor) is skipped,
        # as the job itself records it where it starts on too few (a Slurm node, a CPU host).
        record = base_record(cell, spec)
        record.update(status="skipped", reason=TOO_FEW_GPUS_REASON.format(shortage),
                      finished=utc_now())
        outcome = CellOutcome(record)
    except JobFailed as failure:
        # The job died before returning (killed, out of host memory, node failure): the
        # failure is this cell's outcome, recorded so that the rest of the run goes on.
        outcome = CellOutcome(job_failed(base_record(cell, spec), str(failure), failure.job_id))
    except KeyboardInterrupt:
        # Ctrl-C: the job is cancelled already (flashwatt.submit.cancel) and the cell's log
        # says so; the script ends with the usual status of an interrupt, without a traceback.
        raise SystemExit(128 + 2) from None
    record = outcome.record
    earlier = failures.history(snakemake.output.record)
    if earlier:  # the cell failed before (a retried cell): say so, and why
        record["previous_failures"] = [failures.in_brief(f) for f in earlier]
    write_trace(snakemake.output.trace, outcome.trace)
    write_record(snakemake.output.record, record)
    if record["status"] in failures.RETRIABLE:
        failures.remember(snakemake.output.record, {k: v for k, v in record.items() if k != "previous_failures"})
    with open(log, "a") as stream:
        stream.write(f"[flashwatt] {cell.id}: {record['status']}" + (f" ({record['reason']})" if record.get("reason") else "") + "\n")
        if record.get("traceback"):
            stream.write(record["traceback"])
    return record
