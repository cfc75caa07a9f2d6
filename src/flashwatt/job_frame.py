"""The frame every cell's job runs in, whatever its kind: one cell in, one record (and its
telemetry trace) out.

    outcome = run_in_frame(kind, cell, spec, body)

The frame starts the record's envelope (schema version, kind, the cell's row, its spec,
status and reason, provenance, start and end times, seconds spent) and calls
`body(job)`, which measures and fills `job.record` (its status included) and returns the
trace rows. `job` gives the body the one way to pick the device and open its NVML
telemetry (`job.open_device`), the stages a job goes through (`job.stages`: an
out-of-memory record names the stage it happened in), and `job.skip(reason)`.

Around the body, every outcome that is not the measurement's own becomes a record, so a
job never raises for a problem of its cell:

    skipped   the cell cannot run here (CellSkipped: a backend refusing a shape, a budget the
              GPU cannot hold, no CUDA device), with the reason
    oom       the device refused an allocation, naming the stage
    error     anything else, with the traceback
    job_failed  the job died before returning (written by the submitting side: cell_job)

`ok`, `incorrect` (measured, but the check against float64 failed) and `diverged` (a
training run's loss turned non-finite) are the body's own. The job never writes files:
the submitting side writes the record once, atomically, so a requeued or killed job
cannot leave half a result behind.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from flashwatt.kernels.base import UnsupportedCell
from flashwatt.provenance import provenance, utc_now
from flashwatt.records import SCHEMA_VERSION
STATUSES = ("ok", "incorrect", "skipped", "oom", "error", "diverged", "job_failed")
# Outcomes a suite expects (a backend refusing a shape, a shape too large for the card);
# any other status makes a run exit non-zero.
EXPECTED_STATUSES = frozenset({"ok", "skipped", "oom"})


@dataclass
class CellOutcome:
    record: dict
    trace: list[dict] = field(default_factory=list)


class CellSkipped(Exception):
    """The cell cannot run here; the message says why and becomes a `skipped` record's reason."""


def envelope(kind: str, cell: Any, spec: dict, spec_field: str = "spec") -> dict:
    """The start of every record: what measured what, before anything is measured."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "cell": cell.as_row(), "status": None, "reason": None,
            spec_field: dict(spec), "started": utc_now()}


def job_failed(record: dict, message: str, job_id: str | None) -> dict:
    """A record's envelope completed for a job that died before it could return one."""
    record.update(status="job_failed", reason=message, provenance={"job_id": job_id}, finished=utc_now())
    return record


class Stages:
    """The stage a job is in (named by an out-of-memory record) and the seconds spent in
    each, summed over its visits, in the record's `stages_s` once a stage is named."""

    def __init__(self, record: dict, first: str | None = None):
        self.record = record
        self.now, self.since = first, time.perf_counter()

    def enter(self, name: str | None) -> None:
        now = time.perf_counter()
        if self.now is not None:
            seconds = self.record.setdefault("stages_s", {})
            seconds[self.now] = seconds.get(self.now, 0.0) + now - self.since
        self.now, self.since = name, now


def select_device():
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_identity(device, telemetry) -> dict:
    """What the record says of the device: its name and properties, and NVML's identity."""
    import torch

    if device.type != "cuda":
        import platform

        return {"type": "cpu", "name": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(device)
    ident = {
        "type": "cuda",
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "uuid": str(getattr(props, "uuid", "")) or None,
    }
    if telemetry is not None and telemetry.available:
        ident["nvml"] = telemetry.identity()
    return ident


def open_cell_telemetry(device, settings=None):
    """NVML for the cell's GPU, or a NullTelemetry saying why there is none. `settings`
    (MeasureSettings) may switch energy off; without settings NVML is always opened."""
    from flashwatt.telemetry import NullTelemetry, open_telemetry

    if device.type != "cuda":
        return NullTelemetry("no CUDA device: energy is measured on NVIDIA GPUs only")
    if settings is not None and not settings.energy:
        return NullTelemetry("energy measurement switched off (measure.energy: false)")
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    return open_telemetry([uuid] if uuid else None)


class Job:
    """What the frame hands a body: the record, the stages, the device and its telemetry."""

    def __init__(self, record: dict, first_stage: str | None):
        self.record = record
        self.stages = Stages(record, first_stage)
        self.device = None
        self.telemetry = None
        # A job of several processes returns its record on rank 0 only (the body says).
        self.rank_zero = True

    def open_device(self, settings=None, cuda_only: str | None = None):
        """This process's device and its telemetry, both recorded. `cuda_only`, when given,
        is the reason a cell is skipped on a host without a CUDA device."""
        self.device = select_device()
        if cuda_only and self.device.type != "cuda":
            self.record["device"] = device_identity(self.device, None)
            raise CellSkipped(cuda_only)
        self.telemetry = open_cell_telemetry(self.device, settings)
        self.record["device"] = device_identity(self.device, self.telemetry)
        return self.device

    @staticmethod
    def skip(reason: str):
        raise CellSkipped(reason)


def _oom_reason(err: BaseException, stage: str | None) -> str:
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"out of memory during {stage}: {first}" if stage else f"out of memory: {first}"


def run_in_frame(kind: str, cell: Any, spec: dict, body: Callable[[Job], list[dict] | None],
                 spec_field: str = "spec", first_stage: str | None = None) -> CellOutcome | None:
    """Run `body` for `cell` in the frame; the outcome, or None on a rank other than 0.
    Never raises for a problem of the cell itself."""
    record = envelope(kind, cell, spec, spec_field)
    job = Job(record, first_stage)
    trace: list[dict] = []
    t0 = time.perf_counter()
    try:
        record["provenance"] = provenance()
        from flashwatt.measure import is_oom

        try:
            trace = body(job) or []
        except (CellSkipped, UnsupportedCell) as err:  # a backend refusing the inputs at call time
            record.update(status="skipped", reason=str(err))
        except Exception as err:
            if not is_oom(err):
                raise
            record.update(status="oom", reason=_oom_reason(err, job.stages.now))
            if job.stages.now:
                record["oom_stage"] = job.stages.now
        finally:
            if job.device is not None and job.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()
    except Exception as err:
        record.update(status="error", reason=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    finally:
        job.stages.enter(None)
        if job.telemetry is not None:
            job.telemetry.close()
        record["finished"] = utc_now()
        record["duration_s"] = round(time.perf_counter() - t0, 3)
    return CellOutcome(record, trace) if job.rank_zero else None
