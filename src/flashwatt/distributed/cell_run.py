"""What a distributed cell's job runs: on each node of the cell, one task that supervises
that node's ranks (flashwatt.distributed.rank_supervisor), each rank running
`flashwatt.distributed.job.job`; rank 0's result becomes the cell's record, on the first node.

Every outcome is a record: ok, incorrect (the gathered output or gradients failed their
check against float64), skipped (fewer GPUs than the cell asks for; no CUDA device for a
GPU precision), and, when a rank ends badly, oom (it ran out of memory), error (it
raised: a collective timing out included) or job_failed (it was killed, or exited without
an exception), naming the rank and how it ended, every rank of the cell stopped within
the failure policy's bound (`ranks` in the record).
"""
from __future__ import annotations

from flashwatt.distributed.cell import DistributedCell
from flashwatt.job_frame import CellOutcome, Job, run_in_frame

KIND = "distributed"
RANK_JOB = "flashwatt.distributed.job:job"


def outcome_of(result: dict) -> tuple[str, str | None]:
    """The cell's status and reason from rank 0's result."""
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


def record_failed_ranks(record: dict, outcome) -> None:
    """A cell whose ranks did not all end cleanly: its status, reason and traceback from
    the rank that ended it (flashwatt.distributed.rank_fate)."""
    record["status"], record["reason"] = outcome.status(), outcome.reason()
    traceback = outcome.traceback()
    if traceback:
        record["traceback"] = traceback
    culprit = outcome.culprit
    if culprit is not None and culprit.oom and culprit.stage:
        record["oom_stage"] = culprit.stage


def run_distributed_cell(cell: DistributedCell, spec: dict, rank_job: str = RANK_JOB) -> CellOutcome | None:
    """Supervise this node's ranks of the cell, each running `rank_job(spec)` ("module:function",
    flashwatt.distributed.job.job unless a caller wraps it); the outcome on the first node,
    None on the others."""

    def body(job: Job) -> list[dict]:
        from flashwatt.distributed.rank_supervisor import run_ranks
        from flashwatt.distributed.rendezvous import node_layout

        layout = node_layout(cell.gpus, cell.nodes)
        job.rank_zero = layout.node == 0
        outcome = run_ranks(rank_job, (spec,), layout)
        record = job.record
        record["ranks"] = outcome.record_fields()
        if outcome.failed:
            record_failed_ranks(record, outcome)
            return []
        result = outcome.result
        if not job.rank_zero:
            return []
        if result is None:
            raise RuntimeError("every rank ended cleanly but rank 0 returned no result")
        record["status"], record["reason"] = outcome_of(result)
        if result.get("traceback"):
            record["traceback"] = result["traceback"]
        record["result"] = {k: v for k, v in result.items()
                            if k not in ("status", "reason", "traceback", "spec", "trace")}
        return result.get("trace") or []

    return run_in_frame(KIND, cell, spec, body)
