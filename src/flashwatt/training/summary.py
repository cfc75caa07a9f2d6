"""The training cells of a suite as tables:

- runs (`training.csv`): a row per run: status, the step-0 check, initial and final
  validation loss, perplexity, tokens per second, peak memory, energy and joules per
  token, the tokens, seconds and joules to the suite's target loss, resumes, divergence;
  and whether its initial validation loss agrees with the other backends' on the same
  seed (the same weights and windows: only the kernels' rounding may differ);
- settings (`training_settings.csv`): a row per setting (a run without its seed) with the
  spread over seeds (mean, standard deviation, min, max) of time, energy and tokens to
  target, final loss and tokens per second;
- curves (`training_curves.parquet`): every evaluation of every run, for the figures.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from flashwatt.records import read_record
from flashwatt.training.cell import TrainCell

# |initial validation loss - the group's median| allowed between backends, in nats: the
# windows and weights are identical, so only the arithmetic's rounding may differ.
STEP0_TOLERANCE = {"fp32": 1e-4, "tf32": 2e-3, "bf16": 2e-2, "fp16": 1e-2}
_SAME_START = ["suite", "model", "precision", "batch", "context", "dropout", "seed"]
RUN_COLUMNS = [
    "status", "reason", "device", "device_type", "parameters", "vocab_size", "check_passed", "check_loss_error",
    "initial_val_loss", "initial_loss_agrees", "final_val_loss", "perplexity", "best_val_loss", "tokens_trained",
    "tokens_per_s", "steady_tokens_per_s", "train_s", "eval_s", "checkpoint_s", "wall_s", "eval_share", "energy_j", "j_per_token",
    "mean_power_w", "peak_power_w", "peak_allocated_bytes", "target_loss", "target_reached", "tokens_to_target",
    "wall_s_to_target", "energy_j_to_target", "diverged_step", "resumes", "lost_steps", "oom_stage", "duration_s",
    # a run under the step-level controller (flashwatt.training.governed): its budget, judged by 1 s windows
    "control_budget_w", "control_schedule", "control_temp_limit_c", "control_windows", "control_windows_within_pct",
    "control_worst_overshoot_pct", "control_avg_power_w", "control_temp_windows_within_pct", "control_slept_s",
    "control_configurations", "control_fault",
]
# A run without its seed (the setting column is these, written as a path).
SETTING_KEYS = ["suite", "model", "backend", "precision", "optimizer", "schedule", "lr", "dropout", "weight_decay",
                "batch", "context", "token_budget", "governor"]
CURVE_COLUMNS = ["status", "reason", "device", "device_type", "target_loss", "step", "tokens", "val_loss", "train_loss", "current_lr", "train_s", "eval_s", "checkpoint_s", "wall_s",
                 "energy_j"]
SPREAD_OF = ["wall_s_to_target", "energy_j_to_target", "tokens_to_target", "final_val_loss", "tokens_per_s",
             "steady_tokens_per_s",
             "j_per_token"]


def _control(record: dict) -> dict:
    """A governed run's columns (empty for a run without a controller)."""
    control = record.get("control") or {}
    if not control:
        return {}
    merit = control.get("merit") or {}
    schedule = control.get("schedule") or []
    calls = control.get("calls") or {}
    total = sum(calls.values())
    fault = control.get("fault")
    return {"control_budget_w": schedule[0][1] if schedule else None,
            "control_schedule": " ".join(f"{w:g}W@{t:g}s" for t, w in schedule) or None,
            "control_temp_limit_c": control.get("temp_limit_c"), "control_windows": merit.get("windows"),
            "control_windows_within_pct": merit.get("windows_within_pct"),
            "control_worst_overshoot_pct": merit.get("worst_overshoot_pct"),
            "control_avg_power_w": merit.get("avg_power_w"),
            "control_temp_windows_within_pct": merit.get("temp_windows_within_pct"),
            "control_slept_s": control.get("slept_s"),
            "control_configurations": ", ".join(f"{label} {n / total:.0%}" for label, n in
                                                sorted(calls.items(), key=lambda kv: -kv[1])) if total else None,
            "control_fault": f"{fault['kind']}: {fault['action']}" if fault else None}


def _row(cell: TrainCell, record: dict) -> dict:
    check = record.get("check") or {}
    final = record.get("final") or {}
    timing = record.get("timing") or {}
    energy = record.get("energy") or {}
    target = record.get("target") or {}
    model = record.get("model") or {}
    curve = record.get("curve") or []
    resumes = record.get("resumes") or []
    return {**cell.as_row(), "status": record.get("status"), "reason": record.get("reason"),
            "device": (record.get("device") or {}).get("name"), "device_type": (record.get("device") or {}).get("type"),
            "parameters": model.get("parameters"), "vocab_size": model.get("vocab_size"),
            "check_passed": check.get("passed"), "check_loss_error": (check.get("loss") or {}).get("abs_error"),
            "initial_val_loss": final.get("initial_val_loss"), "final_val_loss": final.get("val_loss"),
            "perplexity": final.get("perplexity"),
            "best_val_loss": min((r["val_loss"] for r in curve if r.get("val_loss") is not None), default=None),
            "tokens_trained": timing.get("tokens_trained"), "tokens_per_s": timing.get("tokens_per_s"),
            "steady_tokens_per_s": timing.get("steady_tokens_per_s"), "train_s": timing.get("train_s"), "eval_s": timing.get("eval_s"),
            "checkpoint_s": timing.get("checkpoint_s"), "wall_s": timing.get("wall_s"),
            "eval_share": timing.get("eval_share"), "energy_j": energy.get("energy_j"),
            "j_per_token": energy.get("j_per_token"), "mean_power_w": energy.get("mean_power_w"),
            "peak_power_w": energy.get("peak_power_w"),
            "peak_allocated_bytes": (record.get("memory") or {}).get("peak_allocated_bytes"),
            "target_loss": target.get("loss"), "target_reached": target.get("reached"),
            "tokens_to_target": target.get("tokens"), "wall_s_to_target": target.get("wall_s"),
            "energy_j_to_target": target.get("energy_j"),
            "diverged_step": (record.get("diverged") or {}).get("step"), "resumes": len(resumes),
            "lost_steps": sum(r.get("lost_steps", 0) for r in resumes), "oom_stage": record.get("oom_stage"),
            "duration_s": record.get("duration_s"), **_control(record)}


def _columns() -> list[str]:
    probe = TrainCell("x", "x", "eager", "fp32", "adamw", "cosine", 1.0, 0.0, 0.0, 1, 1, 1, 0)
    return [*probe.as_row(), *RUN_COLUMNS]


def run_table(paths: list[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of the records at `paths`."""
    rows, curves = [], []
    for path in paths:
        cell, record = TrainCell.from_path(str(path)), read_record(path)
        row = _row(cell, record)
        rows.append(row)
        run = {k: row[k] for k in ("status", "reason", "device", "device_type", "target_loss")}
        for point in record.get("curve") or []:
            curves.append({**cell.as_row(), **run, **point})
    runs = pd.DataFrame(rows).reindex(columns=_columns())
    cell_columns = _columns()[:-len(RUN_COLUMNS)]
    curves = pd.DataFrame(curves).reindex(columns=[*cell_columns, *CURVE_COLUMNS])
    if not runs.empty:
        runs["initial_loss_agrees"] = _initial_loss_agrees(runs)
    return runs, curves


def _initial_loss_agrees(runs: pd.DataFrame) -> pd.Series:
    """Whether each run's step-0 validation loss is within the precision's tolerance of the
    median of the runs that start from the same weights and windows; None alone in its group."""
    known = runs["initial_val_loss"].notna()
    median = runs[known].groupby(_SAME_START)["initial_val_loss"].transform("median")
    size = runs[known].groupby(_SAME_START)["initial_val_loss"].transform("size")
    tolerance = runs.loc[known, "precision"].map(STEP0_TOLERANCE)
    agrees = ((runs.loc[known, "initial_val_loss"] - median).abs() <= tolerance).astype(object)
    agrees[size < 2] = None
    return agrees.reindex(runs.index)


def setting_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The spread over seeds of each setting."""
    if runs.empty:
        return pd.DataFrame(columns=["setting", "runs", "ok", "reached"])
    keys = ["setting", *SETTING_KEYS]
    grouped = runs.groupby(keys, dropna=False)
    out = grouped.agg(runs=("seed", "size"), ok=("status", lambda s: int((s == "ok").sum())),
                      reached=("target_reached", lambda s: int((s == True).sum())),  # noqa: E712
                      diverged=("status", lambda s: int((s == "diverged").sum())),
                      device=("device", "first")).reset_index()
    for column in SPREAD_OF:
        ok = runs[(runs["status"] == "ok") & runs[column].notna()]
        stats = ok.groupby(keys, dropna=False)[column].agg(["mean", "std", "min", "max"])
        stats.columns = [f"{column}_{s}" for s in stats.columns]
        out = out.merge(stats.reset_index(), on=keys, how="left")
    return out


def write_tables(records: list[str], out: dict[str, str]) -> str:
    """The suite's training runs, their curves and the spread over seeds; the status counts."""
    from flashwatt.records import atomic_write

    runs, curves = run_table(records)
    settings = setting_table(runs)
    atomic_write(out["runs"], lambda tmp: runs.to_parquet(tmp, index=False))
    atomic_write(out["curves"], lambda tmp: curves.to_parquet(tmp, index=False))
    atomic_write(out["csv"], lambda tmp: runs.to_csv(tmp, index=False, float_format="%.6g"))
    atomic_write(out["settings"], lambda tmp: settings.to_csv(tmp, index=False, float_format="%.6g"))
    return runs["status"].value_counts().to_string() if len(runs) else "no training cells"
