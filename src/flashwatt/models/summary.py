"""The model cells of a suite as one table: a row per cell with its step time split
(forward, backward, the gradient all-reduce of context parallelism, optimizer, and the
communication inside them, exposed and hidden), tokens per second, MFU (formula in the
record), attention share, memory (the largest GPU's peak), joules per token (energy
summed over every GPU of the cell), the check, and each against transformers' SDPA
default on the same model, phase, context, batch, options, GPUs and strategy in the
same suite (`baseline_same_gpu` says whether the default's cell ran on the same GPU: the
figure compares GPUs as well as backends where it did not), its paired rounds where it
has them (the backend beside the default in one process on one GPU,
flashwatt.models.paired), and against the same model, backend and step on one GPU."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from flashwatt.models.cell import ModelCell
from flashwatt.records import read_record

BASELINE = "sdpa_default"
# A governed cell's run (flashwatt.models.governed_job): its budget and windows, the
# configurations it ran, and how it compares with the static front of the same step
# measured in the suite (flashwatt.control.step_study.judge).
GOVERNED_COLUMNS = [
    "control_budget_w", "control_schedule", "control_temp_limit_c", "control_windows", "control_windows_within_pct",
    "control_worst_overshoot_pct", "control_settling_max_s", "control_explore_s", "control_run_tokens_per_s",
    "control_run_j_per_token", "control_temp_windows_within_pct", "control_temp_worst_window_c", "control_slept_s",
    "control_fault", "control_stalls", "front_points", "front_same_device", "best_static", "vs_best_static", "steady_vs_best_static",
    "vs_front", "steady_vs_front", "vs_static_default_j", "steady_vs_static_default_j", "vs_best_static_j",
]
COLUMNS = [
    "status", "reason", "device", "device_type", "device_uuid", "parameters", "step_ms", "forward_ms", "backward_ms",
    "grad_sync_ms", "optimizer_ms", "communication_ms", "exposed_communication_ms", "exposed_share_of_step",
    "hidden_communication_fraction", "exposed_method",
    "tokens_per_s", "achieved_tflops", "mfu", "peak_tflops", "attention_share",
    "attention_forward_ms", "attention_backward_ms", "attention_method", "kv_expanded", "peak_allocated_bytes",
    "peak_reserved_bytes", "energy_gpus", "j_per_token", "tokens_per_j", "avg_power_w", "peak_power_w",
    "gpu_util_pct", "energy_window_s", "energy_flags", "check_passed", "logits_error", "logits_tolerance", "causal_passed", "grad_error",
    "grad_tolerance", "loss", "control_configurations", "control_settle_s", "control_settled", "compile_s", "oom_stage", "speedup_vs_sdpa_default", "energy_vs_sdpa_default",
    "baseline_same_gpu", "paired_rounds", "paired_speed", "paired_speed_min", "paired_speed_max", "paired_energy",
    "paired_energy_min", "paired_energy_max", "paired_reason", "speedup_vs_one_gpu", "scaling_efficiency", "duration_s",
    *GOVERNED_COLUMNS,
]
_SAME_STEP = ["suite", "model", "precision", "phase", "seq_len", "batch", "recompute", "compiled", "gpus", "strategy",
              "governor"]
# One GPU's cell of the same step: the same sequences per GPU for fsdp (the same per-GPU
# work), the same sequences for context parallelism (the same work, split).
_ONE_GPU = ["suite", "model", "backend", "precision", "phase", "seq_len", "batch", "recompute", "compiled", "governor"]


def _row(cell: ModelCell, record: dict) -> dict:
    timing = record.get("timing") or {}
    flops = record.get("flops") or {}
    attention = record.get("attention") or {}
    memory = record.get("memory") or {}
    energy = record.get("energy") or {}
    check = _check_summary(record.get("check") or {})
    control = record.get("control") or {}
    device = record.get("device") or {}
    communication = record.get("communication") or {}
    paired = record.get("paired") or {}
    speed_range = paired.get("speed_range") or [None, None]
    energy_range = paired.get("energy_range") or [None, None]
    return {**cell.as_row(), "status": record.get("status"), "reason": record.get("reason"),
            "device": device.get("name"), "device_type": device.get("type"), "device_uuid": device.get("uuid"),
            "parameters": (record.get("model") or {}).get("parameters"),
            "step_ms": timing.get("step_ms"), "forward_ms": timing.get("forward_ms"),
            "backward_ms": timing.get("backward_ms"), "grad_sync_ms": timing.get("grad_sync_ms"),
            "optimizer_ms": timing.get("optimizer_ms"), "communication_ms": communication.get("communication_ms"),
            "exposed_communication_ms": communication.get("exposed_ms"),
            "exposed_share_of_step": communication.get("exposed_share_of_step"),
            "hidden_communication_fraction": communication.get("hidden_fraction"),
            "exposed_method": communication.get("exposed_method"),
            "tokens_per_s": timing.get("tokens_per_s"), "achieved_tflops": flops.get("achieved_tflops"),
            "mfu": flops.get("mfu"), "peak_tflops": flops.get("peak_tflops"),
            "attention_share": attention.get("share"), "attention_forward_ms": attention.get("forward_ms"),
            "attention_backward_ms": attention.get("backward_ms"), "attention_method": attention.get("method"),
            "kv_expanded": attention.get("kv_expanded"),
            "peak_allocated_bytes": memory.get("peak_allocated_bytes"),
            "peak_reserved_bytes": memory.get("peak_reserved_bytes"), "energy_gpus": energy.get("n_gpus"),
            "j_per_token": energy.get("j_per_token"), "tokens_per_j": energy.get("tokens_per_j"),
            "avg_power_w": energy.get("avg_power_w"), "peak_power_w": energy.get("peak_power_w"),
            # NVML's share of the energy window with a kernel running: far under 100 says the
            # step waits on the host (an uncompiled decode step's Python), not on the GPU
            "gpu_util_pct": energy.get("gpu_util_pct"),
            "energy_window_s": energy.get("window_s"),
            "energy_flags": ",".join(energy.get("flags") or []) or None,
            "check_passed": check.get("passed"), "logits_error": (check.get("logits") or {}).get("error"),
            "logits_tolerance": (check.get("logits") or {}).get("tolerance"),
            "causal_passed": (check.get("causal") or {}).get("passed"),
            "grad_error": (check.get("grad") or {}).get("error"),
            "grad_tolerance": (check.get("grad") or {}).get("tolerance"),
            "loss": (check.get("loss") or {}).get("value"),
            "control_configurations": _shares(control.get("measured_calls")),
            "control_settle_s": (control.get("settle") or {}).get("seconds"),
            "control_settled": (control.get("settle") or {}).get("settled"), "compile_s": timing.get("compile_s"),
            "oom_stage": record.get("oom_stage"),
            "paired_rounds": len(paired["rounds"]) if "rounds" in paired else None,
            "paired_speed": paired.get("speed"), "paired_speed_min": speed_range[0],
            "paired_speed_max": speed_range[1], "paired_energy": paired.get("energy"),
            "paired_energy_min": energy_range[0], "paired_energy_max": energy_range[1],
            "paired_reason": paired.get("reason"), "duration_s": record.get("duration_s"), **_governed(record)}


def _governed(record: dict) -> dict:
    """A governed cell's columns from its record's `control` (empty for any other cell)."""
    control = record.get("control") or {}
    merit = control.get("merit") or {}
    if "setting" not in control:
        return {}
    schedule = control.get("schedule") or []
    fault = control.get("fault") or merit.get("fault")
    return {"control_budget_w": schedule[0][1] if schedule else None,
            "control_schedule": " ".join(f"{w:g}W@{t:g}s" for t, w in schedule) or None,
            "control_temp_limit_c": control.get("temp_limit_c"), "control_windows": merit.get("windows"),
            "control_windows_within_pct": merit.get("windows_within_pct"),
            "control_worst_overshoot_pct": merit.get("worst_overshoot_pct"),
            "control_settling_max_s": merit.get("settling_max_s"), "control_explore_s": merit.get("explore_s"),
            "control_run_tokens_per_s": merit.get("tokens_per_s"), "control_run_j_per_token": merit.get("j_per_token"),
            "control_temp_windows_within_pct": merit.get("temp_windows_within_pct"),
            "control_temp_worst_window_c": merit.get("temp_worst_window_c"), "control_slept_s": merit.get("slept_s"),
            "control_fault": f"{fault['kind']}: {fault['action']}" if fault else None,
            "control_stalls": merit.get("stalls"),
            "control_configurations": _shares(merit.get("calls")) or _shares(control.get("calls"))}


def _check_summary(check: dict) -> dict:
    """A controller cell's checks (one per configuration it ran) as one: the worst error
    of each part, causal passed only where every configuration passed it."""
    configurations = check.get("configurations")
    if not configurations:
        return check
    merged = {"passed": check.get("passed")}
    for part in ("logits", "grad"):
        parts = [r[part] for r in configurations.values() if part in r]
        if parts:
            worst = max(parts, key=lambda r: r.get("error") or 0.0)
            merged[part] = {"error": worst.get("error"), "tolerance": worst.get("tolerance")}
    causal = [r["causal"]["passed"] for r in configurations.values() if "causal" in r]
    if causal:
        merged["causal"] = {"passed": all(causal)}
    return merged


def _shares(calls: dict | None) -> str | None:
    """"custom 97%, sdpa_cudnn 3%": the configurations a controller ran, by share of calls."""
    if not calls:
        return None
    total = sum(calls.values())
    return ", ".join(f"{label} {n / total:.0%}" for label, n in sorted(calls.items(), key=lambda kv: -kv[1]))


def model_table(paths: list[str | Path]) -> pd.DataFrame:
    records = [(ModelCell.from_path(str(p)), read_record(p)) for p in paths]
    rows = [_row(cell, record) for cell, record in records]
    columns = [*ModelCell("x", "x", "eager", "fp32", "prefill", 1, 1).as_row(), *COLUMNS]
    table = pd.DataFrame(rows).reindex(columns=columns)
    if table.empty:
        return table
    base = table[(table["backend"] == BASELINE) & (table["status"] == "ok")]
    base = base[_SAME_STEP + ["tokens_per_s", "j_per_token", "device_uuid"]].rename(
        columns={"tokens_per_s": "_base_tps", "j_per_token": "_base_jpt", "device_uuid": "_base_uuid"})
    table = table.drop(columns=["speedup_vs_sdpa_default", "energy_vs_sdpa_default", "baseline_same_gpu"]).merge(
        base, on=_SAME_STEP, how="left")
    one = table[(table["gpus"] == 1) & (table["status"] == "ok")][_ONE_GPU + ["tokens_per_s"]].rename(
        columns={"tokens_per_s": "_one_tps"})
    table = table.drop(columns=["speedup_vs_one_gpu", "scaling_efficiency"]).merge(one, on=_ONE_GPU, how="left")
    ok = table["status"] == "ok"
    table["speedup_vs_sdpa_default"] = (table["tokens_per_s"] / table["_base_tps"]).where(ok)
    table["energy_vs_sdpa_default"] = (table["j_per_token"] / table["_base_jpt"]).where(ok)
    # Unknown (NA) where either cell ran without a GPU uuid (a CPU) or has no default to compare with.
    known = ok & table["_base_tps"].notna() & table["device_uuid"].notna() & table["_base_uuid"].notna()
    table["baseline_same_gpu"] = (table["device_uuid"] == table["_base_uuid"]).where(known).astype("boolean")
    table["speedup_vs_one_gpu"] = (table["tokens_per_s"] / table["_one_tps"]).where(ok)
    table["scaling_efficiency"] = table["speedup_vs_one_gpu"] / table["gpus"]
    table = table.drop(columns=["_base_tps", "_base_jpt", "_base_uuid", "_one_tps"]).reindex(columns=columns)
    return judge_governed(table, records)


# A governed run's front: the same step from the same backend, its governor `front`.
_FRONT_KEY = [*(k for k in _SAME_STEP if k != "governor"), "backend"]
# What judge_governed fills (flashwatt.control.step_study.judge and the front's facts).
_VERDICT_COLUMNS = ["front_points", "front_same_device", "best_static", "vs_best_static", "steady_vs_best_static",
                    "vs_front", "steady_vs_front", "vs_static_default_j", "steady_vs_static_default_j", "vs_best_static_j"]


def judge_governed(table: pd.DataFrame, records: list[tuple[ModelCell, dict]]) -> pd.DataFrame:
    """Each governed run against the static front of the same step (its `front` cell in the
    suite: same model, backend, precision, phase, context, batch, options, GPUs, strategy)."""
    from flashwatt.control.governor_setting import GovernorSetting
    from flashwatt.control.step_study import judge

    table = table.astype({column: object for column in _VERDICT_COLUMNS})  # filled per row: names, ratios, flags
    fronts = {}
    for cell, record in records:
        if cell.governor == "front" and record.get("status") == "ok":
            key = tuple(cell.as_row()[k] for k in _FRONT_KEY)
            fronts[key] = (record.get("front") or [], (record.get("device") or {}).get("uuid"))
    for i, (cell, record) in enumerate(records):
        control = record.get("control") or {}
        if not cell.governor or cell.governor == "front" or record.get("status") != "ok" or "merit" not in control:
            continue
        found = fronts.get(tuple(cell.as_row()[k] for k in _FRONT_KEY))
        if found is None:
            continue
        front, uuid = found
        setting = GovernorSetting.parse(cell.governor)
        budget = setting.schedule[0][1] if len(setting.schedule) == 1 else None  # a schedule's budget moves
        verdict = judge(control["merit"], front, setting.mode, budget, control["merit"].get("idle_w"))
        verdict["front_points"] = sum(1 for r in front if r.get("tokens_per_s") is not None)
        verdict["front_same_device"] = uuid is not None and uuid == (record.get("device") or {}).get("uuid")
        row = table.index[table["cell_id"] == cell.id]
        for column in _VERDICT_COLUMNS:
            if column in verdict:
                table.loc[row, column] = verdict[column]
    return table


def front_table(paths: list[str | Path]) -> pd.DataFrame:
    """One row per static point of every front cell: configuration, duty, throughput, power,
    joules per token."""
    rows = []
    for path in paths:
        cell = ModelCell.from_path(str(path))
        if cell.governor != "front":
            continue
        record = read_record(path)
        for point in record.get("front") or []:
            rows.append({**cell.as_row(), "status": record.get("status"),
                         "device": (record.get("device") or {}).get("name"), **point})
    return pd.DataFrame(rows)


def governed_traces(paths: list[str | Path]) -> pd.DataFrame:
    """The controller's ticks of every governed run (its `.trace.parquet`), one frame."""
    frames = []
    for path in paths:
        cell = ModelCell.from_path(str(path))
        trace_path = Path(str(path)[: -len(".json")] + ".trace.parquet")
        if not cell.governor or cell.governor == "front" or not trace_path.exists():
            continue
        frame = pd.read_parquet(trace_path)
        if len(frame) and "source" in frame:
            frames.append(frame[frame["source"] == "controller"].assign(cell_id=cell.id, governor=cell.governor,
                                                                         model=cell.model, phase=cell.phase,
                                                                         gpus=cell.gpus))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["cell_id", "t", "power_w"])


def write_tables(records: list[str], out: dict[str, str]) -> str:
    """The suite's model table (Parquet and CSV); the status counts."""
    from flashwatt.records import atomic_write

    table = model_table(records)
    atomic_write(out["table"], lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write(out["csv"], lambda tmp: table.to_csv(tmp, index=False, float_format="%.6g"))
    front = front_table(records)
    atomic_write(out["front"], lambda tmp: front.to_csv(tmp, index=False, float_format="%.6g"))
    traces = governed_traces(records)
    atomic_write(out["governed_traces"], lambda tmp: traces.to_parquet(tmp, index=False))
    return table["status"].value_counts().to_string() if len(table) else "no model cells"
