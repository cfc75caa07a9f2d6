"""Synthetic suite runs for the comparison's tests: attention records as a job writes them
(timed steps, an energy window, provenance), tabled by the suite's own aggregation, in the
layout a real run leaves (results/cells/<suite>/..., results/<suite>/summary.parquet) or
that `flashwatt run --repeat N` keeps (results/<suite>/runs/<i>/)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from flashwatt.attention.cell import Cell
from flashwatt.attention.kind import KIND as ATTENTION
from flashwatt.attention.summary import write_tables
from flashwatt.records import write_record

SUITE = "syn"
H100 = "NVIDIA H100 80GB HBM3"
CELLS = [Cell(SUITE, kernel, "bf16", seq_len, 16, 8, 64, causal, pass_)
         for kernel in ("sdpa_flash", "custom") for seq_len in (512, 1024, 2048)
         for causal, pass_ in ((False, "fwd"), (True, "fwd_bwd"))]
STEPS = 60          # timed steps per cell
STEP_NOISE = 0.02   # their spread (lognormal sigma)
RUN_NOISE = 0.003   # energy per call from run to run (0.3%, as measured on an H100)


def base_latency_ms(cell: Cell) -> float:
    return 0.05 * (cell.seq_len / 512) ** 2 * (3.5 if cell.pass_ == "fwd_bwd" else 1) * (1.3 if cell.kernel == "custom" else 1)


def record_of(cell: Cell, rng: np.random.Generator, latency_factor: float = 1.0, energy_factor: float = 1.0,
              status: str = "ok", device: str = H100, commit: str = "a" * 40, seed: int = 0,
              energy_noise: float = RUN_NOISE) -> dict:
    steps = base_latency_ms(cell) * latency_factor * rng.lognormal(0, STEP_NOISE, STEPS)
    median = float(np.median(steps))
    energy_j = base_latency_ms(cell) * 0.7 * energy_factor * (1 + rng.normal(0, energy_noise))
    record = {
        "schema_version": 2, "kind": "attention", "cell": cell.as_row(), "status": status,
        "reason": None if status == "ok" else f"synthetic {status}",
        "settings": {"seed": seed, "warmup_ms": 200, "min_repeats": 30},
        "started": "2026-11-20T10:00:00.000+00:00",
        "provenance": {"host": "gpu-node-1", "job_id": "1", "git": {"commit": commit, "dirty": False},
                       "software": {"torch": "2.13.0", "cuda": "13.0"}},
        "device": {"type": "cuda", "name": device, "nvml": [{"driver_version": "580.65"}]},
    }
    if status == "ok":
        record["timing"] = {"method": "cuda_graph", "median_ms": median, "p10_ms": float(np.quantile(steps, 0.1)),
                            "p90_ms": float(np.quantile(steps, 0.9)), "repeats": STEPS * 4, "steps": STEPS,
                            "tflops": cell.flops / (median * 1e-3) / 1e12, "flops_per_call": cell.flops,
                            "per_call_ms": steps.tolist()}
        record["check"] = {"rel_err": 2e-3, "tol": 2e-2, "passed": True}
        record["energy"] = {"energy_per_call_j": energy_j, "avg_power_w": energy_j / (median * 1e-3),
                            "gflops_per_w": cell.flops / energy_j / 1e9}
    return record


def table_files(folder: Path) -> dict[str, Path]:
    """The attention kind's tables under folder, as the table rule names them."""
    return {table.key: folder / table.name for table in ATTENTION.tables}


def write_run(folder: Path, records: dict[Cell, dict]) -> Path:
    """Records under folder/cells/..., tabled into folder/summary.parquet (and its twins)."""
    paths = []
    for cell, record in records.items():
        path = folder / "cells" / Path(cell.path).relative_to("results/cells")
        write_record(path, record)
        paths.append(str(path))
    write_tables(paths, table_files(folder))
    return folder


def suite_run(root: Path, seed: int, runs: int = 1, changes: dict | None = None, drop=(), add=(), **kw) -> Path:
    """A suite folder root/results/syn: one run, or `runs` kept runs; `changes` maps a cell to
    keyword arguments of `record_of` (a planted regression, a status)."""
    rng = np.random.default_rng(seed)
    suite = root / "results" / SUITE
    cells = [c for c in CELLS if c not in drop] + list(add)
    for i in range(1, runs + 1):
        records = {c: record_of(c, rng, **{**kw, **(changes or {}).get(c, {})}) for c in cells}
        if runs == 1:
            # a plain run: tables in results/syn, records in results/cells/syn
            for cell, record in records.items():
                write_record(root / cell.path, record)
            write_tables([str(root / c.path) for c in cells], table_files(suite))
        else:
            write_run(suite / "runs" / str(i), records)
    return suite
