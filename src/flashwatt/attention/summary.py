"""All cell records of a run into one tidy table: one row per cell, every outcome kept."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from flashwatt.records import read_record

# Columns every summary has, in this order, whatever the records hold.
COLUMNS = [
    "cell_id", "suite", "kernel", "variant", "precision", "seq_len", "batch", "heads", "head_dim",
    "causal", "pass", "status", "reason",
    "median_ms", "p10_ms", "p90_ms", "repeats", "tflops", "timing_method", "timing_fallback_reason",
    "calls_per_step",
    "eager_ms", "launch_overhead_ms", "window_ms_per_call", "timed_vs_window_pct",
    "rel_err", "tol", "grad_rel_err", "check_passed", "rel_err_bf16_same_inputs", "quantize_ms", "kernel_ms",
    "peak_mem_gib", "workspace_gib",
    "energy_per_call_j", "dynamic_energy_per_call_j", "avg_power_w", "peak_power_w", "idle_power_w",
    "gflops_per_w", "energy_window_s", "energy_calls", "counter_vs_integral_pct", "energy_flags",
    "clock_reasons", "temp_start_c", "temp_end_c", "gpu_util_pct", "mem_util_pct", "energy_reason",
    "device", "device_type", "compute_capability", "host", "job_id", "git_commit", "git_dirty", "torch", "cuda",
    "build_seconds", "duration_s", "record",
]
# energy_calls is fractional: the window ends inside a batch of calls (flashwatt.energy).
INT_COLUMNS = {"seq_len", "batch", "heads", "head_dim", "repeats", "calls_per_step"}
BOOL_COLUMNS = {"causal", "check_passed", "git_dirty"}
STRING_COLUMNS = {
    "cell_id", "suite", "kernel", "variant", "precision", "pass", "status", "reason", "timing_method",
    "timing_fallback_reason", "energy_flags",
    "clock_reasons", "energy_reason", "device", "device_type", "compute_capability", "host", "job_id", "git_commit",
    "torch", "cuda", "record",
}


def _get(record: dict, *keys, default=None):
    value = record
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def _joined(values) -> str | None:
    if not values:
        return None
    if isinstance(values, dict):
        values = [k for k, v in values.items() if v]
    return ",".join(map(str, values)) or None


def _reason_durations(energy: dict) -> str | None:
    """Clock event reasons seen in the window with how long each was seen, e.g. 'SwPowerCap 3.0s'."""
    seen = energy.get("clock_reasons") or []
    durations = energy.get("clock_reasons_s") or {}
    parts = [f"{name} {durations[name]:.1f}s" if durations.get(name) is not None else name for name in seen]
    return ", ".join(parts) or None


def record_row(record: dict, path: str) -> dict:
    cell = record.get("cell", {})
    timing = record.get("timing") or {}
    check = record.get("check") or {}
    memory = record.get("memory") or {}
    energy = record.get("energy") or {}
    device = record.get("device") or {}
    prov = record.get("provenance") or {}
    gib = lambda b: None if b is None else b / 2**30  # noqa: E731
    return {
        **{k: cell.get(k) for k in ("cell_id", "suite", "kernel", "variant", "precision", "seq_len", "batch",
                                    "heads", "head_dim", "causal", "pass")},
        "status": record.get("status"),
        "reason": record.get("reason"),
        "median_ms": timing.get("median_ms"),
        "p10_ms": timing.get("p10_ms"),
        "p90_ms": timing.get("p90_ms"),
        "repeats": timing.get("repeats"),
        "tflops": timing.get("tflops"),
        "timing_method": timing.get("method"),
        "timing_fallback_reason": timing.get("fallback_reason"),
        "calls_per_step": timing.get("calls_per_step"),
        "eager_ms": timing.get("eager_ms"),
        "launch_overhead_ms": timing.get("launch_overhead_ms"),
        "window_ms_per_call": timing.get("window_ms_per_call"),
        "timed_vs_window_pct": timing.get("timed_vs_window_pct"),
        "rel_err": check.get("rel_err"),
        "tol": check.get("tol"),
        "grad_rel_err": check.get("grad_rel_err"),
        "check_passed": check.get("passed"),
        # an fp8 cell: the bf16 run's error on the same inputs, and its call's parts timed alone
        "rel_err_bf16_same_inputs": check.get("rel_err_bf16_same_inputs"),
        "quantize_ms": _get(record, "parts", "quantize", "median_ms"),
        "kernel_ms": _get(record, "parts", "attention", "median_ms"),
        "peak_mem_gib": gib(memory.get("peak_bytes")),
        "workspace_gib": gib(memory.get("workspace_bytes")),
        "energy_per_call_j": energy.get("energy_per_call_j"),
        "dynamic_energy_per_call_j": energy.get("dynamic_energy_per_call_j"),
        "avg_power_w": energy.get("avg_power_w"),
        "peak_power_w": energy.get("peak_power_w"),
        "idle_power_w": energy.get("idle_power_w"),
        "gflops_per_w": energy.get("gflops_per_w"),
        "energy_window_s": energy.get("window_s"),
        "energy_calls": energy.get("calls"),
        "counter_vs_integral_pct": energy.get("counter_vs_integral_pct"),
        "energy_flags": _joined(energy.get("flags")),
        "clock_reasons": _reason_durations(energy),
        "temp_start_c": energy.get("temp_start_c"),
        "temp_end_c": energy.get("temp_end_c"),
        "gpu_util_pct": energy.get("gpu_util_pct"),
        "mem_util_pct": energy.get("mem_util_pct"),
        "energy_reason": energy.get("reason"),
        "device": device.get("name"),
        "device_type": device.get("type"),
        "compute_capability": device.get("compute_capability"),
        "host": prov.get("host"),
        "job_id": prov.get("job_id"),
        "git_commit": _get(prov, "git", "commit"),
        "git_dirty": _get(prov, "git", "dirty"),
        "torch": _get(prov, "software", "torch"),
        "cuda": _get(prov, "software", "cuda"),
        "build_seconds": _get(record, "build", "build_seconds"),
        "duration_s": record.get("duration_s"),
        "record": str(path),
    }


def summarize(paths: list[str | Path]) -> pd.DataFrame:
    rows = [record_row(read_record(p), str(p)) for p in paths]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    # Column types that do not depend on which cells happened to succeed.
    for col in COLUMNS:
        if col in INT_COLUMNS:
            frame[col] = frame[col].astype("Int64")
        elif col in BOOL_COLUMNS:
            frame[col] = frame[col].astype("boolean")
        elif col in STRING_COLUMNS:
            frame[col] = frame[col].astype("string")
        else:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    return frame.sort_values(["kernel", "precision", "head_dim", "causal", "pass", "batch", "seq_len"],
                             kind="stable").reset_index(drop=True)


def device_labels(frame: pd.DataFrame) -> pd.Series:
    """Each cell's device as a reader names it ('CPU x86_64', 'NVIDIA H100 80GB HBM3');
    missing where the cell recorded none (a job that died before it started)."""
    on_cpu = frame["device_type"].eq("cpu").fillna(False).astype(bool)
    return frame["device"].where(~on_cpu, "CPU " + frame["device"])


def read_summary(path: str | Path) -> pd.DataFrame:
    """A summary file with every column of COLUMNS: one written before a column existed
    reads with that column empty (the aggregate reruns only when its inputs change)."""
    frame = pd.read_parquet(path)
    return frame.reindex(columns=[*COLUMNS, *(c for c in frame.columns if c not in COLUMNS)])


def write_summary(frame: pd.DataFrame, parquet: str | Path, csv: str | Path) -> None:
    from flashwatt.records import atomic_write

    atomic_write(parquet, lambda tmp: frame.to_parquet(tmp, index=False))
    atomic_write(csv, lambda tmp: frame.to_csv(tmp, index=False, float_format="%.6g"))


# Energy flags that describe the card's normal state rather than a doubtful window: every
# attention backend on an H100/H200 runs at its power cap (docs/measurement.md).
INFORMATIONAL_FLAGS = frozenset({"power_capped"})
# The timed latency and the energy window's time per call time the same workload
# (flashwatt.timing); beyond this difference one of the two figures is not to be trusted.
TIMING_VS_WINDOW_LIMIT_PCT = 5.0


def _doubtful(flags) -> bool:
    if flags is None or flags is pd.NA:
        return False
    return any(f and f not in INFORMATIONAL_FLAGS for f in str(flags).split(","))


def _why_flagged(row) -> str:
    why = []
    if row["status"] != "ok":
        why.append(f"status {row['status']}")
    if _doubtful(row["energy_flags"]):
        why.append(f"energy window: {row['energy_flags']}")
    pct = row["timed_vs_window_pct"]
    if pd.notna(pct) and abs(pct) > TIMING_VS_WINDOW_LIMIT_PCT:
        why.append(f"timed latency and window time per call differ by {pct:+.1f}%")
    return "; ".join(why)


def flagged(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells a reader must not take at face value, each with why: not ok, an energy window
    with a doubtful flag, or a timed latency that disagrees with the window's time per call."""
    why = frame.apply(_why_flagged, axis=1) if len(frame) else pd.Series([], dtype="string")
    cols = ["cell_id", "status", "reason", "energy_flags", "counter_vs_integral_pct", "timed_vs_window_pct",
            "clock_reasons", "rel_err", "tol", "record"]
    out = frame.loc[why != "", cols].copy()
    out.insert(1, "flagged_because", why[why != ""].astype("string"))
    return out.reset_index(drop=True)


def write_tables(records: list[str], out: dict[str, str]) -> str:
    """The suite's summary (Parquet and CSV), its flagged cells and its precision ladder; the
    status counts."""
    from flashwatt.attention.precision_ladder import precision_ladder
    from flashwatt.records import atomic_write

    frame = summarize(records)
    write_summary(frame, out["summary"], out["csv"])
    atomic_write(out["flagged"], lambda tmp: flagged(frame).to_csv(tmp, index=False, float_format="%.6g"))
    atomic_write(out["ladder"], lambda tmp: precision_ladder(frame).to_csv(tmp, index=False, float_format="%.6g"))
    return frame["status"].value_counts().to_string()
