"""`flashwatt run --repeat N` without Snakemake: the option is read, each run is asked for with
every cell rule forced, kept under results/<suite>/runs/<i>/ with its records and run.json,
numbered after the runs already kept, and the repeats stop at a run that failed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashwatt.attention.kind import KIND as ATTENTION
from flashwatt.attention.summary import write_tables
from flashwatt.compare.repeat import repeat_count, run_repeated
from flashwatt.config import load_config, resolve_suite
from flashwatt.config_error import ConfigError
from flashwatt.kinds import every_cell
from flashwatt.records import write_record

REPO = Path(__file__).resolve().parents[1]


def test_the_option_is_read_and_the_rest_passed_on():
    assert repeat_count(["--repeat", "3", "--cores", "2"]) == (3, ["--cores", "2"])
    assert repeat_count(["--cores", "2", "--repeat=2"]) == (2, ["--cores", "2"])
    for bad in (["--repeat", "0"], ["--repeat", "x"], ["--repeat"]):
        with pytest.raises(ConfigError, match="--repeat"):
            repeat_count(bad)


def smoke_config(monkeypatch) -> dict:
    monkeypatch.chdir(REPO)  # the config files are read from the checkout
    return load_config(overrides={"suite": "smoke"})


class FakeRun:
    """What `flashwatt run` leaves behind, for the smoke suite: a record per cell and the tables."""

    def __init__(self, config, statuses):
        self.config, self.statuses, self.calls = config, list(statuses), []

    def __call__(self, args):
        self.calls.append(args)
        suite = resolve_suite(self.config)
        cells = every_cell(self.config, suite)
        for cell in cells:
            write_record(cell.path, {"schema_version": 2, "kind": "attention", "cell": cell.as_row(),
                                     "status": "ok", "started": f"run {len(self.calls)}"})
        write_tables([c.path for c in cells], {table.key: table.path(suite) for table in ATTENTION.tables})
        return self.statuses.pop(0)


def test_each_run_is_forced_and_kept_numbered_after_the_last(tmp_path, monkeypatch):
    config = smoke_config(monkeypatch)
    monkeypatch.chdir(tmp_path)
    fake = FakeRun(config, [0, 0, 0])
    assert run_repeated(["--repeat", "2", "--cores", "2"], fake, lambda args: config) == 0
    assert fake.calls == [["--cores", "2", "--forcerun", "cell"]] * 2
    for i in (1, 2):
        run = tmp_path / "results/smoke/runs" / str(i)
        info = json.loads((run / "run.json").read_text())
        assert info["run"] == i and info["of"] == 2 and info["exit_status"] == 0
        assert info["measure"]["seed"] == 0 and info["suite_config"]["grids"]
        records = sorted((run / "cells").rglob("*.json"))
        assert len(records) == 8 and json.loads(records[0].read_text())["started"] == f"run {i}"
        assert (run / "summary.parquet").is_file() and (run / "flagged.csv").is_file()
    assert run_repeated(["--repeat", "1"], fake, lambda args: config) == 0
    assert (tmp_path / "results/smoke/runs/3/run.json").is_file()  # numbering goes on


def test_the_repeats_stop_at_a_failed_run_which_is_kept(tmp_path, monkeypatch):
    config = smoke_config(monkeypatch)
    monkeypatch.chdir(tmp_path)
    fake = FakeRun(config, [0, 1, 0])
    assert run_repeated(["--repeat", "3"], fake, lambda args: config) == 1
    assert len(fake.calls) == 2
    assert json.loads((tmp_path / "results/smoke/runs/2/run.json").read_text())["exit_status"] == 1
    assert not (tmp_path / "results/smoke/runs/3").exists()
