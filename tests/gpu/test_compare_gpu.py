"""Two cells of the seed suite run three times on one GPU (`flashwatt run --repeat 3`), then
compared run against run: nothing got worse beyond its noise and a loose threshold, latency
has an interval from the cells' timed steps, energy one from the repeated runs. The
comparison (table, figures, page) is copied to $OUT where that is set."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from support import copy_workflow

pytestmark = pytest.mark.gpu
SLICE = ["suite=seed", 'filter=kernel in ["sdpa_flash", "custom"] and precision == "bf16" and seq_len == 1024 '
         'and pass == "fwd"']


def flashwatt(workdir: Path, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashwatt.cli", *args], cwd=workdir, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("repeated"))
    proc = flashwatt(workdir, "run", "--repeat", "3", "--cores", "4", "--config", *SLICE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


def test_each_run_is_kept_with_its_timed_steps_and_energy(repeated):
    for i in (1, 2, 3):
        run = repeated / "results/seed/runs" / str(i)
        table = pd.read_parquet(run / "summary.parquet")
        assert set(table["status"]) == {"ok"} and len(table) == 2, table[["cell_id", "status", "reason"]]
        assert table["energy_per_call_j"].gt(0).all()
        for path in (run / "cells").rglob("*.json"):
            timing = json.loads(path.read_text())["timing"]
            assert len(timing["per_call_ms"]) == timing["steps"] >= 30


def test_runs_on_one_gpu_compare_within_noise(repeated):
    out = repeated / "results/compare"
    proc = flashwatt(repeated, "compare", "results/seed/runs/1", "results/seed/runs/2,results/seed/runs/3",
                     "--labels", "run 1,runs 2-3", "--fail-if", "latency:+10%", "energy:+5%", timeout=600)
    if os.environ.get("OUT"):
        shutil.copytree(out, Path(os.environ["OUT"]) / "compare-runs", dirs_exist_ok=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_parquet(out / "comparison.parquet")
    assert len(table) == 2 and (table["presence"] == "both").all()
    assert set(table["latency_from"]) == {"repeats/runs"} and table["latency_low"].notna().all()
    assert set(table["energy_from"]) == {"single/runs"} and table["energy_low"].notna().all()
    # energy per call holds within a few tenths of a percent between runs (docs/measurement.md)
    assert table["energy_ratio"].between(0.97, 1.03).all(), table[["cell", "energy_ratio"]]
    page = (out / "report.html").read_text()
    assert "NVIDIA" in page and (out / "figures/1-attention-latency.png").stat().st_size > 10_000
