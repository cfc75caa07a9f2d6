"""Runs control scenarios on a GPU and measures them: the controller's side of the control suite.

`run_scenario` drives a workload through a `Controller` for the scenario's time (its budget
schedule, tenants started alongside and measured alone first, NVML failing in spans, the
workload changing) and returns its figures of merit (flashwatt.control.metrics and
flashwatt.control.scenario_merit) and its trace; `oracle` runs every static
configuration at a grid of duties, the side-by-side baseline a controlled run is judged
against. Every run ends with the controller's output checked against float64.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from flashwatt.control.configuration import Configuration, ControlError
from flashwatt.control.controller import Controller
from flashwatt.control.counter_meter import judged_by_meter, meter_for, meter_merit
from flashwatt.control.metrics import run_merit
from flashwatt.control.scenario_merit import ScenarioFacts, scenario_merit
from flashwatt.control.sensor import SensorThread
from flashwatt.control.tenants import TenantProcess
from flashwatt.control.thermal_merit import temperature_merit
from flashwatt.control.workloads import Scenario, Workload
from flashwatt.kernels import get_kernel
from flashwatt.measure import check_rows, reference_attention, relative_error
from flashwatt.vocabulary import TOLERANCE

# After the tenants' power is measured alone, the board rests this long before the run.
REST_AFTER_TENANTS_S = 1.0
# An oracle first runs its first configuration this long, unrecorded, so its first row is
# measured on a card as warm as its others (oracle).
ORACLE_WARMUP_S = 3.0


class FailingTelemetry:
    """Real telemetry whose readings fail in given spans of a run, as a hung NVML would."""

    def __init__(self, inner, spans: tuple[tuple[float, float], ...]):
        self._inner, self._spans, self._t0 = inner, tuple(spans), None
        self.available, self.reason, self.devices = inner.available, inner.reason, inner.devices

    def start(self, t0: float) -> None:
        """The run starts now (monotonic `t0`): spans count from here."""
        self._t0 = t0

    def sample(self):
        if self._t0 is not None:
            t = time.monotonic() - self._t0
            if any(start <= t < start + seconds for start, seconds in self._spans):
                raise RuntimeError("NVMLError_Unknown: injected failure (NVML stopped answering)")
        return self._inner.sample()

    def energy_mj(self):
        return self._inner.energy_mj()

    def close(self):
        self._inner.close()


def check_output(ctl: Controller, inputs: dict, workload: Workload) -> dict:
    """The controller's output for each shape against float64 (batch 0, head 0, spread rows),
    within the inputs' precision's bound, or the user's tolerance where it is wider (the
    controller may then have taken a cheaper precision)."""
    worst = 0.0
    tol = max(TOLERANCE[workload.dtype]["fwd"], ctl.precision_tolerance or 0.0)
    for shape, (q, k, v) in inputs.items():
        with torch.no_grad():
            out = ctl.attention(q, k, v, causal=workload.causal)
            rows = check_rows(shape[2], 512)
            ref = reference_attention(q[0, :1], k[0, :1], v[0, :1], workload.causal, rows)
            err = relative_error(out[0, :1][:, rows.to(out.device)], ref)
        worst = max(worst, err) if err == err else float("nan")
    return {"rel_err": worst, "tol": tol, "passed": bool(worst <= tol)}


def _start_tenants(scenario: Scenario, telemetry, device: torch.device,
                   started: list[TenantProcess] | None = None) -> tuple[list[TenantProcess], list[dict]]:
    """Start every tenant's process (or take those `started` earlier), wait until each is
    ready, and measure each one's power alone (one after another, the GPU otherwise idle)."""
    processes = list(started) if started else [TenantProcess(tenant, str(device)) for tenant in scenario.tenants]
    facts = []
    try:
        for process in processes:
            process.wait_ready()
        for process in processes:
            alone = process.calibrate(telemetry)
            facts.append({**process.tenant.as_spec(), "alone_w": alone})
    except BaseException:
        for process in processes:
            process.finish(timeout=5.0)
        raise
    if processes:
        time.sleep(REST_AFTER_TENANTS_S)  # the board's power falls back before the run
    return processes, facts


def _preheat(scenario: Scenario, telemetry, device: torch.device) -> dict:
    """A hot start: the workload at full duty (PyTorch's default) for `preheat_s`, then the
    temperature limit `temp_below_c` under where that left the board."""
    from dataclasses import replace

    heat = replace(scenario, name="preheat", mode="static", configuration="sdpa_default", duty=1.0, budget_w=None,
                   schedule=(), seconds=scenario.preheat_s, tenants=(), nvml_failures=(), mix_change=None,
                   preheat_s=0.0, temp_below_c=None)
    run_scenario(heat, None, device, cache=None)
    readings = [row.get("gpu_temp_c") for row in telemetry.sample()] if telemetry is not None else []
    temp = readings[0] if readings else None
    if temp is None:
        raise ControlError("hot start: NVML gave no temperature after the preheat, so no limit can be set under it")
    return {"preheat_s": scenario.preheat_s, "preheat_temp_c": temp, "temp_limit_c": temp - scenario.temp_below_c}


def _drive(ctl: Controller, scenario: Scenario, inputs: dict, t0: float) -> None:
    """Call the controller with the scenario's workloads until its time is up, setting the
    budget as the schedule says."""
    budget = scenario.budget()
    timeline = budget.timeline() if budget is not None else []
    phases = [(at, workload, workload.order()) for at, workload in scenario.phases()]
    with torch.no_grad():
        while True:
            now = time.monotonic() - t0
            if now >= scenario.seconds:
                break
            while timeline and now >= timeline[0][0]:
                ctl.set_budget(timeline.pop(0)[1])
            while len(phases) > 1 and now >= phases[1][0]:
                phases.pop(0)
            _, workload, order = phases[0]
            shape = next(order)
            q, k, v = inputs[workload][shape]
            ctl.attention(q, k, v, causal=workload.causal)


def run_scenario(scenario: Scenario, telemetry, device: torch.device, idle_w: float | None = None,
                 cache="default", started: list[TenantProcess] | None = None) -> tuple[dict, pd.DataFrame]:
    """Run a scenario; its figures of merit and trace. `cache`: the warm-start cache's root
    (flashwatt.control.warm_start; "default" its usual place, None off). `started`: the
    scenario's tenants' processes, started earlier by the caller (they import torch while
    it warms up)."""
    inputs = {workload: workload.inputs(device) for _, workload in scenario.phases()}
    tenants, tenant_facts = _start_tenants(scenario, telemetry, device, started) if scenario.tenants else ([], [])
    observed: list = []
    observer = None
    controller_telemetry = telemetry
    if scenario.nvml_failures:
        # The controller's NVML fails; an independent reader of the same (working) NVML
        # records what the board draws meanwhile, so windows are judged on measured watts.
        observer = SensorThread(telemetry, observed.append).start()
        controller_telemetry = FailingTelemetry(telemetry, scenario.nvml_failures)
    budget = scenario.budget()
    ctl = None
    hot = _preheat(scenario, telemetry, device) if scenario.preheat_s else None
    # The judge's own reader of the energy counter, with the time of each of its updates
    # (flashwatt.control.counter_meter): the run's windows are judged by it.
    meter = meter_for(telemetry)
    try:
        ctl = Controller(scenario.mode, budget.first_w if budget is not None else None, device,
                         telemetry=controller_telemetry, idle_w=idle_w, configuration=scenario.configuration,
                         duty=scenario.duty, max_slowdown=scenario.max_slowdown, cache=cache,
                         precision_tolerance=scenario.precision_tolerance, pace_cycle_s=scenario.pace_cycle_s,
                         pace_mix=scenario.pace_mix, temp_limit_c=hot["temp_limit_c"] if hot else None)
        torch.cuda.synchronize(device)
        t0 = time.monotonic()
        if isinstance(controller_telemetry, FailingTelemetry):
            controller_telemetry.start(t0)
        for process in tenants:
            process.schedule(t0)
        _drive(ctl, scenario, inputs, t0)
        torch.cuda.synchronize(device)
        wall = time.monotonic() - t0
        checks = [check_output(ctl, inputs[workload], workload) for _, workload in scenario.phases()]
    finally:
        if observer is not None:
            observer.stop()
        if ctl is not None:
            ctl.close()
        if meter is not None:
            # (on until an update after the controller's last tick: the run's last window is judged too)
            meter.stop(after=time.monotonic())
        for process in tenants:
            process.finish(timeout=max(t.start_s + t.seconds for t in scenario.tenants) + 30.0)
    trace = ctl.trace()
    if len(trace):
        trace["t"] = trace["t"] - t0
    if observed:
        trace = _with_observer(trace, observed, t0)  # windows are judged by the board's counter
    trace = judged_by_meter(trace, meter, t0)
    merit = _merit(scenario, ctl, trace, wall, tenant_facts, idle_w)
    merit.update(meter_merit(meter))
    if hot is not None:
        merit.update(hot, **temperature_merit(trace))
    worst = max((c["rel_err"] for c in checks), key=lambda e: float("inf") if e != e else e)
    merit.update(check_rel_err=worst, check_tol=min(c["tol"] for c in checks),
                 check_passed=all(c["passed"] for c in checks))
    if observed:
        merit["fallback_observed_w"] = fallback_power(trace)
    trace["scenario"] = scenario.name
    merit["model"] = ctl.model_table().to_dict("records")
    return merit, trace


def _merit(scenario: Scenario, ctl: Controller, trace: pd.DataFrame, wall: float, tenant_facts: list[dict],
           idle_w: float | None) -> dict:
    budget = scenario.budget()
    first_tenant = min(t.start_s for t in scenario.tenants) if scenario.tenants else None
    merit = run_merit(trace, tokens=ctl.tokens, wall_s=wall, disturbance_at_s=first_tenant)
    merit.update(scenario_merit(trace, _facts(scenario, ctl, tenant_facts, idle_w)))
    merit.update(scenario=scenario.name, mode=scenario.mode, budget_w=budget.first_w if budget else None,
                 calls=ctl.calls, slept_s=ctl.slept_s, idle_w=ctl.idle_w, limit_w=ctl.limit_w,
                 warm_start=ctl.warm_start())
    return merit


def _facts(scenario: Scenario, ctl: Controller, tenant_facts: list[dict], idle_w: float | None) -> ScenarioFacts:
    return ScenarioFacts(schedule=scenario.budget(), tenants=tenant_facts, idle_w=ctl.idle_w if idle_w is None else idle_w,
                         phases=[(at, workload.group) for at, workload in scenario.phases()],
                         nvml_failures=list(scenario.nvml_failures))


def fallback_power(trace: pd.DataFrame, settle_s: float = 0.5) -> float | None:
    """Average power the board drew, by the independent reader's counter, while the
    controller held its fallback (each stretch from `settle_s` after it began)."""
    if "board_energy_mj" not in trace or "phase" not in trace:
        return None
    fallback = (trace["phase"] == "fallback").to_numpy()
    t, energy = trace["t"].to_numpy(dtype=float), trace["board_energy_mj"].to_numpy(dtype=float)
    joules = seconds = 0.0
    i = 0
    while i < len(t):
        if not fallback[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(t) and fallback[j + 1]:
            j += 1
        # The counter's readings inside the stretch: the reader runs every 0.1 s, so the
        # stretch's last ticks can fall after its last reading (no value there).
        inside = [n for n in range(np.searchsorted(t, t[i] + settle_s), j + 1) if np.isfinite(energy[n])]
        if len(inside) >= 2:
            begin, end = inside[0], inside[-1]
            joules += (energy[end] - energy[begin]) / 1e3
            seconds += t[end] - t[begin]
        i = j + 1
    return joules / seconds if seconds > 0 else None


def _with_observer(trace: pd.DataFrame, observed: list, t0: float) -> pd.DataFrame:
    """The independent reader's readings beside each tick: its power (nearest reading) and the
    board's energy counter at the tick's time (interpolated: readings are 0.1 s apart, and a
    nearest one would put up to 50 ms of energy in the wrong window)."""
    seen = pd.DataFrame([{"t": r.t - t0, "observed_power_w": r.power_w, "observed_energy_mj": r.energy_mj}
                         for r in observed]).sort_values("t")
    out = pd.merge_asof(trace.sort_values("t"), seen[["t", "observed_power_w"]], on="t", direction="nearest")
    counter = seen.dropna(subset=["observed_energy_mj"])
    if len(counter) >= 2:
        t = out["t"].to_numpy(dtype=float)
        inside = (t >= counter["t"].iloc[0]) & (t <= counter["t"].iloc[-1])
        out["board_energy_mj"] = np.where(inside, np.interp(t, counter["t"], counter["observed_energy_mj"]), np.nan)
    return out


def oracle(workload: Workload, telemetry, device: torch.device, configs: list[str], duties: dict[str, list[float]],
           seconds: float, idle_w: float | None, pace_cycle_s: float = 0.0,
           traces: list[pd.DataFrame] | None = None) -> pd.DataFrame:
    """Every static configuration at each of its duties: throughput, power, J/token; then the
    first one again (`repeat`), so the card's drift over the oracle (it warms) is measured
    rather than hidden in the comparison. Paced as the runs it judges are (`pace_cycle_s`).
    Before the first row, ORACLE_WARMUP_S of the first configuration at full duty, not
    recorded: a first row measured on a card cooler than the rest drew less than its own
    repeat (the stream's cuDNN row on an H200: 660 W first, 685 W at the end, +3.8 %), and
    the front then asks the runs for watts the board no longer gives. `traces`, where given,
    gets each row's trace (its `scenario` the row's name), so a row's watts can be read tick
    by tick beside the runs it judges."""
    rows = []
    runs = [(label, duty) for label in configs for duty in duties.get(label, [1.0])]
    if runs:
        warm_up = Scenario(f"warm-up {runs[0][0]}", workload, "static", configuration=runs[0][0], duty=1.0,
                           seconds=ORACLE_WARMUP_S, pace_cycle_s=pace_cycle_s)
        try:
            run_scenario(warm_up, telemetry, device, idle_w, cache=None)
        except Exception:  # noqa: BLE001 - the first row runs it again and records why it cannot
            pass
    for i, (label, duty) in enumerate([*runs, runs[0]] if runs else []):
        scenario = Scenario(f"static {label} d{duty:g}", workload, "static", configuration=label, duty=duty,
                            seconds=seconds, pace_cycle_s=pace_cycle_s)
        try:
            merit, trace = run_scenario(scenario, telemetry, device, idle_w)
        except Exception as err:  # a configuration the device refuses is a row, not a crash
            rows.append({"config": label, "duty": duty, "error": f"{type(err).__name__}: {err}",
                         "repeat": i == len(runs)})
            continue
        rows.append({"config": label, "duty": duty, "tokens_per_s": merit["tokens_per_s"],
                     "avg_power_w": merit.get("avg_power_w"), "j_per_token": merit.get("j_per_token"),
                     "check_passed": merit["check_passed"], "check_rel_err": merit["check_rel_err"],
                     "repeat": i == len(runs)})
        if traces is not None:
            traces.append(trace.assign(repeat=i == len(runs)))
    return pd.DataFrame(rows)


def bare_loop_tokens_per_s(workload: Workload, label: str, device: torch.device, seconds: float) -> float:
    """Tokens/s of the same configuration called straight through the registry, no controller."""
    config = Configuration.parse(label)
    inputs = workload.inputs(device)
    (shape, (q, k, v)), = inputs.items()
    from flashwatt.attention.cell import Cell

    cell = Cell("control", config.backend, workload.dtype, shape[2], shape[0], shape[1], shape[3], workload.causal,
                "fwd", config.variant)
    kernel = get_kernel(config.backend)
    with torch.no_grad():
        for _ in range(3):
            kernel(q, k, v, cell)
        torch.cuda.synchronize(device)
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            kernel(q, k, v, cell)
            n += 1
        torch.cuda.synchronize(device)
    return n * shape[0] * shape[2] / (time.monotonic() - t0)
