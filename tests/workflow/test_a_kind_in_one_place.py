"""A kind of cell is defined in one place: tests/kinds/toy_kind.py, a kind flashwatt does not
ship, named in FLASHWATT_KINDS, is planned and validated, run by Snakemake as one job per cell
through submitit's local executor, tabled, drawn and counted by the CLI, with no edit to
flashwatt, its workflow or its config schema."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flashwatt.records import read_record

KINDS_DIR = Path(__file__).resolve().parents[1] / "kinds"
TOY_SUITE = {"toys": {"description": "a kind from outside flashwatt", "toys": {"sizes": [2, 5, 13]}}}

pytestmark = pytest.mark.workflow


@pytest.fixture
def toy_env(monkeypatch):
    monkeypatch.setenv("FLASHWATT_KINDS", "toy_kind")
    monkeypatch.syspath_prepend(str(KINDS_DIR))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(KINDS_DIR), os.environ.get("PYTHONPATH", "")]),
            "CUDA_VISIBLE_DEVICES": ""}


def _config_with_toys(workdir: Path) -> Path:
    config = yaml.safe_load((workdir / "config/config.yaml").read_text())
    config["suites"].update(TOY_SUITE)
    path = workdir / "config/config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_toy_kind_is_planned_and_validated_from_its_own_module(toy_env, tmp_path):
    from flashwatt.config import ConfigError, load_config
    from flashwatt.kinds import every_cell, kind_named

    config_file = tmp_path / "config.yaml"
    base = yaml.safe_load(Path("config/config.yaml").read_text())
    config_file.write_text(yaml.safe_dump({**base, "suites": {**base["suites"], **TOY_SUITE}}))
    config = load_config(config_file)
    cells = every_cell(config, "toys")
    assert [c.path for c in cells] == [f"results/cells/toys/toy/n{n}.json" for n in (2, 5, 13)]
    assert kind_named("toy").cell.from_path(cells[0].path) == cells[0]
    bad = yaml.safe_load(config_file.read_text())
    bad["suites"]["toys"]["toys"]["sizes"] = ["two"]
    config_file.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"suites\.toys\.toys\.sizes\[0\]"):
        load_config(config_file)


# Heavy: tests/workflow/test_failed_cells.py runs the same kind from FLASHWATT_KINDS through
# Snakemake (its jobs, table and figure) in `make test`; this one adds the CLI's counts, the
# report and `flashwatt failed`.
@pytest.mark.heavy
def test_the_toy_kind_runs_through_the_workflow_and_the_cli(workdir, toy_env):
    _config_with_toys(workdir)
    run = subprocess.run([sys.executable, "-m", "flashwatt.cli", "run", "--config", "suite=toys"], cwd=workdir,
                         env=toy_env, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "suite toys, 3 cells" in out and "cells by status: 2 ok, 1 skipped" in out, out
    records = {n: read_record(workdir / f"results/cells/toys/toy/n{n}.json") for n in (2, 5, 13)}
    assert all(r["kind"] == "toy" and r["schema_version"] == 2 for r in records.values())
    assert records[5]["status"] == "ok" and records[5]["total"] == 10
    assert records[5]["provenance"]["job_id"]  # ran as a submitit job, not in Snakemake's process
    assert records[13]["status"] == "skipped" and records[13]["reason"] == "13 is unlucky"
    import pandas as pd

    table = pd.read_parquet(workdir / "results/toys/toys.parquet")
    assert sorted(table["n"]) == [2, 5, 13] and table.set_index("n").loc[2, "total"] == 1
    assert (workdir / "figures/toys/toy_totals.pdf").stat().st_size > 0
    assert "toy cells:" in out  # the CLI names the kind's table
    report = (workdir / "results/toys/report.html").read_text()
    assert "toy_totals" in report
    failed = subprocess.run([sys.executable, "-m", "flashwatt.cli", "failed", "--config", "suite=toys"], cwd=workdir,
                            env=toy_env, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 0 and failed.stdout.split() == ["results/cells/toys/toy/n13.json"], failed.stdout
