"""What an attention cell's job runs: one attention call checked against float64, timed,
and its energy measured over a window of back-to-back calls (flashwatt.job_frame runs it
and turns every other outcome into a record).
"""
from __future__ import annotations

from flashwatt.attention.cell import Cell
from flashwatt.job_frame import CellOutcome, Job, run_in_frame
from flashwatt.settings import MeasureSettings

KIND = "attention"


def run_cell(cell: Cell, settings: "MeasureSettings | dict") -> CellOutcome:
    """Measure one cell; never raises for a problem of the cell itself."""
    settings = MeasureSettings.from_mapping(settings)

    def body(job: Job) -> list[dict]:
        from flashwatt import measure
        from flashwatt.kernels import get_kernel

        device = job.open_device(settings)
        kernel = get_kernel(cell.kernel)
        reason = kernel.supports(cell, device)
        if reason is None and cell.pass_ == "fwd_bwd" and not kernel.differentiable:
            reason = f"{cell.kernel} has no backward pass"
        if reason is not None:
            job.skip(reason)
        with measure.precision_mode(cell):
            return _measure(cell, settings, device, kernel, job.telemetry, job.record)

    # The spec of an attention cell is its measurement settings, recorded as `settings`.
    return run_in_frame(KIND, cell, settings.as_dict(), body, spec_field="settings")


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
        parts = time_parts(kernel, cell, inputs, device, settings)
        if parts:
            record["parts"] = parts
    record["status"] = "ok" if check.passed else "incorrect"
    if not check.passed:
        record["reason"] = (
            f"check against float64 failed: rel_err={check.rel_err:.3g} (tol {check.tol:g})"
            + (f", grad rel_err={check.grad_rel_err:.3g} (tol {check.grad_tol:g})" if check.grad_tol else "")
            + ("" if check.finite else ", non-finite output")
        )
    return trace


def time_parts(kernel, cell: Cell, inputs: list, device, settings: MeasureSettings) -> dict:
    """Each part of the call that the kernel names (an fp8 call: quantisation and kernel) timed
    alone by the cell's own timing method, its share of the whole call's median beside it;
    {} where the call is one piece. The call's own time and energy include every part."""
    from flashwatt import measure
    from flashwatt.timing import Workload, time_workload

    named = kernel.parts(cell, inputs) if getattr(kernel, "parts", None) is not None else {}
    out = {}
    for name, call in named.items():
        per_call_s = measure.warm_up(call, device, settings.warmup_ms)
        timing = time_workload(Workload.build(call, device, per_call_s, use_graph=settings.cuda_graph), settings)
        out[name] = {key: timing.get(key) for key in ("median_ms", "p10_ms", "p90_ms", "method")}
    return out


def timing_vs_window(median_ms: float, window_s_per_call: float | None) -> dict:
    """The energy window's time per call beside the timed latency, and their difference in %."""
    if window_s_per_call is None or not median_ms:
        return {"window_ms_per_call": None, "timed_vs_window_pct": None}
    window_ms = window_s_per_call * 1e3
    return {"window_ms_per_call": window_ms, "timed_vs_window_pct": (median_ms - window_ms) / window_ms * 100}
