"""The control cells of a suite as tables: one row per run, the oracle's static rows, and
every run's trace, with each run judged against its workload's oracle.

- Under a budget, a run is compared with the fastest static configuration (and duty) of
  the oracle whose average power stayed at or under that budget: `vs_best_static` over the
  whole run (exploration included), `steady_vs_best_static` after exploration.
- `front_tokens_per_s`: the oracle's Pareto front (throughput against power) read at the
  budget, between its two neighbouring static points: what time-sharing those two static
  configurations would give, a bar that the oracle's coarse duty grid cannot lower.
- In energy mode, with the static configuration of least joules per token and with the
  static default (`sdpa_default` at full duty: `F.scaled_dot_product_attention` with no
  backend forced, what a PyTorch user gets).
- `oracle_drift_pct`: the oracle ends by repeating its first configuration; the change of
  its power says how much the card drifted (warmed) over the oracle.
- `oracle_same_device` says whether the oracle ran on the same GPU (by UUID) as the run: on
  a cluster, cells may land on different cards, and a comparison across cards is weaker.
- `vs_front`: a budget run's (or a generated scenario's) whole-run throughput, exploration
  included, over what the static Pareto front gives at each workload phase's time-averaged
  budget for as long (flashwatt.control.scenario_merit: the ticks with no tenant on the
  board and the telemetry answering; `front_excluded_s` the rest). Below the front's lowest
  point the bar is the line to idle (time-sharing the lowest static run with idling).
- `budget_drawn` and `vs_front_at_drawn` split `vs_front` in two: the energy the run drew in
  those ticks over what the budget allowed, and its tokens over what the front gives at the
  power it drew. Where the front is steep a few per cent of the budget left undrawn cost
  several times as much throughput; a run below the front at the watts it drew spends them
  worse than time-sharing two static configurations would.
- `first_second_vs_front`: the same over the run's first second alone (where a tenant or the
  fallback left it at least 0.9 s judged), with `first_window_within` from the run's record:
  a warm start promises both (at least 0.95 of the front, within budget).
- `energy_gap_pct`: the energy mode's joules per token from 5 s on over the least-energy
  static configuration's, less one, in %.

Each run's scenario is in its row: the budget schedule (steps and ramps), the tenants with
their power alone, the NVML failure spans, the mix change, and the scenario's classes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from flashwatt.control.cell import ControlCell
from flashwatt.records import read_record

# Figures of merit copied from a run's record (flashwatt.control.metrics, study.run_scenario).
MERIT_COLUMNS = [
    "wall_s", "tokens", "tokens_per_s", "avg_power_w", "j_per_token", "windows", "windows_within_pct",
    "worst_overshoot_pct", "window_source", "settling_max_s", "disturbance_recovery_s", "fallback_observed_w", "switches", "explore_s", "steady_tokens_per_s",
    "steady_avg_power_w", "steady_windows_within_pct", "steady_j_per_token", "final_config", "calls", "slept_s",
    "check_rel_err", "check_tol", "check_passed", "idle_w", "limit_w",
    "windows_over_10pct", "sliding_over_10pct", "worst_sliding_overshoot_pct", "infeasible_windows",
    "step_settle_p50_s", "step_settle_p95_s", "front_excluded_s", "after_5s_j_per_token", "first_window_within",
    # the judge's meter of the energy counter (flashwatt.control.counter_meter), and the windows by the reads
    "windows_within_pct_at_reads", "windows_at_reads", "meter_updates", "meter_gap_ms", "meter_polls", "meter_unplaced", "meter_error",
    # a temperature limit (a hot start; flashwatt.control.thermal_merit)
    "preheat_temp_c", "temp_limit_c", "temp_windows", "temp_windows_within_pct", "temp_cooling_windows",
    "temp_cooled_s", "temp_worst_window_c",
]
# What a run's scenario was (flashwatt.control.summary._scenario_columns), and its lists as text.
SCENARIO_COLUMNS = ["schedule", "tenants", "nvml_failures", "mix_change", "scenario_classes", "tenant_spans",
                    "failure_spans", "warm_shapes", "shapes", "step_settle_s", "front_basis", "first_second_basis"]
COMPARISON_COLUMNS = [
    "best_static", "best_static_tokens_per_s", "best_static_power_w", "vs_best_static", "steady_vs_best_static",
    "front_tokens_per_s", "steady_vs_front",
    "best_static_j", "best_static_j_per_token", "vs_best_static_j", "steady_vs_best_static_j",
    "static_default_tokens_per_s", "static_default_power_w", "static_default_j_per_token", "vs_static_default_j",
    "oracle_same_device", "oracle_drift_pct", "front_tokens", "vs_front", "budget_drawn", "vs_front_at_drawn",
    "first_second_vs_front", "first_second_front_tokens", "energy_gap_pct",
]
DEVICE_COLUMNS = ["device", "device_type", "device_uuid"]


def _device(record: dict) -> dict:
    device = record.get("device") or {}
    return {"device": device.get("name"), "device_type": device.get("type"), "device_uuid": device.get("uuid")}


def _read(path: str | Path) -> tuple[ControlCell, dict]:
    record = read_record(path)
    return ControlCell.from_path(str(path)), record


def runs_table(paths: list[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, oracle): one row per controlled run, one per static row of every oracle."""
    runs, oracle_rows = [], []
    for path in paths:
        cell, record = _read(path)
        base = {**cell.as_row(), "status": record.get("status"), "reason": record.get("reason"), **_device(record),
                "duration_s": record.get("duration_s")}
        if cell.mode == "oracle":
            for row in record.get("oracle") or []:
                oracle_rows.append({**base, **{f"static_{k}" if k in ("status", "reason") else k: v
                                               for k, v in row.items()}})
            continue
        merit = record.get("merit") or {}
        row = {**base, **{k: merit.get(k) for k in MERIT_COLUMNS}, **_scenario_columns(cell, record.get("spec") or {}, merit)}
        if cell.mode == "random" and row["schedule"]:
            row["budget_w"] = record["spec"]["scenario"]["schedule"][0][1]
        row["settling_s"] = _seconds_text(merit.get("settling_s"))
        runs.append(row)
    columns = [*ControlCell("x", budgets=((0, 1),)).as_row(), "status", "reason", *DEVICE_COLUMNS, "duration_s"]
    run_frame = pd.DataFrame(runs).reindex(columns=[*columns, *MERIT_COLUMNS, "settling_s", *SCENARIO_COLUMNS])
    oracle_frame = pd.DataFrame(oracle_rows)
    if oracle_frame.empty:
        oracle_frame = pd.DataFrame(columns=[*columns, "config", "duty", "tokens_per_s", "avg_power_w",
                                             "j_per_token", "check_passed"])
    return compare_with_oracle(run_frame, oracle_frame), oracle_frame


def _seconds_text(values) -> str | None:
    return " ".join("never" if v is None else f"{v:.2f}" for v in values) if values else None


def _scenario_columns(cell: ControlCell, spec: dict, merit: dict) -> dict:
    """A run's scenario as text columns (and its spans as JSON for the figures)."""
    from flashwatt.control.budget_schedule import BudgetSchedule
    from flashwatt.control.scenario_generator import classes, describe_tenants

    generated = spec.get("scenario") if cell.mode == "random" else None
    if generated is not None:
        schedule, failures, change = generated["schedule"], generated.get("nvml_failures", []), generated.get("mix_change")
        tenants = merit.get("tenants") or generated.get("tenants", [])
        scenario_classes = ",".join(classes(generated))
    else:
        schedule = [[t, w] for t, w in cell.budgets]
        failures = [[cell.disturbance_at_s, None]] if cell.disturbance == "nvml_failure" else []
        change = None
        tenants = merit.get("tenants") or []
        scenario_classes = cell.disturbance or ("steps" if len(cell.budgets) > 1 else "")
    alone = [t.get("alone_w") for t in tenants]
    text = describe_tenants(tenants)
    if any(w is not None for w in alone):
        text += " (alone: " + ", ".join("?" if w is None else f"{w:.0f} W" for w in alone) + ")"
    return {
        "schedule": BudgetSchedule.parse(schedule).describe() if schedule else None,
        "tenants": text or None,
        "nvml_failures": "; ".join(f"{s:g}s-" + ("end" if d is None else f"{s + d:g}s") for s, d in failures) or None,
        "mix_change": f"{change['to']} from {change['at_s']:g}s" if change else None,
        "scenario_classes": scenario_classes or None,
        "tenant_spans": json.dumps([[t["start_s"], t["start_s"] + t["seconds"], t.get("alone_w")] for t in tenants]),
        "failure_spans": json.dumps([[s, None if d is None else s + d] for s, d in failures]),
        "warm_shapes": (merit.get("warm_start") or {}).get("warm_shapes"),
        "shapes": (merit.get("warm_start") or {}).get("shapes"),  # the shapes it met (warm or not)
        "step_settle_s": _seconds_text(merit.get("step_settle_s")),
        "front_basis": json.dumps(merit.get("front_basis")) if merit.get("front_basis") is not None else None,
        "first_second_basis": (json.dumps(merit["first_second_basis"]) if merit.get("first_second_basis") is not None
                               else None),
    }


def usable_static(oracle: pd.DataFrame) -> pd.DataFrame:
    """Static rows that measured a throughput and power and passed their float64 check."""
    rows = oracle.dropna(subset=["tokens_per_s", "avg_power_w"])
    if "repeat" in rows:  # the oracle's closing repeat measures drift; it is not another configuration
        rows = rows[~rows["repeat"].fillna(False).astype(bool)]
    return rows[rows["check_passed"].fillna(False).astype(bool)]


def best_static_under(oracle: pd.DataFrame, budget_w: float) -> pd.Series | None:
    """The fastest static row whose average power stayed at or under the budget."""
    rows = usable_static(oracle)
    rows = rows[rows["avg_power_w"] <= budget_w]
    return None if rows.empty else rows.loc[rows["tokens_per_s"].idxmax()]


def least_energy_static(oracle: pd.DataFrame, budget_w: float | None = None) -> pd.Series | None:
    """The static row of least joules per token (at or under `budget_w` where given)."""
    rows = usable_static(oracle).dropna(subset=["j_per_token"])
    if budget_w is not None:
        rows = rows[rows["avg_power_w"] <= budget_w]
    return None if rows.empty else rows.loc[rows["j_per_token"].idxmin()]


def front_at(oracle: pd.DataFrame, power_w: float, idle_w: float | None = None) -> float | None:
    """Throughput of the static Pareto front at `power_w`, linear between the front's points
    (time-sharing two static runs); past its highest point, the highest. Below its lowest
    point: None, or, given the idle power, the line from (idle, nothing) to that point
    (time-sharing the lowest static run with idling)."""
    front = pareto_front(usable_static(oracle))
    if front.empty:
        return None
    powers, tokens = list(front["avg_power_w"]), list(front["tokens_per_s"])
    if power_w < powers[0]:
        if idle_w is None or not idle_w < powers[0]:
            return None
        powers, tokens = [idle_w, *powers], [0.0, *tokens]
    return float(np.interp(power_w, powers, tokens))


def vs_front(basis: list[dict] | None, oracle: pd.DataFrame, idle_w: float | None,
             at: str = "avg_budget_w") -> tuple[float | None, float | None]:
    """A run's tokens over what the static front gives at each workload phase's time-averaged
    budget for as long (flashwatt.control.scenario_merit.front_basis): (ratio, front tokens).
    `at="avg_power_w"`: at the power each phase drew instead. None where a phase's workload
    has no oracle or that budget or power is not known."""
    if not basis:
        return None, None
    tokens = bar = 0.0
    for phase in basis:
        rows = oracle[oracle["group"] == phase["group"]] if "group" in oracle else oracle
        front = front_at(rows, phase[at], idle_w) if phase.get(at) is not None else None
        if front is None:
            return None, None
        tokens += phase["tokens"]
        bar += front * phase["seconds"]
    return (tokens / bar if bar > 0 else None), bar


def front_split(basis: list[dict] | None, oracle: pd.DataFrame,
                idle_w: float | None) -> tuple[float | None, float | None]:
    """`vs_front` in two (module docstring): (energy drawn over the budget's, tokens over what
    the front gives at the power drawn), over the same phases. None where a phase's power,
    budget or front is not known."""
    at_drawn, _ = vs_front(basis, oracle, idle_w, at="avg_power_w")
    if at_drawn is None or any(phase.get("avg_budget_w") is None for phase in basis):
        return None, None
    drawn = sum(phase["avg_power_w"] * phase["seconds"] for phase in basis)
    allowed = sum(phase["avg_budget_w"] * phase["seconds"] for phase in basis)
    return (drawn / allowed if allowed > 0 else None), at_drawn


def pareto_front(rows: pd.DataFrame) -> pd.DataFrame:
    """Static rows no other row beats on both power (lower) and throughput (higher), by power."""
    ordered = rows.sort_values(["avg_power_w", "tokens_per_s"], ascending=[True, False])
    best, keep = -np.inf, []
    for i, row in ordered.iterrows():
        if row["tokens_per_s"] > best:
            best = row["tokens_per_s"]
            keep.append(i)
    return ordered.loc[keep]


def oracle_drift_pct(oracle: pd.DataFrame) -> float | None:
    """How much the power of the oracle's first configuration changed by its closing repeat
    (in %): the card warms over the oracle, and rows measured early read a little low."""
    if "repeat" not in oracle or not oracle["repeat"].fillna(False).astype(bool).any():
        return None
    rows = oracle.dropna(subset=["avg_power_w"])
    repeat = rows[rows["repeat"].fillna(False).astype(bool)]
    if repeat.empty:
        return None
    again = repeat.iloc[0]
    first = rows[(rows["config"] == again["config"]) & (rows["duty"] == again["duty"])
                 & ~rows["repeat"].fillna(False).astype(bool)]
    if first.empty:
        return None
    return float((again["avg_power_w"] / first["avg_power_w"].iloc[0] - 1) * 100)


def static_default(oracle: pd.DataFrame) -> pd.Series | None:
    rows = usable_static(oracle)
    rows = rows[(rows["config"] == "sdpa_default") & (rows["duty"] == 1.0)]
    return None if rows.empty else rows.iloc[0]


def _label(row: pd.Series) -> str:
    return f"{row['config']} d{row['duty']:g}"


def _ratio(a, b):
    return a / b if a is not None and b and pd.notna(a) else None


def compare_with_oracle(runs: pd.DataFrame, oracle: pd.DataFrame) -> pd.DataFrame:
    out = runs.copy()
    for column in COMPARISON_COLUMNS:
        out[column] = None
    for i, run in out.iterrows():
        suite_rows = oracle[oracle["suite"] == run["suite"]]
        rows = suite_rows[suite_rows["group"] == run["group"]]
        if rows.empty or run["status"] != "ok":
            continue
        values: dict = {"oracle_same_device": bool(run["device_uuid"] is not None
                                                   and (rows["device_uuid"] == run["device_uuid"]).all())}
        values["oracle_drift_pct"] = oracle_drift_pct(rows)
        default = static_default(rows)
        if default is not None:
            values.update(static_default_tokens_per_s=default["tokens_per_s"],
                          static_default_power_w=default["avg_power_w"],
                          static_default_j_per_token=default["j_per_token"],
                          vs_static_default_j=_ratio(run["j_per_token"], default["j_per_token"]))
        if run["mode"] == "budget" and pd.notna(run["budget_w"]):  # a generated scenario's budget moves: front only
            best = best_static_under(rows, float(run["budget_w"]))
            if best is not None:
                values.update(best_static=_label(best), best_static_tokens_per_s=best["tokens_per_s"],
                              best_static_power_w=best["avg_power_w"],
                              vs_best_static=_ratio(run["tokens_per_s"], best["tokens_per_s"]),
                              steady_vs_best_static=_ratio(run["steady_tokens_per_s"], best["tokens_per_s"]))
            front = front_at(rows, float(run["budget_w"]))
            if front is not None:
                values.update(front_tokens_per_s=front, steady_vs_front=_ratio(run["steady_tokens_per_s"], front))
        if run["mode"] in ("budget", "random") and isinstance(run["front_basis"], str):
            idle = float(run["idle_w"]) if pd.notna(run["idle_w"]) else None
            basis = json.loads(run["front_basis"])
            ratio, bar = vs_front(basis, suite_rows, idle)
            drawn, at_drawn = front_split(basis, suite_rows, idle)
            values.update(vs_front=ratio, front_tokens=bar, budget_drawn=drawn, vs_front_at_drawn=at_drawn)
            if isinstance(run["first_second_basis"], str):
                ratio, bar = vs_front(json.loads(run["first_second_basis"]), suite_rows, idle)
                values.update(first_second_vs_front=ratio, first_second_front_tokens=bar)
        frugal = least_energy_static(rows, float(run["budget_w"]) if pd.notna(run["budget_w"]) and run["mode"] == "budget"
                                     else None)
        if frugal is not None:
            values.update(best_static_j=_label(frugal), best_static_j_per_token=frugal["j_per_token"],
                          vs_best_static_j=_ratio(run["j_per_token"], frugal["j_per_token"]),
                          steady_vs_best_static_j=_ratio(run["steady_j_per_token"], frugal["j_per_token"]))
            if run["mode"] == "energy" and pd.notna(run["after_5s_j_per_token"]):
                values["energy_gap_pct"] = (run["after_5s_j_per_token"] / frugal["j_per_token"] - 1) * 100
        for column, value in values.items():
            out.at[i, column] = value
    return out


def traces_table(paths: list[str | Path]) -> pd.DataFrame:
    """Every run's trace (the `.trace.parquet` beside each record), one frame."""
    frames = []
    for path in paths:
        trace_path = str(path)[: -len(".json")] + ".trace.parquet"
        if Path(trace_path).exists():
            frame = pd.read_parquet(trace_path)
            if len(frame) and "t" in frame:
                frames.append(frame.assign(cell_id=ControlCell.from_path(str(path)).id))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"cell_id": pd.Series([], dtype=str)})


def write_tables(records: list[str], out: dict[str, str]) -> str:
    """The suite's control runs, their oracle, their power traces and the pooled figures
    (flashwatt.control.pooled); the status counts."""
    from flashwatt.control.pooled import pooled_table
    from flashwatt.records import atomic_write

    runs, oracle = runs_table(records)
    traces = traces_table(records)
    pooled = pooled_table(runs)
    atomic_write(out["pooled"], lambda tmp: pooled.to_parquet(tmp, index=False))
    atomic_write(out["pooled_csv"], lambda tmp: pooled.to_csv(tmp, index=False, float_format="%.6g"))
    atomic_write(out["runs"], lambda tmp: runs.to_parquet(tmp, index=False))
    atomic_write(out["oracle"], lambda tmp: oracle.to_parquet(tmp, index=False))
    atomic_write(out["traces"], lambda tmp: traces.to_parquet(tmp, index=False))
    atomic_write(out["csv"], lambda tmp: runs.to_csv(tmp, index=False, float_format="%.6g"))
    atomic_write(out["oracle_csv"], lambda tmp: oracle.to_csv(tmp, index=False, float_format="%.6g"))
    return runs["status"].value_counts().to_string() if len(runs) else "no controlled runs"
