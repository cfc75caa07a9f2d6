"""Cells this host cannot run, known before any job starts, and their records.

Where the cells run on this host (every executor but Slurm's), a cell that cannot run
here is known from the plan alone: a cell needing CUDA on a host that shows no CUDA
device (each kind says which, `Kind.refusal_without_cuda`), or a cell asking for more
GPUs than the host shows. Such a cell would start a job only for the job to record
`skipped`; instead the workflow writes that record itself, in one job for all of them,
in the words the job would have used, and says up front how many cells it is and why.

Under the Slurm executor nothing is decided here: the login node that plans has no GPU,
the compute nodes that run the cells do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from flashwatt.devices import visible_gpu_ids
from flashwatt.kind import Kind
from flashwatt.submit.slots import TOO_FEW_GPUS_REASON, gpu_shortage


@dataclass(frozen=True)
class Host:
    """The CUDA devices this process may use (their ids; none on a CPU host)."""

    gpus: tuple[str, ...]

    @classmethod
    def here(cls) -> "Host":
        return cls(tuple(visible_gpu_ids()))


def runs_here(config: dict) -> bool:
    """Whether the config's cells run on this host (not on Slurm's compute nodes)."""
    return config.get("executor") != "slurm"


def refusal(kind: Kind, cell: Any, host: Host) -> str | None:
    """Why `cell` cannot run on `host`, in the words its job would record, or None."""
    if not host.gpus:
        return kind.refusal_without_cuda(cell) if kind.refusal_without_cuda is not None else None
    shortage = gpu_shortage(kind.resources(cell)["gpus"], list(host.gpus))
    return TOO_FEW_GPUS_REASON.format(shortage) if shortage is not None else None


def refused_here(plans: dict[str, dict], host: Host) -> dict[Any, tuple[Kind, dict, str]]:
    """{cell: (kind, spec, reason)} for each planned cell (plans: {kind name: {cell: spec}},
    as flashwatt.kinds.plan_suite gives them) that cannot run on `host`."""
    from flashwatt.kinds import kind_named

    refused = {}
    for kind_name, cells in plans.items():
        kind = kind_named(kind_name)
        for cell, spec in cells.items():
            reason = refusal(kind, cell, host)
            if reason is not None:
                refused[cell] = (kind, spec, reason)
    return refused


def notice(refused: int, planned: int, host: Host, suite: str) -> str:
    """The line said before the run starts: how many cells cannot run here, and why."""
    why = ("no CUDA device is visible on this host" if not host.gpus
           else f"they ask for more than the {len(host.gpus)} GPU(s) this host shows")
    line = f"flashwatt: {refused} of {planned} cells cannot run here: {why}; they are recorded as skipped without a job"
    if refused == planned:
        line += (f" (suite {suite} needs GPUs: run it where they are, e.g. snakemake --profile slurm "
                 f"--config suite={suite})")
    return line


def write_skips(skips: Iterable[tuple[str, str, dict, str]], executor: str) -> int:
    """Write the record and the (empty) trace of each (kind name, record path, spec,
    reason) as its job would for a cell it skips; the number written."""
    import torch

    from flashwatt.job_frame import device_identity
    from flashwatt.kinds import kind_named
    from flashwatt.provenance import provenance, utc_now
    from flashwatt.records import write_record, write_trace

    # What a job would say of where it ran, but no job ran: no job id; on a host without
    # CUDA its device is this host's CPU (a cell asking for too many GPUs names none, as
    # flashwatt.cell_job records it).
    origin = {**provenance(), "executor": executor, "job_id": None, "skipped_before_submission": True}
    device = {} if Host.here().gpus else {"device": device_identity(torch.device("cpu"), None)}
    written = 0
    for kind_name, path, spec, reason in skips:
        kind = kind_named(kind_name)
        cell = kind.cell.from_path(path)
        record = kind.envelope(cell, spec)
        record.update(status="skipped", reason=reason, provenance=origin, **device, finished=utc_now(), duration_s=0.0)
        write_trace(cell.trace_path, [])
        write_record(cell.path, record)
        written += 1
    return written
