"""The figures of merit that judge a run against its scenario: what the budget did, who else
was on the board, which workload ran when (flashwatt.control.metrics has the run's own).

    facts = ScenarioFacts(steps=[(1.5, 400.0)], tenants=[{"start_s": 3, "seconds": 2, "alone_w": 520}],
                          idle_w=70.0, phases=[(0.0, "steady-bf16-full")])
    merit.update(scenario_merit(trace, facts))

- Infeasible windows: where, at some moment of a window, the co-located tenants alone (each
  one's power measured alone before the run) draw more than the budget, no controller of
  ours can hold it (one that cannot see the tenant coming could not have saved the energy
  for it earlier in the window); such windows are counted apart and left out of every
  within-budget figure below.
- `windows_within_pct` over the feasible disjoint 1 s windows; `windows_over_10pct` and
  `sliding_over_10pct`: windows above budget + 10% (disjoint; sliding, one per tick).
- `step_settle_s`, one per budget step: seconds from the step until every sliding window
  starting from then until the next event (the next step, a tenant arriving or leaving,
  NVML failing, or the end) is within budget + 3%, None when that does not happen before
  it; `step_settle_p50_s`/`p95_s` over them (a step that never settled counts as
  infinite).
- `front_basis`: per workload phase, the seconds, tokens, time-averaged budget and average
  power (the energy counter's over the ticks it covered, None where that is under
  COUNTER_COVER of the phase) of the ticks with no tenant on the board and the controller's
  telemetry answering. The throughput comparison with the static Pareto front
  (flashwatt.control.summary) reads the front of each phase's workload at its time-averaged
  budget; tenants take GPU time as well as watts, and a blind controller holds a frugal
  fallback on purpose, so neither is charged to the controller (their seconds are recorded
  as `front_excluded_s`).
- `first_second_basis`, `first_window_within`: the run's first second as `front_basis` has
  it (None where a tenant or the fallback took more than a tenth of it), and whether its
  first disjoint 1 s window was within budget + 3% (None where infeasible or unread): what
  a warm start promises (flashwatt.control.warm_start).
- `after_5s_j_per_token`: joules per token from 5 s to the end (energy mode's target).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flashwatt.control.budget_schedule import BudgetSchedule
from flashwatt.control.metrics import (ENERGY_AFTER_S, OVER, TOLERANCE, budget_steps, energy_column, energy_series,
                                       recovery_time, sliding_windows, window_power)


# A phase's average power is known where the energy counter was read through this much of it.
COUNTER_COVER = 0.8
# The first second of a run (a warm start's promise), judged where at least this much of it
# had no tenant on the board and the telemetry answering.
FIRST_S = 1.0
FIRST_JUDGED = 0.9


@dataclass
class ScenarioFacts:
    steps: list[tuple[float, float]] | None = None  # (t, watts); None: the trace's own steps
    schedule: BudgetSchedule | None = None  # the budget's moments of change, where known
    tenants: list[dict] = field(default_factory=list)  # start_s, seconds, alone_w (and kind, intensity)
    idle_w: float | None = None
    phases: list[tuple[float, str | None]] = field(default_factory=lambda: [(0.0, None)])  # (from t, group)
    nvml_failures: list[tuple[float, float]] = field(default_factory=list)  # (from t, for s)


def tenant_alone_w(facts: ScenarioFacts, t: float) -> float | None:
    """What the tenants running at `t` draw alone (idle plus each one's measured watts above
    idle); None where none runs or none was measured."""
    if facts.idle_w is None:
        return None
    running = [tenant["alone_w"] for tenant in facts.tenants if tenant.get("alone_w") is not None
               and tenant["start_s"] <= t < tenant["start_s"] + tenant["seconds"]]
    return facts.idle_w + sum(w - facts.idle_w for w in running) if running else None


def _mark(windows: pd.DataFrame, trace: pd.DataFrame, facts: ScenarioFacts, window_s: float = 1.0) -> pd.DataFrame:
    """Each window with the most the tenants alone drew in it, and whether that was over the
    budget at some moment of it (infeasible: no controller that cannot see the future holds
    a window with such a moment in it)."""
    out = windows.copy()
    t, budget = trace["t"].to_numpy(dtype=float), pd.to_numeric(trace["budget_w"], errors="coerce").to_numpy(dtype=float)
    alone, infeasible = [], []
    for start in out["start"]:
        worst, over = None, False
        for moment in np.arange(start, start + window_s, 0.05):
            watts = tenant_alone_w(facts, moment)
            if watts is None:
                continue
            worst = watts if worst is None else max(worst, watts)
            if facts.schedule is not None:
                over |= bool(watts > facts.schedule.at(moment))
            else:
                i = min(len(budget) - 1, max(0, int(np.searchsorted(t, moment, side="right")) - 1))
                over |= bool(watts > budget[i])
        alone.append(worst)
        infeasible.append(over)
    out["tenant_alone_w"], out["infeasible"] = alone, infeasible
    return out


def step_settling(sliding: pd.DataFrame, steps: list[tuple[float, float]], end_t: float,
                  events: list[float] = ()) -> list[float | None]:
    """Per step: seconds until every feasible sliding window starting from then until the next
    step (or other event: a tenant arriving or leaving, NVML failing) is within budget + 3%
    (None: not before then)."""
    out = []
    for k, (t, _) in enumerate(steps):
        until = steps[k + 1][0] if k + 1 < len(steps) else end_t
        # a window that holds another event's moment is that event's, not this step's
        until = min([until, *(max(t, e - 1.0) for e in events if e > t)])
        seg = sliding[(sliding["start"] >= t - 1e-9) & (sliding["start"] < until) & ~sliding["infeasible"]]
        seg = seg.dropna(subset=["power_w"])
        if seg.empty:
            continue  # no window starts in this segment: nothing to judge
        bad = np.flatnonzero((seg["power_w"] > seg["budget_w"] * (1 + TOLERANCE)).to_numpy())
        if not len(bad):
            out.append(0.0)
        elif bad[-1] == len(seg) - 1:
            out.append(None)
        else:
            out.append(float(seg["start"].iloc[bad[-1] + 1] - t))
    return out


def percentile(values: list[float | None], q: float) -> float | None:
    """The q-th percentile, a None counting as infinite; None for no values."""
    if not values:
        return None
    result = float(np.percentile([math.inf if v is None else v for v in values], q, method="higher"))
    return None if math.isinf(result) else result


def _front_basis(trace: pd.DataFrame, facts: ScenarioFacts) -> tuple[list[dict], float]:
    t = trace["t"].to_numpy(dtype=float)
    dt = np.diff(t, prepend=t[0] - (t[1] - t[0] if len(t) > 1 else 0.1))
    start = t - dt  # each tick's row covers the work since the previous tick
    tenant_on = np.zeros(len(t), dtype=bool)
    for tenant in facts.tenants:
        tenant_on |= (start < tenant["start_s"] + tenant["seconds"]) & (t > tenant["start_s"])
    blind = (trace["phase"] == "fallback").to_numpy() if "phase" in trace else np.zeros(len(t), dtype=bool)
    judged = ~tenant_on & ~blind
    budget = pd.to_numeric(trace["budget_w"], errors="coerce").to_numpy(dtype=float)
    tokens = pd.to_numeric(trace["tokens"], errors="coerce").fillna(0).to_numpy(dtype=float)
    column = energy_column(trace)
    # each tick's joules since the tick before (NaN where either read is missing)
    joules = (np.diff(pd.to_numeric(trace[column], errors="coerce").to_numpy(dtype=float), prepend=np.nan) / 1e3
              if column is not None else np.full(len(t), np.nan))
    bounds = [p[0] for p in facts.phases[1:]] + [math.inf]
    # (the run's clock starts a moment after its first tick, which marks the start: on a GPU the
    # first tick read -0.3 ms, and the first phase's bound at 0 s left out the tick after it, the
    # run's first 0.1 s, and with it the first second's judgement)
    begins = [min(p[0], t[0]) if i == 0 else p[0] for i, p in enumerate(facts.phases)]
    basis = []
    for begin, (_, group), end in zip(begins, facts.phases, bounds):
        sel = judged & (start >= begin - 1e-9) & (start < end)
        seconds = float(dt[sel].sum())
        if seconds <= 0:
            continue
        avg = float((budget[sel] * dt[sel]).sum() / seconds) if np.isfinite(budget[sel]).all() else None
        # (over the ticks the counter covered: a run's first has no read before it)
        read = sel & np.isfinite(joules)
        power = float(joules[read].sum() / dt[read].sum()) if dt[read].sum() >= COUNTER_COVER * seconds else None
        basis.append({"group": group, "seconds": seconds, "tokens": float(tokens[sel].sum()), "avg_budget_w": avg,
                      "avg_power_w": power})
    return basis, float(dt[~judged].sum())


def _energy_after(trace: pd.DataFrame, since: float = ENERGY_AFTER_S) -> float | None:
    column = energy_column(trace)
    late = trace[trace["t"] >= since]
    if column is None or len(late) < 2:
        return None
    te, e = energy_series(late, column)
    tokens = pd.to_numeric(late["tokens"], errors="coerce").fillna(0).iloc[1:].sum()
    return float((e[-1] - e[0]) / tokens) if len(te) >= 2 and tokens > 0 else None


def scenario_merit(trace: pd.DataFrame, facts: ScenarioFacts) -> dict:
    """The figures of the module docstring; budget figures only where a budget was set."""
    out: dict = {}
    if len(trace) < 2:
        return out
    out["front_basis"], out["front_excluded_s"] = _front_basis(trace, facts)
    first = trace[trace["t"] <= trace["t"].iloc[0] + FIRST_S + 1e-9]
    first_basis, _ = _front_basis(first, facts) if len(first) >= 2 else ([], 0.0)
    judged = sum(phase["seconds"] for phase in first_basis)
    out["first_second_basis"] = first_basis if judged >= FIRST_JUDGED * FIRST_S else None
    out["after_5s_j_per_token"] = _energy_after(trace)
    out["tenants"] = facts.tenants
    if not trace["budget_w"].notna().any():
        return out
    budget_at = facts.schedule.at if facts.schedule is not None else None
    disjoint = _mark(window_power(trace, budget_at=budget_at), trace, facts).dropna(subset=["power_w", "budget_w"])
    feasible = disjoint[~disjoint["infeasible"]]
    out["windows"] = len(feasible)
    out["windows_within_pct"] = (float(100 * (feasible["power_w"] <= feasible["budget_w"] * (1 + TOLERANCE)).mean())
                                 if len(feasible) else None)
    out["worst_overshoot_pct"] = float(((feasible["power_w"] / feasible["budget_w"] - 1) * 100).max()) \
        if len(feasible) else None
    out["windows_over_10pct"] = int((feasible["power_w"] > feasible["budget_w"] * (1 + OVER)).sum())
    out["infeasible_windows"] = int(disjoint["infeasible"].sum())
    if "board_energy_mj" in trace and energy_column(trace.drop(columns="board_energy_mj")) == "energy_mj":
        # the same windows from the controller's reads of the counter at its ticks, each the energy
        # up to the counter's last update before the read (flashwatt.control.counter_meter): beside
        # the judged figure, what the judge said before it timed the counter's updates
        at_reads = _mark(window_power(trace.drop(columns="board_energy_mj"), budget_at=budget_at), trace, facts)
        at_reads = at_reads.dropna(subset=["power_w", "budget_w"])
        at_reads = at_reads[~at_reads["infeasible"]]
        out["windows_at_reads"] = len(at_reads)
        out["windows_within_pct_at_reads"] = (
            float(100 * (at_reads["power_w"] <= at_reads["budget_w"] * (1 + TOLERANCE)).mean()) if len(at_reads) else None)
    opening = disjoint[(disjoint["start"] - trace["t"].iloc[0]).abs() < 1e-6]
    out["first_window_within"] = (bool(opening["power_w"].iloc[0] <= opening["budget_w"].iloc[0] * (1 + TOLERANCE))
                                  if len(opening) and not opening["infeasible"].iloc[0] else None)
    sliding = _mark(sliding_windows(trace, budget_at=budget_at), trace, facts)
    ok = sliding.dropna(subset=["power_w"])
    ok = ok[~ok["infeasible"]]
    out["sliding_over_10pct"] = int((ok["power_w"] > ok["budget_w"] * (1 + OVER)).sum())
    out["worst_sliding_overshoot_pct"] = float(((ok["power_w"] / ok["budget_w"] - 1) * 100).max()) if len(ok) else None
    steps = facts.steps if facts.steps is not None else (
        facts.schedule.steps() if facts.schedule is not None else [(s, b) for s, b, _ in budget_steps(trace)])
    events = [x for tenant in facts.tenants for x in (tenant["start_s"], tenant["start_s"] + tenant["seconds"])]
    events += [start for start, _ in facts.nvml_failures]
    settles = step_settling(sliding, steps, float(trace["t"].iloc[-1]), events)
    out["step_settle_s"] = settles
    out["step_settle_p50_s"], out["step_settle_p95_s"] = percentile(settles, 50), percentile(settles, 95)
    out["tenant_recovery_s"] = [recovery_time(trace, tenant["start_s"]) for tenant in facts.tenants]
    return out
