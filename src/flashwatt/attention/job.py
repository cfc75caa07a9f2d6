"""What a cell's job runs: one cell in, one record (plus its telemetry trace) out.

Every outcome is a record: ok, incorrect (measured, but the check against float64
failed), skipped (the kernel cannot run the cell, with the reason), oom, or error (with
the traceback). The job never writes files; the submitting side writes the record once,
atomically, so a requeued or killed job cannot leave half a result behind.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

from flashwatt.attention.cell import Cell
from flashwatt.provenance import provenance, utc_now
from flashwatt.settings import MeasureSettings

SCHEMA_VERSION = 1
STATUSES = ("ok", "incorrect", "skipped", "oom", "error", "job_failed")


@dataclass
class CellOutcome:
    record: dict
    trace: list[dict] = field(default_factory=list)


def base_record(cell: Cell, settings: "MeasureSettings | dict") -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "cell": cell.as_row(),
        "status": None,
        "reason": None,
        "settings": MeasureSettings.from_mapping(settings).as_dict(),
        "started": utc_now(),
    }


def job_failed(record: dict, message: str, job_id: str | None) -> dict:
    """A cell's base record, of any kind, completed for a job that died before it could
    return one (killed, node failure)."""
    record.update(status="job_failed", reason=message, provenance={"job_id": job_id}, finished=utc_now())
    return record


def failed_job_record(cell: Cell, settings: "MeasureSettings | dict", message: str, job_id: str | None) -> dict:
    """The record for an attention cell whose job died before it could return one."""
    return job_failed(base_record(cell, settings), message, job_id)


def select_device():
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_identity(device, telemetry) -> dict:
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
    if telemetry.available:
        ident["nvml"] = telemetry.identity()
    return ident


def open_cell_telemetry(device, settings: MeasureSettings):
    """NVML for the cell's GPU, or a NullTelemetry saying why there is none."""
    from flashwatt.telemetry import NullTelemetry, open_telemetry

    if device.type != "cuda":
        return NullTelemetry("no CUDA device: energy is measured on NVIDIA GPUs only")
    if not settings.energy:
        return NullTelemetry("energy measurement switched off (measure.energy: false)")
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    return open_telemetry([uuid] if uuid else None)


def run_cell(cell: Cell, settings: "MeasureSettings | dict") -> CellOutcome:
    """Measure one cell; never raises for a problem of the cell itself."""
    settings = MeasureSettings.from_mapping(settings)
    record = base_record(cell, settings)
    trace: list[dict] = []
    t0 = time.perf_counter()
    telemetry = None
    try:
        record["provenance"] = provenance()
        import torch

        from flashwatt import measure
        from flashwatt.kernels import get_kernel
        from flashwatt.kernels.base import UnsupportedCell

        device = select_device()
        telemetry = open_cell_telemetry(device, settings)
        record["device"] = device_identity(device, telemetry)
        kernel = get_kernel(cell.kernel)
        reason = kernel.supports(cell, device)
        if reason is None and cell.pass_ == "fwd_bwd" and not kernel.differentiable:
            reason = f"{cell.kernel} has no backward pass"
        if reason is not None:
            record.update(status="skipped", reason=reason)
            return CellOutcome(record, trace)
        try:
            with measure.precision_mode(cell):
                trace = _measure(cell, settings, device, kernel, telemetry, record)
        except UnsupportedCell as err:
            record.update(status="skipped", reason=str(err))
        except Exception as err:
            if not measure.is_oom(err):
                raise
            record.update(status="oom", reason=f"out of memory: {str(err).splitlines()[0]}")
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except Exception as err:
        record.update(status="error", reason=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    finally:
        if telemetry is not None:
            telemetry.close()
        record["finished"] = utc_now()
        record["duration_s"] = round(time.perf_counter() - t0, 3)
    return CellOutcome(record, trace)


def kernel_details(kernel, cell: Cell) -> dict:
    """What the kernel's optional `describe` says of this cell (build, launch); a failure is recorded."""
    describe = getattr(kernel, "describe", None)
    if describe is None:
        return {}
    try:
        return dict(describe(cell))
    except Exception as err:  # a missing detail must not cost the measurement
        return {"kernel_details_error": f"{type(err).__name__}: {err}"}


def _measure(cell: Cell, settings: MeasureSettings, device, kernel, telemetry, record: dict) -> list[dict]:
    import torch

    from flashwatt import measure
    from flashwatt.energy import cooldown, gflops_per_watt, measure_energy
    from flashwatt.timing import Workload, time_workload

    sets = measure.input_sets_needed(cell, device) if settings.rotate_inputs else 1
    inputs = measure.make_inputs(cell, device, settings.seed, sets)
    record["memory"] = {"input_bytes_per_set": measure.input_bytes(cell), "input_sets": sets}

    # Correctness first: a wrong kernel's speed is not a result.
    check = measure.check_cell(kernel, cell, *inputs[0], settings.check_max_rows, settings.seed)
    record["check"] = check.as_dict()
    record.update(kernel_details(kernel, cell))

    dout = None
    if cell.pass_ == "fwd_bwd":
        gen = torch.Generator(device=device).manual_seed(settings.seed + 2)
        shape = (cell.batch, cell.heads, cell.seq_len, cell.head_dim)
        dout = torch.randn(shape, generator=gen, device=device).to(measure.DTYPES[cell.precision])
    call = measure.make_call(kernel, cell, inputs, dout)
    grad = torch.enable_grad() if cell.pass_ == "fwd_bwd" else torch.no_grad()
    with grad:
        record["memory"].update(measure.peak_memory(call, device))
        per_call_s = measure.warm_up(call, device, settings.warmup_ms)
        # One workload for timing and the energy window: k calls per step, a CUDA graph
        # replay where the backend can be captured (flashwatt.timing says why).
        workload = Workload.build(call, device, per_call_s, use_graph=settings.cuda_graph)
        timing = time_workload(workload, settings)
        timing["tflops"] = cell.flops / (timing["median_ms"] * 1e-3) / 1e12
        timing["flops_per_call"] = cell.flops
        record["timing"] = timing

        trace: list[dict] = []
        if telemetry.available:
            cooldown(telemetry, max_temp_c=settings.cooldown_max_temp_c, seconds=settings.cooldown_s or None)
            window = measure_energy(
                workload.step,
                lambda: torch.cuda.synchronize(device),
                telemetry,
                **settings.energy_window(),
                calls_per_step=workload.k,
            )
            energy = window.as_dict()
            energy["gflops_per_w"] = gflops_per_watt(cell.flops, window.energy_per_call_j)
            record["energy"] = energy
            timing.update(timing_vs_window(timing["median_ms"], window.time_per_call_s))
            trace = [dict(row) for row in window.trace]
        else:
            record["energy"] = {"reason": telemetry.reason}
    record["status"] = "ok" if check.passed else "incorrect"
    if not check.passed:
        record["reason"] = (
            f"check against float64 failed: rel_err={check.rel_err:.3g} (tol {check.tol:g})"
            + (f", grad rel_err={check.grad_rel_err:.3g} (tol {check.grad_tol:g})" if check.grad_tol else "")
            + ("" if check.finite else ", non-finite output")
        )
    return trace


def timing_vs_window(median_ms: float, window_s_per_call: float | None) -> dict:
    """The energy window's time per call beside the timed latency, and their difference in %."""
    if window_s_per_call is None or not median_ms:
        return {"window_ms_per_call": None, "timed_vs_window_pct": None}
    window_ms = window_s_per_call * 1e3
    return {"window_ms_per_call": window_ms, "timed_vs_window_pct": (median_ms - window_ms) / window_ms * 100}
