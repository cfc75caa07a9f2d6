"""The training smoke suite for real: the data rule, one submitit job per run, the tables,
figures and report; then one run again by asking for its record."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from flashwatt.config import load_config
from flashwatt.training.figures import TRAINING_FIGURES
from flashwatt.training.suite import training_runs

from support import copy_workflow, synthetic_corpus

from .conftest import snakemake

# Heavy: about 4 min of CPU (eight training runs, each a process importing transformers and
# torch). `make test` keeps a training cell's job, resume and records in
# tests/test_training_cells.py and the workflow's paths in the other workflow tests.
pytestmark = [pytest.mark.workflow, pytest.mark.heavy]


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("training"))
    corpus = synthetic_corpus(workdir / "corpus")
    overlay = workdir / "corpus.yaml"
    overlay.write_text(f"suites:\n  training_smoke:\n    training:\n      data:\n        corpus: {corpus}\n")
    args = ["--configfile", "config/config.yaml", str(overlay), "--config", "suite=training_smoke"]
    proc = subprocess.run([sys.executable, "-m", "flashwatt.cli", "run", "--cores", "2", *args], cwd=workdir,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return workdir, args


def test_every_run_trained_and_tabulated(training_run):
    workdir, _ = training_run
    cells = training_runs(load_config(), "training_smoke")
    runs = pd.read_parquet(workdir / "results/training_smoke/training.parquet")
    assert sorted(runs["cell_id"]) == sorted(c.id for c in cells)
    assert set(runs["status"]) == {"ok"}, runs[["cell_id", "status", "reason"]]
    assert (runs["final_val_loss"] < runs["initial_val_loss"]).all()
    assert runs["initial_loss_agrees"].tolist() == [True] * len(runs)  # sdpa_default and sdpa_math, seed by seed
    settings = pd.read_csv(workdir / "results/training_smoke/training_settings.csv")
    assert len(settings) == len(cells) // 2 and (settings["runs"] == 2).all()  # two seeds a setting
    for name in TRAINING_FIGURES:
        assert (workdir / f"figures/training_smoke/{name}.pdf").stat().st_size > 5000
    report = workdir / "results/training_smoke/report.html"
    assert report.stat().st_size > 10000


def test_a_run_is_rerun_by_asking_for_its_record(training_run):
    workdir, args = training_run
    cell = next(iter(training_runs(load_config(), "training_smoke")))
    record = workdir / cell.path
    before = json.loads(record.read_text())["started"]
    proc = snakemake(workdir, "--cores", "2", "-f", cell.path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = json.loads(record.read_text())
    assert after["started"] != before and after["status"] == "ok"
