"""What a distributed cell's job runs on each of its tasks: `flashwatt.distributed.job.job`,
whose rank-0 result becomes the cell's record.

Every outcome is a record: ok, incorrect (the gathered output or gradients failed their
check against float64), skipped (fewer GPUs than the cell asks for; no CUDA device for a
GPU precision), oom, or error with the traceback.
"""
from __future__ import annotations

from flashwatt.distributed.cell import DistributedCell
from flashwatt.job_frame import CellOutcome, Job, run_in_frame

KIND = "distributed"


def outcome_of(result: dict) -> tuple[str, str | None]:
    """The cell's status and reason from the job's result."""
    status = result.get("status")
    if status == "failed":
        text = str(result.get("reason", ""))
        return ("oom", text) if "out of memory" in text.lower() else ("error", text)
    if status == "ok" and result.get("check") and not result["check"].get("passed", False):
        check = result["check"]
        worst = {name: f"{check['error'][name]:.3g} (tol {check['tolerance'][name]:.3g})" for name in check["error"]
                 if not check["error"][name] <= check["tolerance"][name]}
        return "incorrect", "check against float64 failed: " + ", ".join(f"{k} {v}" for k, v in worst.items())
    return status or "error", result.get("reason")


def run_distributed_cell(cell: DistributedCell, spec: dict) -> CellOutcome | None:
    """Run the cell on this task; the outcome on rank 0, None on the others."""

    def body(job: Job) -> list[dict]:
        from flashwatt.distributed.job import job as run_on_every_rank

        result = run_on_every_rank(spec)
        if result is None:
            job.rank_zero = False
            return []
        record = job.record
        record["status"], record["reason"] = outcome_of(result)
        if result.get("traceback"):
            record["traceback"] = result["traceback"]
        record["result"] = {k: v for k, v in result.items()
                            if k not in ("status", "reason", "traceback", "spec", "trace")}
        return result.get("trace") or []

    return run_in_frame(KIND, cell, spec, body)
