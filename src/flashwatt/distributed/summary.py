"""The distributed cells of a suite as one table: a row per cell, its timing split, speed,
scaling against one GPU in the same run, memory per GPU, energy summed over the job's GPUs
and errors against float64."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from flashwatt.distributed.cell import DistributedCell
from flashwatt.records import read_record

COLUMNS = [
    "status", "reason", "device", "device_type", "world_size", "forward_ms", "backward_ms", "total_ms", "timing_method",
    "forward_comm_exposed_ms", "forward_comm_hidden_fraction", "backward_comm_exposed_ms",
    "backward_comm_hidden_fraction", "tflops_total", "tflops_per_gpu", "single_gpu_total_ms", "speedup",
    "efficiency", "peak_bytes_per_gpu", "memory_ratio_to_one_gpu", "check_passed", "error_out", "error_dq",
    "error_dk", "error_dv", "single_gpu_error_out", "single_gpu_error_dq", "context_parallel_total_ms",
    "vs_context_parallel", "energy_per_call_j", "j_per_token", "avg_power_w", "energy_gpus", "energy_flags",
    "energy_reason", "single_gpu_energy_per_call_j", "energy_ratio_to_one_gpu", "duration_s",
]


def _row(cell: DistributedCell, record: dict) -> dict:
    result = record.get("result") or {}
    time = result.get("time") or {}
    comm = result.get("communication") or {}
    check = result.get("check") or {}
    memory = result.get("memory") or {}
    single = result.get("single_gpu") or {}
    peer = result.get("context_parallel") or {}
    row = {**cell.as_row(), "status": record.get("status"), "reason": record.get("reason"),
           "device": result.get("device"),
           "device_type": None if result.get("device") is None else ("cpu" if result["device"] == "cpu" else "cuda"),
           "world_size": result.get("world_size"),
           "forward_ms": time.get("forward_ms"), "backward_ms": time.get("backward_ms"),
           "total_ms": time.get("total_ms"), "timing_method": time.get("method"),
           "tflops_total": (result.get("tflops") or {}).get("total"),
           "tflops_per_gpu": (result.get("tflops") or {}).get("per_gpu"),
           "single_gpu_total_ms": single.get("total_ms"), "speedup": result.get("speedup"),
           "efficiency": result.get("efficiency"),
           "peak_bytes_per_gpu": max(memory["peak_bytes_per_gpu"]) if memory.get("peak_bytes_per_gpu") else None,
           "memory_ratio_to_one_gpu": memory.get("ratio_to_one_gpu"), "check_passed": check.get("passed"),
           "context_parallel_total_ms": peer.get("total_ms"), "duration_s": record.get("duration_s")}
    for phase in ("forward", "backward"):
        part = comm.get(phase) or {}
        row[f"{phase}_comm_exposed_ms"] = part.get("exposed_ms")
        row[f"{phase}_comm_hidden_fraction"] = part.get("hidden_fraction")
    for name in ("out", "dq", "dk", "dv"):
        row[f"error_{name}"] = (check.get("error") or {}).get(name)
    for name in ("out", "dq"):
        row[f"single_gpu_error_{name}"] = (check.get("single_gpu_error") or {}).get(name)
    energy = result.get("energy") or {}
    row.update(energy_per_call_j=energy.get("energy_per_call_j"), j_per_token=energy.get("j_per_token"),
               avg_power_w=energy.get("avg_power_w"), energy_gpus=energy.get("n_gpus"),
               energy_flags=",".join(energy.get("flags") or []) or None, energy_reason=energy.get("reason"),
               single_gpu_energy_per_call_j=(single.get("energy") or {}).get("energy_per_call_j"),
               energy_ratio_to_one_gpu=result.get("energy_ratio_to_one_gpu"))
    row["vs_context_parallel"] = (peer["total_ms"] / row["total_ms"]
                                  if peer.get("total_ms") and row["total_ms"] else None)
    return row


def distributed_table(paths: list[str | Path]) -> pd.DataFrame:
    rows = [_row(DistributedCell.from_path(str(p)), read_record(p)) for p in paths]
    columns = [*DistributedCell("x", "ring", "math", "fp64", 1, 2, 1, 1, 1, 1).as_row(), *COLUMNS]
    return pd.DataFrame(rows).reindex(columns=columns)


def write_tables(records: list[str], out: dict[str, str]) -> str:
    """The suite's distributed table (Parquet and CSV); the status counts."""
    from flashwatt.records import atomic_write

    table = distributed_table(records)
    atomic_write(out["table"], lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write(out["csv"], lambda tmp: table.to_csv(tmp, index=False, float_format="%.6g"))
    return table["status"].value_counts().to_string() if len(table) else "no distributed cells"
