"""Steps under the controller for a while, measured: a governed run, and the static front it
is judged against (the cells of flashwatt.models and their GPU test use both).

- `governed_run`: steps under a Controller for `seconds`, the budget following its
  schedule; the run's figures of merit (flashwatt.control.metrics: 1 s windows against the
  budget from the energy counter, settling, throughput and joules per token, whole run and
  after exploration; flashwatt.control.thermal_merit where a temperature limit was held)
  and its trace.
- `front_rows`: one static run per (configuration, duty), the static front's points.
- `judge`: a governed run against the front measured on the same GPU: the fastest static
  point within the budget (`vs_best_static`), the front read at the budget between its
  neighbouring points (`vs_front`), and in energy mode the static default's and the
  least-energy point's joules per token.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pandas as pd

from flashwatt.control.counter_meter import CounterMeter, judged_by_meter, meter_merit
from flashwatt.control.metrics import run_merit
from flashwatt.control.thermal_merit import temperature_merit


def governed_run(ctl, step: Callable, tokens: int, seconds: float, schedule=None, sync: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, name: str | None = None,
                 agree: Callable[[bool], bool] | None = None,
                 read_counter: Callable[[], float | None] | None = None) -> tuple[dict, pd.DataFrame]:
    """`step` (fn or fn(plan)) under `ctl` for `seconds`; (merit, trace), the trace's clock
    from the run's start. `agree(go_on)`: on several ranks, every rank's answer to "another
    step?" made one (rank 0's), so all run as many steps (a step holds collectives).
    `read_counter`: the board's energy counter (mJ), read by a meter of its own that times each
    update (flashwatt.control.counter_meter), by which the windows are then judged; the run's
    clock must then be the meter's (time.monotonic). The caller closes the controller."""
    if read_counter is not None and clock is not time.monotonic:
        raise ValueError("a metered run keeps the meter's clock (time.monotonic)")
    meter = CounterMeter(read_counter).start() if read_counter is not None else None
    timeline = schedule.timeline() if schedule is not None else []
    t0 = clock()
    steps = 0
    try:
        while (agree or (lambda go_on: go_on))(clock() - t0 < seconds):
            now = clock() - t0
            while timeline and now >= timeline[0][0]:
                ctl.set_budget(timeline.pop(0)[1])
            ctl.step(step, tokens=tokens, name=name)
            steps += 1
        sync()
    except BaseException:
        if meter is not None:
            meter.stop()
        raise
    wall = clock() - t0
    if meter is not None:
        meter.stop(after=clock())  # (on until an update after the last tick: the last window is judged too)
    trace = ctl.trace()
    if len(trace):
        trace["t"] = trace["t"] - t0
        trace = trace[trace["t"] >= 0].reset_index(drop=True)
    trace = judged_by_meter(trace, meter, t0)
    merit = run_merit(trace, tokens=steps * tokens, wall_s=wall)
    if meter is not None:
        merit.update(meter_merit(meter))
    merit.update(temperature_merit(trace))
    merit.update(steps=steps, slept_s=ctl.slept_s, choices=ctl.choices(), refusals=ctl.refusals(),
                 calls=ctl.call_counts(), idle_w=ctl.idle_w, limit_w=ctl.limit_w,
                 schedule=schedule.as_lists() if schedule is not None else None)
    fault = ctl.fault()
    if fault is not None:
        merit["fault"] = fault
    return merit, trace


def front_rows(run_static: Callable[[str, float], tuple[dict, Any]], labels: list[str],
               duties: list[float], ranks: int = 1) -> tuple[list[dict], list[pd.DataFrame]]:
    """Every (configuration, duty) as a static run: (rows, their traces). A configuration
    the model refuses (a batch that does not split, a backend that cannot run it) is a row
    with its reason, not a crash. A job's fault (PeerLost: another rank stopped answering)
    is no configuration's and ends the front. On several ranks (`ranks` > 1) every error
    ends it: a rank that skipped to the next point while its peers still ran steps of this
    one would leave them waiting at the step's collectives until the NCCL watchdog ends the
    job, and the record would name the wrong cause."""
    from flashwatt.control.model_steps import PeerLost

    rows, traces = [], []
    for label in labels:
        for duty in duties:
            try:
                merit, trace = run_static(label, duty)
            except PeerLost:
                raise
            except Exception as err:  # noqa: BLE001 - the front records what could not run
                if ranks > 1:
                    raise
                rows.append({"config": label, "duty": duty, "error": f"{type(err).__name__}: {err}"})
                continue
            refused = merit.get("refusals") or {}
            if refused or not merit.get("steps"):
                rows.append({"config": label, "duty": duty, "error": "; ".join(refused.values()) or "no step ran"})
                continue
            rows.append({"config": label, "duty": duty, "tokens_per_s": merit["tokens_per_s"],
                         "avg_power_w": merit.get("avg_power_w"), "j_per_token": merit.get("j_per_token"),
                         "steps": merit["steps"], "idle_share": _idle_share(merit), "check_passed": True})
            traces.append(trace.assign(point=f"{label} d{duty:g}"))
    return rows, traces


def _idle_share(merit: dict) -> float | None:
    """The share of a static point's wall time its pacer idled: what its duty made of it,
    whatever the step took (the point's throughput also moves with the host's load)."""
    wall = merit.get("wall_s")
    return merit["slept_s"] / wall if wall and merit.get("slept_s") is not None else None


def judge(merit: dict, front: list[dict], mode: str, budget_w: float | None, idle_w: float | None) -> dict:
    """A governed run against the static front of the same step on the same GPU."""
    from flashwatt.control.summary import best_static_under, front_at, least_energy_static, static_default

    rows = pd.DataFrame([r for r in front if r.get("tokens_per_s") is not None])
    if rows.empty:
        return {"front_reason": "no static point of the front ran"}
    if not merit.get("tokens_per_s"):
        return {"front_reason": "the governed run measured no throughput"}
    out: dict = {}
    steady = merit.get("steady_tokens_per_s") or merit.get("tokens_per_s")
    if mode == "budget" and budget_w is not None:
        best = best_static_under(rows, budget_w)
        if best is not None:
            out.update(best_static=f"{best['config']} d{best['duty']:g}", best_static_tokens_per_s=best["tokens_per_s"],
                       vs_best_static=merit["tokens_per_s"] / best["tokens_per_s"],
                       steady_vs_best_static=steady / best["tokens_per_s"] if steady else None)
        line = front_at(rows, budget_w, idle_w)
        if line:
            out.update(front_tokens_per_s=line, vs_front=merit["tokens_per_s"] / line,
                       steady_vs_front=steady / line if steady else None)
    default = static_default(rows)
    if default is not None and merit.get("j_per_token"):
        out.update(static_default_j_per_token=default["j_per_token"],
                   vs_static_default_j=merit["j_per_token"] / default["j_per_token"],
                   steady_vs_static_default_j=(merit.get("steady_j_per_token") or merit["j_per_token"])
                   / default["j_per_token"])
    frugal = least_energy_static(rows, budget_w if mode == "budget" else None)
    if frugal is not None and merit.get("j_per_token"):
        out.update(best_static_j=f"{frugal['config']} d{frugal['duty']:g}", best_static_j_per_token=frugal["j_per_token"],
                   vs_best_static_j=merit["j_per_token"] / frugal["j_per_token"])
    return out
