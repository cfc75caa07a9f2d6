"""Runs control scenarios on a GPU and measures them: the controller's side of the control suite.

`run_scenario` drives a workload through a `Controller` for the scenario's time and returns
its figures of merit (flashwatt.control.metrics) and its trace; `oracle` runs every static
configuration at a grid of duties, the side-by-side baseline a controlled run is judged
against. Every run ends with the controller's output checked against float64.
"""
from __future__ import annotations

import subprocess
import time

import pandas as pd
import torch

from flashwatt.control.configuration import Configuration
from flashwatt.control.controller import Controller
from flashwatt.control.metrics import run_merit
from flashwatt.control.sensor import SensorThread
from flashwatt.control.workloads import Scenario, Workload
from flashwatt.kernels import get_kernel
from flashwatt.measure import check_rows, reference_attention, relative_error
from flashwatt.vocabulary import TOLERANCE


class FailingTelemetry:
    """Real telemetry that stops answering after `after_s`, as a hung NVML would."""

    def __init__(self, inner, after_s: float):
        self._inner, self._until = inner, time.monotonic() + after_s
        self.available, self.reason, self.devices = inner.available, inner.reason, inner.devices

    def sample(self):
        if time.monotonic() > self._until:
            raise RuntimeError("NVMLError_Unknown: injected failure (NVML stopped answering)")
        return self._inner.sample()

    def close(self):
        self._inner.close()


def check_output(ctl: Controller, inputs: dict, workload: Workload) -> dict:
    """The controller's output for each shape against float64 (batch 0, head 0, spread rows)."""
    worst = 0.0
    tol = TOLERANCE[workload.dtype]["fwd"]
    for shape, (q, k, v) in inputs.items():
        with torch.no_grad():
            out = ctl.attention(q, k, v, causal=workload.causal)
            rows = check_rows(shape[2], 512)
            ref = reference_attention(q[0, :1], k[0, :1], v[0, :1], workload.causal, rows)
            err = relative_error(out[0, :1][:, rows.to(out.device)], ref)
        worst = max(worst, err) if err == err else float("nan")
    return {"rel_err": worst, "tol": tol, "passed": bool(worst <= tol)}


def run_scenario(scenario: Scenario, telemetry, device: torch.device, idle_w: float | None = None) -> tuple[dict, pd.DataFrame]:
    workload = scenario.workload
    inputs = workload.inputs(device)
    observed: list = []
    observer = None
    if scenario.fail_telemetry_after_s is not None:
        # The controller's NVML fails; an independent reader of the same (working) NVML
        # records what the board draws meanwhile, so the fallback is judged on measured watts.
        observer = SensorThread(telemetry, observed.append).start()
        telemetry = FailingTelemetry(telemetry, scenario.fail_telemetry_after_s)
    budget = scenario.budget_w if scenario.budget_w is not None else (scenario.schedule[0][1] if scenario.schedule else None)
    ctl = Controller(scenario.mode, budget, device, telemetry=telemetry, idle_w=idle_w,
                     configuration=scenario.configuration, duty=scenario.duty, max_slowdown=scenario.max_slowdown)
    schedule = [s for s in scenario.schedule if s[0] > 0]
    load = None
    order = workload.order()
    torch.cuda.synchronize(device)
    t0 = time.monotonic()
    if scenario.colocated:
        load = scenario.colocated.start(device.index or 0, t0)
    try:
        with torch.no_grad():
            while True:
                now = time.monotonic() - t0
                if now >= scenario.seconds:
                    break
                if schedule and now >= schedule[0][0]:
                    ctl.set_budget(schedule.pop(0)[1])
                shape = next(order)
                q, k, v = inputs[shape]
                ctl.attention(q, k, v, causal=workload.causal)
        torch.cuda.synchronize(device)
        wall = time.monotonic() - t0
        check = check_output(ctl, inputs, workload)
    finally:
        if observer is not None:
            observer.stop()
        ctl.close()
        if load is not None:
            try:
                load.wait(timeout=scenario.colocated.start_s + scenario.colocated.seconds + 30)
            except subprocess.TimeoutExpired:
                load.kill()
    trace = ctl.trace()
    if len(trace):
        trace["t"] = trace["t"] - t0
    merit = run_merit(trace, tokens=ctl.tokens, wall_s=wall,
                      disturbance_at_s=scenario.colocated.start_s if scenario.colocated else None)
    merit.update(scenario=scenario.name, mode=scenario.mode, budget_w=budget, calls=ctl.calls, slept_s=ctl.slept_s,
                 check_rel_err=check["rel_err"], check_tol=check["tol"], check_passed=check["passed"],
                 idle_w=ctl.idle_w, limit_w=ctl.limit_w)
    if observed:
        seen = pd.DataFrame([{"t": r.t - t0, "observed_power_w": r.power_w, "observed_energy_mj": r.energy_mj}
                             for r in observed]).sort_values("t")
        trace = pd.merge_asof(trace.sort_values("t"), seen, on="t", direction="nearest")
        merit["fallback_observed_w"] = observed_power(seen, scenario.fail_telemetry_after_s + 1.0)
    trace["scenario"] = scenario.name
    merit["model"] = ctl.model_table().to_dict("records")
    return merit, trace


def observed_power(seen: pd.DataFrame, since_s: float) -> float | None:
    """Average power from the independent reader's energy counter from `since_s` to its end."""
    rows = seen[seen["t"] >= since_s].dropna(subset=["observed_energy_mj"])
    if len(rows) < 2 or rows["t"].iloc[-1] <= rows["t"].iloc[0]:
        return None
    joules = (rows["observed_energy_mj"].iloc[-1] - rows["observed_energy_mj"].iloc[0]) / 1e3
    return float(joules / (rows["t"].iloc[-1] - rows["t"].iloc[0]))


def oracle(workload: Workload, telemetry, device: torch.device, configs: list[str], duties: dict[str, list[float]],
           seconds: float, idle_w: float | None) -> pd.DataFrame:
    """Every static configuration at each of its duties: throughput, power, J/token; then the
    first one again (`repeat`), so the card's drift over the oracle (it warms) is measured
    rather than hidden in the comparison."""
    rows = []
    runs = [(label, duty) for label in configs for duty in duties.get(label, [1.0])]
    for i, (label, duty) in enumerate([*runs, runs[0]] if runs else []):
        scenario = Scenario(f"static {label} d{duty:g}", workload, "static", configuration=label, duty=duty,
                            seconds=seconds)
        try:
            merit, _ = run_scenario(scenario, telemetry, device, idle_w)
        except Exception as err:  # a configuration the device refuses is a row, not a crash
            rows.append({"config": label, "duty": duty, "error": f"{type(err).__name__}: {err}",
                         "repeat": i == len(runs)})
            continue
        rows.append({"config": label, "duty": duty, "tokens_per_s": merit["tokens_per_s"],
                     "avg_power_w": merit.get("avg_power_w"), "j_per_token": merit.get("j_per_token"),
                     "check_passed": merit["check_passed"], "check_rel_err": merit["check_rel_err"],
                     "repeat": i == len(runs)})
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
