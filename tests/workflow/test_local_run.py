"""The smoke suite for real: submitit's local executor, summary, figures, report; then one cell again."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flashwatt.attention.suite import suite_cells
from flashwatt.config import load_config
from flashwatt.attention.figures import FIGURES

from support import copy_workflow

from .conftest import snakemake

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("smoke"))
    proc = subprocess.run([sys.executable, "-m", "flashwatt.cli", "run", "--cores", "2", "--config", "suite=smoke"],
                          cwd=workdir, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return workdir, proc


def test_every_cell_measured_and_checked(smoke_run):
    workdir, _ = smoke_run
    cells = suite_cells(load_config(workdir / "config/config.yaml"), "smoke")
    summary = pd.read_parquet(workdir / "results/smoke/summary.parquet")
    assert len(summary) == len(cells) == len(pd.read_csv(workdir / "results/smoke/summary.csv"))
    assert set(summary["status"]) == {"ok"}, summary[["cell_id", "status", "reason"]]
    assert (summary["rel_err"] < summary["tol"]).all() and summary["check_passed"].all()
    assert summary["median_ms"].gt(0).all() and summary["tflops"].gt(0).all()
    assert summary.loc[summary["pass"] == "fwd_bwd", "grad_rel_err"].notna().all()
    record = json.loads((workdir / cells[0].path).read_text())
    assert record["provenance"]["executor"] == "local" and record["provenance"]["job_id"]
    assert record["provenance"]["git"]["commit"] and record["schema_version"] == 2 and record["kind"] == "attention"
    assert record["energy"]["reason"].startswith("no CUDA device")
    assert (workdir / cells[0].log_path).read_text().count("completed") >= 1


def test_figures_and_report(smoke_run):
    workdir, proc = smoke_run
    magic = {"png": b"\x89PNG", "pdf": b"%PDF"}
    for fig in FIGURES.values():  # what each figure shows is tested in tests/test_figures.py
        assert (workdir / f"figures/smoke/{fig.name}.{fig.ext}").read_bytes()[:4] == magic[fig.ext]
    report = workdir / "results/smoke/report.html"
    assert f"report written to {report}" in proc.stdout
    html = report.read_text()
    assert "overview.pdf" in html and "summary.csv" in html
    # the method sentences come from this run's summary: timed on the CPU, no energy
    assert "Measured on CPU " in html and "each batch timed with the host's perf_counter" in html
    assert "For 8 cells, no energy was measured: no CUDA device" in html
    assert "between two CUDA events" not in html and "CUDA-event-timed" not in html


def test_rerun_of_one_cell_leaves_others_untouched(smoke_run):
    workdir, _ = smoke_run
    cells = suite_cells(load_config(workdir / "config/config.yaml"), "smoke")
    before = {c.path: (workdir / c.path).stat().st_mtime_ns for c in cells}
    target = cells[3].path
    proc = snakemake(workdir, "--cores", "1", "--config", "suite=smoke", "-f", target)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {c.path: (workdir / c.path).stat().st_mtime_ns for c in cells}
    changed = {p for p in before if before[p] != after[p]}
    assert changed == {target}
    assert json.loads((workdir / target).read_text())["status"] == "ok"


def test_running_one_named_cell_on_a_fresh_checkout_runs_it_and_leaves_the_report_alone(tmp_path):
    workdir = copy_workflow(tmp_path)
    target = suite_cells(load_config(workdir / "config/config.yaml"), "smoke")[0].path
    proc = subprocess.run([sys.executable, "-m", "flashwatt.cli", "run", "--cores", "1", target, "--config",
                           "suite=smoke"], cwd=workdir, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((workdir / target).read_text())["status"] == "ok"
    assert "1 target(s) named; the suite's report is left as it was" in proc.stdout
    assert not (workdir / "results/smoke/report.html").exists()
