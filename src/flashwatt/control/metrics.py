"""Figures of merit of a controlled run, from its trace (one row per tick).

- Window power: the average power of each 1 s window, from NVML's energy counter where the
  trace has it (the honest figure: the counter integrates every millisecond, where the
  instant readings observe a fraction of the time), else from the instant readings.
- Share of windows within budget + 3%, judged against the budget over the window (the time
  average of the budget in force: a window cut by a budget step is allowed each part's
  energy), and the worst overshoot.
- Settling time after each budget step: from the step until the 0.5 s moving average of
  power enters the band [settle_low x budget, budget + 3%] and stays there for the rest of
  that budget's segment (at least 1 s of it). A budget above what the workload can draw
  settles when power reaches the most the run drew at full duty.
- Throughput and joules per token over the run.

For scenarios (flashwatt.control.scenario_generator) it adds, per run:
- the sliding 1 s windows (one starting at each tick) and, after each budget step, how long
  until every sliding window starting from then to the next step is within budget + 3%
  (`step_settle_s`; None: not before the next step or the end);
- windows where a co-located tenant alone (its power measured alone before the run) draws
  more than the budget: infeasible, left out of every within-budget figure and counted
  apart (`infeasible_windows`, with the tenants' watts);
- windows above budget + 10% (disjoint and sliding);
- the basis of the throughput comparison with the static Pareto front
  (flashwatt.control.summary): per workload phase, the seconds, tokens and time-averaged
  budget of the ticks with no tenant on the board and the telemetry answering;
- joules per token from 5 s on (the energy mode's target).
Where the trace has `board_energy_mj` (the study's own reader of the energy counter, which
times each of the counter's updates: flashwatt.control.counter_meter; it reads on while the
controller's readings fail), windows are judged by it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from flashwatt.control.budget_schedule import STEP_MIN_W
from flashwatt.control.work_stall import STALL_EVENT

TOLERANCE = 0.03  # budget + 3%
OVER = 0.10  # budget + 10%: never, except where a tenant alone is over budget
SETTLE_LOW = 0.90
ENERGY_AFTER_S = 5.0  # the energy mode is judged from here on


def energy_column(trace: pd.DataFrame) -> str | None:
    """The energy counter the windows are judged by: the board's (read independently) where
    the trace has it, else the controller's own readings; None without two readings."""
    for column in ("board_energy_mj", "energy_mj"):
        values = trace.get(column)
        if values is not None and pd.to_numeric(values, errors="coerce").notna().sum() >= 2:
            return column
    return None


def energy_series(trace: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    values = pd.to_numeric(trace[column], errors="coerce")
    ok = values.notna().to_numpy()
    return trace["t"].to_numpy(dtype=float)[ok], values.to_numpy(dtype=float)[ok] / 1e3


def window_power(trace: pd.DataFrame, window_s: float = 1.0, budget_at=None) -> pd.DataFrame:
    """Average power per consecutive window of `window_s`, with the budget at its start."""
    t = trace["t"].to_numpy(dtype=float)
    if len(t) < 2:
        return pd.DataFrame(columns=["start", "power_w", "budget_w", "source"])
    starts = np.arange(t[0], t[-1] - window_s + 1e-9, window_s)
    column = energy_column(trace)
    use_counter = column is not None
    rows = []
    if use_counter:
        te, e = energy_series(trace, column)
        for s in starts:
            if s < te[0] or s + window_s > te[-1]:  # the counter was not read across it (NVML down)
                rows.append((s, np.nan))
                continue
            e0, e1 = np.interp([s, s + window_s], te, e)
            rows.append((s, (e1 - e0) / window_s))
    else:
        p = trace["power_w"].to_numpy(dtype=float)
        for s in starts:
            sel = (t >= s) & (t < s + window_s) & np.isfinite(p)
            rows.append((s, float(np.mean(p[sel])) if sel.any() else np.nan))
    out = pd.DataFrame(rows, columns=["start", "power_w"])
    out["budget_w"] = [window_budget(trace, s, window_s, budget_at) for s in out["start"]]
    out["source"] = "energy counter" if use_counter else "instant power"
    return out


def window_budget(trace: pd.DataFrame, start: float, window_s: float = 1.0, budget_at=None) -> float:
    """The budget over a window: the time average of the budget in force, so a window that
    a budget step cuts is allowed the energy of each part. From `budget_at(t)` where the
    run's schedule is known (flashwatt.control.budget_schedule.BudgetSchedule.at: the
    moment of each change), else from the trace (each tick's budget holds until the next
    tick: a change between two ticks counts from the later one)."""
    if budget_at is not None:
        grid = np.linspace(start, start + window_s, 201)[:-1] + window_s / 400
        return float(np.mean([budget_at(x) for x in grid]))
    t = trace["t"].to_numpy(dtype=float)
    b = trace["budget_w"].to_numpy(dtype=float)
    grid = np.linspace(start, start + window_s, 201)[:-1] + window_s / 400  # midpoints of 200 slices
    return float(np.mean(b[np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(b) - 1)]))


def recovery_time(trace: pd.DataFrame, start_t: float, window_s: float = 1.0) -> float | None:
    """Seconds from `start_t` (a disturbance) until the budget holds again as it is judged:
    the first tick from which every sliding window of `window_s` (one per tick, average power
    from the energy counter where the trace has it) is within budget + 3% to the end of the
    run. None if that never happens."""
    windows = sliding_windows(trace, window_s)
    after = windows[windows["start"] >= start_t]
    if after.empty:
        return None
    inside = (after["power_w"] <= after["budget_w"] * (1 + TOLERANCE)).to_numpy()
    for j in range(len(inside)):
        if inside[j:].all():
            return float(after["start"].iloc[j] - start_t)
    return None


def sliding_windows(trace: pd.DataFrame, window_s: float = 1.0, budget_at=None) -> pd.DataFrame:
    """One window starting at each tick that has `window_s` of trace after it: its average
    power (energy counter where the trace has it, else the instant readings) and budget."""
    t = trace["t"].to_numpy(dtype=float)
    starts = t[t + window_s <= t[-1] + 1e-9] if len(t) else t
    column = energy_column(trace)
    if column is not None:
        te, e = energy_series(trace, column)
        covered = (starts >= te[0]) & (starts + window_s <= te[-1] + 1e-9)
        watts = (np.interp(starts + window_s, te, e) - np.interp(starts, te, e)) / window_s
        watts = np.where(covered, watts, np.nan)
    else:
        power = pd.to_numeric(trace["power_w"], errors="coerce").to_numpy(dtype=float)
        watts = np.array([np.nanmean(power[(t >= s) & (t < s + window_s)]) if np.isfinite(
            power[(t >= s) & (t < s + window_s)]).any() else np.nan for s in starts])
    budgets = ([window_budget(trace, s, window_s, budget_at) for s in starts]
               if trace["budget_w"].notna().any() else np.nan)
    return pd.DataFrame({"start": starts, "power_w": watts, "budget_w": budgets})


def budget_steps(trace: pd.DataFrame) -> list[tuple[float, float, float]]:
    """(time, new budget, end of its segment) for each step of the budget after the first
    tick (a change of STEP_MIN_W or more; the small changes of a ramp are not steps)."""
    t = trace["t"].to_numpy(dtype=float)
    b = trace["budget_w"].to_numpy(dtype=float)
    changes = [i for i in range(1, len(b)) if abs(b[i] - b[i - 1]) >= STEP_MIN_W]
    steps = []
    for j, i in enumerate(changes):
        end = t[changes[j + 1]] if j + 1 < len(changes) else t[-1]
        steps.append((float(t[i]), float(b[i]), float(end)))
    return steps


def settling_time(trace: pd.DataFrame, step_t: float, budget: float, end_t: float,
                  reachable_w: float | None = None) -> float | None:
    """Seconds from a budget step until smoothed power stays in the band; None if never."""
    seg = trace[(trace["t"] >= step_t) & (trace["t"] <= end_t)]
    if len(seg) < 3:
        return None
    power = seg.set_index(pd.to_timedelta(seg["t"] - seg["t"].iloc[0], unit="s"))["power_w"]
    smooth = power.rolling("500ms").mean().to_numpy()
    low = SETTLE_LOW * budget
    if reachable_w is not None:
        low = min(low, SETTLE_LOW * reachable_w)
    inside = (smooth >= low) & (smooth <= budget * (1 + TOLERANCE))
    ts = seg["t"].to_numpy()
    for i in range(len(inside)):
        if inside[i:].all() and ts[-1] - ts[i] >= min(1.0, (ts[-1] - ts[0]) / 2):
            return float(ts[i] - step_t)
    return None


def summarize(trace: pd.DataFrame, calls: int | None = None, tokens: int | None = None,
              wall_s: float | None = None, reachable_w: float | None = None) -> dict:
    """The run's figures of merit (budget figures only where a budget was set)."""
    out: dict = {}
    t = trace["t"].to_numpy(dtype=float)
    wall = wall_s if wall_s is not None else float(t[-1] - t[0]) if len(t) > 1 else None
    tok = tokens if tokens is not None else int(trace["tokens"].sum())
    out["wall_s"] = wall
    out["tokens"] = tok
    out["tokens_per_s"] = tok / wall if wall else None
    column = energy_column(trace)
    if column is not None:
        te, e = energy_series(trace, column)
        joules, span = float(e[-1] - e[0]), float(te[-1] - te[0])
        out["avg_power_w"] = joules / span if span > 0 else None
        out["j_per_token"] = (out["avg_power_w"] / out["tokens_per_s"]) if out["tokens_per_s"] and out["avg_power_w"] else None
    else:
        out["avg_power_w"] = float(trace["power_w"].mean()) if trace["power_w"].notna().any() else None
        out["j_per_token"] = None
    if trace["budget_w"].notna().any():
        windows = window_power(trace)
        judged = windows.dropna(subset=["power_w", "budget_w"])
        within = judged["power_w"] <= judged["budget_w"] * (1 + TOLERANCE)
        out["windows"] = len(judged)
        out["windows_within_pct"] = float(100 * within.mean()) if len(judged) else None
        over = (judged["power_w"] / judged["budget_w"] - 1) * 100
        out["worst_overshoot_pct"] = float(over.max()) if len(judged) else None
        out["window_source"] = windows["source"].iloc[0] if len(windows) else None
        settles = [settling_time(trace, s, b, e, reachable_w) for s, b, e in budget_steps(trace)]
        out["settling_s"] = settles
        out["settling_max_s"] = (max(s for s in settles if s is not None)
                                 if settles and all(s is not None for s in settles) else None)
    out["switches"] = int((trace["config"].fillna("") != trace["config"].shift().fillna("")).iloc[1:].sum()) if len(trace) > 1 else 0
    # stalls of the run's own work, which the controller did not learn from (flashwatt.control.work_stall)
    out["stalls"] = int(trace["event"].fillna("").str.contains(STALL_EVENT).sum()) if "event" in trace else 0
    return out


def run_merit(trace: pd.DataFrame, tokens: int | None = None, wall_s: float | None = None,
              disturbance_at_s: float | None = None) -> dict:
    """A run's figures of merit (`summarize`), its last configuration, and the same figures
    after exploration ended (`steady_*`: what the controller does once it has learned), when
    at least ten ticks follow it."""
    if len(trace) < 2:
        return {"tokens_per_s": tokens / wall_s if tokens is not None and wall_s else None, "final_config": None}
    merit = summarize(trace, tokens=tokens, wall_s=wall_s)
    configs = trace["config"].dropna()
    merit["final_config"] = configs.iloc[-1] if len(configs) else None
    if disturbance_at_s is not None and trace["budget_w"].notna().any():
        merit["disturbance_recovery_s"] = recovery_time(trace, disturbance_at_s)
    explore_end = trace.loc[trace["phase"] == "explore", "t"].max() if "phase" in trace else None
    if "phase" in trace and explore_end != explore_end:
        explore_end = 0.0  # a warm start, or a static run: no exploration at all
    if explore_end is not None:
        merit["explore_s"] = float(explore_end)  # the trace's clock starts with the run
        after = trace[trace["t"] > explore_end]
        if len(after) >= 10:
            steady = summarize(after.reset_index(drop=True))
            merit["steady_tokens_per_s"] = steady["tokens_per_s"]
            merit["steady_avg_power_w"] = steady["avg_power_w"]
            merit["steady_windows_within_pct"] = steady.get("windows_within_pct")
            merit["steady_j_per_token"] = steady.get("j_per_token")
    return merit
