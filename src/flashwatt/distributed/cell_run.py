"""What a distributed cell's job runs on each of its tasks: `flashwatt.distributed.job.job`,
whose rank-0 result becomes the cell's record.

Every outcome is a record: ok, incorrect (the gathered output or gradients failed their
check against float64), skipped (fewer GPUs than the cell asks for; no CUDA device for a
GPU precision), oom, or error with the traceback.
"""
from __future__ import annotations

import time
import traceback

from flashwatt.distributed.cell import DistributedCell
from flashwatt.provenance import provenance, utc_now
from flashwatt.attention.job import CellOutcome

SCHEMA_VERSION = 1


def base_record(cell: DistributedCell, spec: dict) -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": "distributed", "cell": cell.as_row(), "status": None,
            "reason": None, "spec": dict(spec), "started": utc_now()}



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
    record = base_record(cell, spec)
    trace: list[dict] = []
    t0 = time.perf_counter()
    try:
        record["provenance"] = provenance()
        from flashwatt.distributed.job import job

        result = job(spec)
        if result is None:
            return None  # not rank 0
        record["status"], record["reason"] = outcome_of(result)
        if result.get("traceback"):
            record["traceback"] = result["traceback"]
        record["result"] = {k: v for k, v in result.items()
                            if k not in ("status", "reason", "traceback", "spec", "trace")}
        trace = result.get("trace") or []
    except Exception as err:
        record.update(status="error", reason=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    record["finished"] = utc_now()
    record["duration_s"] = round(time.perf_counter() - t0, 3)
    return CellOutcome(record, trace)
