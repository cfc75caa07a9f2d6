"""Synthetic summaries for the figure and report tests, built through the real aggregate.

Each builder writes cell records (and, for GPU cells, telemetry traces) as a run would,
then summarises them with `flashwatt.attention.summary.summarize`, so the tests see exactly the
columns and types the workflow's figures see.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from flashwatt.attention.summary import summarize
from flashwatt.attention.cell import Cell
from flashwatt.records import write_record
from flashwatt.kinds import envelope_of

GPU_NAME = "NVIDIA H100 80GB HBM3"
NO_CUDA = "no CUDA device: energy is measured on NVIDIA GPUs only"
# Latency in ms at L=512 per kernel; other lengths scale as L² (attention's FLOPs).
GPU_LATENCY_MS = {"naive": 0.40, "sdpa_flash": 0.05, "custom": 0.04}
GPU_LENGTHS = (512, 1024, 2048)
GPU_PRECISIONS = ("fp16", "bf16")
WINDOW_S = 3.0


def gpu_latency_ms(kernel: str, seq_len: int, precision: str) -> float:
    return GPU_LATENCY_MS[kernel] * (seq_len / 512) ** 2 * (1.0 if precision == "fp16" else 1.1)


def _write(root: Path, cell: Cell, record: dict, trace: pd.DataFrame | None = None) -> Path:
    path = root / cell.path
    write_record(path, record)
    if trace is not None:
        trace.to_parquet(root / cell.trace_path)
    return path


def _ok(cell: Cell, ms: float, device: dict, method: str) -> dict:
    record = envelope_of(cell, {})
    record.update(status="ok", device=device,
                  provenance={"host": "h", "job_id": "1", "git": {"commit": "abc", "dirty": False}},
                  timing={"median_ms": ms, "p10_ms": ms * 0.98, "p90_ms": ms * 1.02, "repeats": 3000,
                          "tflops": cell.flops / ms / 1e9, "method": method, "calls_per_step": 50},
                  check={"rel_err": 1e-3, "tol": 5e-3, "passed": True},
                  memory={"peak_bytes": 2**30, "workspace_bytes": 0})
    return record


def gpu_cell(kernel: str, precision: str, seq_len: int) -> Cell:
    return Cell("gpu", kernel, precision, seq_len, 16, 8, 64)


def power_trace(peak_w: float) -> pd.DataFrame:
    """Idle, then a 3 s window at about `peak_w`, sampled every 100 ms."""
    t = [i * 0.1 for i in range(60)]
    in_window = [1.5 <= x <= 4.5 for x in t]
    return pd.DataFrame({"t": t, "power_instant_w": [peak_w if w else 90.0 for w in in_window],
                         "in_window": in_window})


def gpu_summary(root: Path) -> pd.DataFrame:
    """A seed-like suite on an H100: three kernels timed by CUDA-graph replay with energy
    windows and traces, one incorrect sdpa_efficient cell and one skipped sdpa_cudnn cell."""
    device = {"type": "cuda", "name": GPU_NAME, "compute_capability": "9.0"}
    paths = []
    for kernel in GPU_LATENCY_MS:
        for precision in GPU_PRECISIONS:
            for seq_len in GPU_LENGTHS:
                cell = gpu_cell(kernel, precision, seq_len)
                ms = gpu_latency_ms(kernel, seq_len, precision)
                record = _ok(cell, ms, device, "cuda_graph")
                record["timing"].update(eager_ms=ms + 0.01, launch_overhead_ms=0.01, window_ms_per_call=ms,
                                        timed_vs_window_pct=0.0)
                peak = 600.0 + seq_len / 100
                record["energy"] = {"energy_per_call_j": ms * 0.6, "avg_power_w": 600.0, "peak_power_w": peak,
                                    "idle_power_w": 90.0, "gflops_per_w": cell.flops / (ms * 0.6) / 1e9,
                                    "window_s": WINDOW_S, "calls": WINDOW_S / ms * 1e3, "flags": [],
                                    "clock_reasons": []}
                paths.append(_write(root, cell, record, power_trace(peak)))
    wrong = gpu_cell("sdpa_efficient", "fp16", 1024)
    record = _ok(wrong, 0.001, device, "cuda_graph")
    record.update(status="incorrect", reason="check against float64 failed: rel_err=0.9 (tol 0.005)")
    record["check"]["passed"] = False
    paths.append(_write(root, wrong, record))
    skipped = gpu_cell("sdpa_cudnn", "bf16", 2048)
    record = envelope_of(skipped, {})
    record.update(status="skipped", reason="sdpa_cudnn cannot run this cell")
    paths.append(_write(root, skipped, record))
    return summarize(paths)


def cpu_summary(root: Path) -> pd.DataFrame:
    """The smoke suite as a machine without a GPU records it: 8 ok cells timed with
    perf_counter, each with the energy reason and no energy."""
    device = {"type": "cpu", "name": "x86_64"}
    paths = []
    for kernel, base_ms in (("naive", 0.05), ("sdpa_math", 0.09)):
        for causal, pass_ in ((False, "fwd"), (True, "fwd_bwd")):
            for seq_len in (32, 64):
                cell = Cell("smoke", kernel, "fp32", seq_len, 2, 2, 16, causal, pass_)
                record = _ok(cell, base_ms * seq_len / 32 * (4 if causal else 1), device, "perf_counter")
                record["energy"] = {"reason": NO_CUDA}
                paths.append(_write(root, cell, record))
    return summarize(paths)
