"""What a control cell's job runs: one controlled run, or the workload's oracle, on one GPU.

Like an attention cell's job (flashwatt.attention.job), it never raises for a problem of the cell:
every outcome is a record. ok (the run finished and the controller's output passed its
check against float64), incorrect (it did not), skipped (no CUDA device; a controlled mode
without NVML; a budget this GPU cannot hold, with the device's idle power and limit in
the reason), oom, or error with the traceback.

A run starts from what earlier runs on the same GPU and build learned (the warm-start
cache, flashwatt.control.warm_start; its place is $FLASHWATT_CONTROL_CACHE, default
results/control-cache) unless the suite's `warm_start` is false; `merit.warm_start` in
the record says what it started from.

Before anything is measured the job calls every configuration it may use once (our
kernel's build loads, cuDNN makes its plans), so the first calls of a run do not carry
one-off costs into the controller's model or the oracle's rows; then the GPU rests and
its idle power is read, the floor every budget must clear.
"""
from __future__ import annotations

import time

from flashwatt.control.cell import NO_CUDA_REASON, ControlCell
from flashwatt.job_frame import CellOutcome, CellSkipped, Job, run_in_frame

KIND = "control"
WARM_UP_S = 0.15  # each configuration's calls for this long: its one-off costs paid (cuDNN plans, loads)
REST_BEFORE_IDLE_S = 2.0
IDLE_WINDOW_S = 1.0


def scenario_of(cell: ControlCell, spec: dict):
    """The run a cell names, with the lengths, loads and (for a generated scenario) the
    schedule, tenants, failures and mix change its spec gives."""
    from flashwatt.control.tenants import Tenant
    from flashwatt.control.workloads import Scenario, Workload

    seed = int(spec.get("seed", 0))
    workload = Workload(cell.workload, dtype=cell.precision, causal=cell.causal, seed=seed)
    if cell.mode == "random":
        generated = spec["scenario"]
        change = generated.get("mix_change")
        mix = (float(change["at_s"]), Workload(change["to"], dtype=cell.precision, causal=cell.causal, seed=seed)) \
            if change else None
        return Scenario(cell.scenario, workload, "budget", schedule=tuple(tuple(c) for c in generated["schedule"]),
                        seconds=float(generated["seconds"]),
                        tenants=tuple(Tenant.from_spec(t) for t in generated.get("tenants", [])),
                        nvml_failures=tuple((float(a), float(b)) for a, b in generated.get("nvml_failures", [])),
                        mix_change=mix, pace_cycle_s=float(spec.get("pace_cycle_s", 0.0)),
                        pace_mix=_pace_mix(spec))
    tenants = ()
    if cell.disturbance == "colocated":
        load = spec.get("colocated", {})
        tenants = (Tenant("gemm", float(load.get("duty", 0.3)), float(cell.disturbance_at_s),
                          float(load.get("seconds", 7.0))),)
    tolerance = spec.get("precision_tolerance")
    hot = cell.disturbance == "hot_start"
    return Scenario(
        cell.scenario, workload, cell.mode,
        precision_tolerance=float(tolerance) if tolerance is not None else None,
        preheat_s=float(cell.disturbance_at_s) if hot else 0.0,
        temp_below_c=float(spec.get("hot_start", {}).get("below_c", 4.0)) if hot else None,
        budget_w=float(cell.budget_w) if len(cell.budgets) == 1 else None,
        schedule=tuple((float(t), float(w)) for t, w in cell.budgets) if len(cell.budgets) > 1 else (),
        seconds=float(spec.get("seconds", 14.0)),
        max_slowdown=cell.max_slowdown_pct / 100 if cell.max_slowdown_pct is not None else None,
        tenants=tenants,
        nvml_failures=((float(cell.disturbance_at_s), float("inf")),) if cell.disturbance == "nvml_failure" else (),
        pace_cycle_s=float(spec.get("pace_cycle_s", 0.0)),
        pace_mix=_pace_mix(spec),
    )


def _pace_mix(spec: dict) -> tuple[float, float] | None:
    mix = spec.get("pace_mix")
    return (float(mix[0]), float(mix[1])) if mix else None


def _configurations_used(cell: ControlCell, spec: dict) -> list[str]:
    from flashwatt.control.configuration import candidates

    if cell.mode == "oracle":
        return list(spec["oracle"]["configurations"])
    tolerance = spec.get("precision_tolerance")
    return ["sdpa_default", *(c.label for c in candidates(cell.precision, precision_opt_in=tolerance is not None,
                                                          tolerance=tolerance))]


def _warm_up(cell: ControlCell, spec: dict, device) -> list[dict]:
    """Call every configuration the cell may use for a moment; what refused is reported."""
    from dataclasses import replace

    from flashwatt.control.study import run_scenario

    scenario = scenario_of(cell, spec)
    refused = []
    for _, workload in scenario.phases():  # a generated scenario may change its workload mid-run
        for label in _configurations_used(cell, spec):
            warm = replace(scenario, name=f"warm-up {label}", workload=workload, mode="static", configuration=label,
                           duty=1.0, budget_w=None, schedule=(), seconds=WARM_UP_S, tenants=(), nvml_failures=(),
                           mix_change=None)
            try:
                run_scenario(warm, None, device)
            except Exception as err:  # noqa: BLE001 - the run itself will meet (and record) it too
                refused.append({"config": label, "workload": workload.group, "error": f"{type(err).__name__}: {err}"})
    return refused


def _oracle(cell: ControlCell, spec: dict, telemetry, device, idle_w, record: dict) -> list[dict]:
    """The oracle's table into the record; its rows' traces, tick by tick, returned."""
    from flashwatt.control.study import oracle

    settings = spec["oracle"]
    duties = {label: [1.0, *(d for d in settings["duties"] if d != 1.0)] if label in settings["paced"] else [1.0]
              for label in settings["configurations"]}
    scenario = scenario_of(cell, spec)
    traces: list = []
    table = oracle(scenario.workload, telemetry, device, list(settings["configurations"]), duties,
                   float(settings["seconds"]), idle_w, scenario.pace_cycle_s, traces=traces)
    record["oracle"] = table.to_dict("records")
    checked = table.dropna(subset=["check_passed"]) if "check_passed" in table else table.iloc[:0]
    failed = checked[~checked["check_passed"].astype(bool)]
    if len(failed):
        record.update(status="incorrect", reason="check against float64 failed for " +
                      ", ".join(f"{r.config} d{r.duty:g} (rel_err {r.check_rel_err:.3g})" for r in failed.itertuples()))
    else:
        record["status"] = "ok"
    return [row for trace in traces for row in trace.assign(cell_id=cell.id).to_dict("records")]


def _controlled(cell: ControlCell, spec: dict, telemetry, device, idle_w, record: dict, tenants: list) -> list[dict]:
    from flashwatt.control.study import run_scenario

    merit, trace = run_scenario(scenario_of(cell, spec), telemetry, device, idle_w,
                                cache="default" if spec.get("warm_start", True) else None, started=tenants)
    record["merit"] = merit
    if merit["check_passed"]:
        record["status"] = "ok"
    else:
        record.update(status="incorrect", reason=f"controller's output failed its check against float64: "
                                                 f"rel_err={merit['check_rel_err']:.3g} (tol {merit['check_tol']:g})")
    trace = trace.assign(cell_id=cell.id)
    return trace.to_dict("records")


def run_control_cell(cell: ControlCell, spec: dict) -> CellOutcome:
    """Run one control cell; never raises for a problem of the cell itself."""

    def body(job: Job) -> list[dict]:
        from flashwatt.control.configuration import ControlError
        from flashwatt.control.sensor import idle_power

        from flashwatt.control.tenants import TenantProcess

        device = job.open_device(cuda_only=NO_CUDA_REASON)
        telemetry, record = job.telemetry, job.record
        if cell.mode != "oracle" and not telemetry.available:
            job.skip(f"mode {cell.mode} needs live power readings from NVML: {telemetry.reason}")
        # Tenants' processes start first: they import torch while this job warms up.
        tenants = [TenantProcess(t, str(device)) for t in scenario_of(cell, spec).tenants] if cell.mode != "oracle" else []
        try:
            record["warm_up_refused"] = _warm_up(cell, spec, device)
            idle_w = None
            if telemetry.available:
                time.sleep(REST_BEFORE_IDLE_S)
                idle_w = idle_power(telemetry, seconds=IDLE_WINDOW_S)
            record["idle_w"] = idle_w
            if cell.mode == "oracle":
                return _oracle(cell, spec, telemetry if telemetry.available else None, device, idle_w, record)
            return _controlled(cell, spec, telemetry, device, idle_w, record, tenants)
        except ControlError as err:  # a budget or setting this GPU cannot hold
            raise CellSkipped(str(err)) from None
        finally:
            for process in tenants:
                process.finish(timeout=5.0)  # normally done already; a run that failed leaves them waiting

    return run_in_frame(KIND, cell, spec, body)
