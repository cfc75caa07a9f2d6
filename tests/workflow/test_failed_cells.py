"""What a run does with cells that failed, cells whose record is gone and cells this host
cannot run, through the real Snakemake with the local executor. The cells are the toy kind
of tests/kinds (a sum on the CPU, whose job dies while a file says so) and two attention
cells: each run takes seconds, not a measurement's minutes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flashwatt.failures import FAILED_CELLS_EXIT, history
from flashwatt.records import read_record

from .conftest import snakemake

pytestmark = pytest.mark.workflow

KINDS_DIR = Path(__file__).resolve().parents[1] / "kinds"
TOYS = {"toys": {"description": "two toy cells", "toys": {"sizes": [5, 7]}}}


@pytest.fixture
def toys(workdir, monkeypatch):
    """The workflow with suite `toys` (cells n5 and n7) and the toy kind on every path."""
    config = yaml.safe_load((workdir / "config/config.yaml").read_text())
    config["suites"].update(TOYS)
    (workdir / "config/config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    monkeypatch.setenv("FLASHWATT_KINDS", "toy_kind")
    monkeypatch.syspath_prepend(str(KINDS_DIR))
    env = {"FLASHWATT_KINDS": "toy_kind", "PYTHONPATH": os.pathsep.join([str(KINDS_DIR), os.environ.get("PYTHONPATH", "")])}
    return workdir, env


def record(workdir: Path, n: int) -> dict:
    return read_record(workdir / f"results/cells/toys/toy/n{n}.json")


def test_a_failed_cell_fails_the_run_after_its_table_and_the_next_run_measures_it_again(toys):
    workdir, env = toys
    run = ("--cores", "2", "--config", "suite=toys")
    (workdir / "toy-n7-dies").touch()  # n7's job dies before returning, as a job killed by Slurm does
    first = snakemake(workdir, *run, env=env)
    assert first.returncode == FAILED_CELLS_EXIT, first.stderr[-3000:]
    [said] = [line for line in first.stderr.splitlines() if "cells of suite toys failed" in line]
    assert said.startswith("flashwatt: 1 of 2 cells of suite toys failed (1 job_failed): `flashwatt failed` lists "
                           "them, the next run measures them again")
    # ... said after every job: the table and the figure hold what was measured, the failure too
    table = pd.read_parquet(workdir / "results/toys/toys.parquet").set_index("n")
    assert table.loc[5, "status"] == "ok" and table.loc[7, "status"] == "job_failed"
    assert (workdir / "figures/toys/toy_totals.pdf").stat().st_size > 0
    failed = record(workdir, 7)
    assert "ended without a result" in failed["reason"] and history(workdir / "results/cells/toys/toy/n7.json")

    kept = snakemake(workdir, "-n", *run, "retry_failed=false", env=env)  # keep failures: nothing to do
    assert kept.returncode == 0 and "Nothing to be done" in kept.stdout + kept.stderr, kept.stderr[-2000:]

    (workdir / "toy-n7-dies").unlink()  # the cause is fixed; the same command again
    measured_n5 = (workdir / "results/cells/toys/toy/n5.json").stat().st_mtime_ns
    second = snakemake(workdir, *run, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "flashwatt: measuring 1 failed cell(s) of suite toys again (1 job_failed;" in second.stderr
    retried = record(workdir, 7)
    assert retried["status"] == "ok" and retried["total"] == 21
    assert retried["previous_failures"] == [{"status": "job_failed", "reason": failed["reason"],
                                             "finished": failed["finished"], "job_id": failed["provenance"]["job_id"],
                                             "host": None}]
    assert (workdir / "results/cells/toys/toy/n5.json").stat().st_mtime_ns == measured_n5  # measured: left alone
    assert pd.read_parquet(workdir / "results/toys/toys.parquet").set_index("n").loc[7, "status"] == "ok"
    again = snakemake(workdir, "-n", *run, env=env)
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]


def test_a_deleted_record_is_measured_again_and_the_table_follows(toys):
    workdir, env = toys
    run = ("--cores", "2", "--config", "suite=toys")
    first = snakemake(workdir, *run, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    (workdir / "results/cells/toys/toy/n5.json").unlink()
    plan = snakemake(workdir, "-n", *run, env=env)  # Snakemake alone said "Nothing to be done" here
    assert "Missing output files: results/cells/toys/toy/n5.json" in plan.stdout, plan.stdout[-3000:]
    stats = plan.stdout.split("Job stats:")[1].split("\n\n")[0]
    assert {line.split()[0]: int(line.split()[1]) for line in stats.splitlines()[3:]} == {
        "toy_cell": 1, "toy_aggregate": 1, "toy_figures": 1, "all": 1, "total": 4}
    second = snakemake(workdir, *run, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert record(workdir, 5)["status"] == "ok" and record(workdir, 5)["provenance"]["job_id"]
    assert sorted(pd.read_parquet(workdir / "results/toys/toys.parquet")["n"]) == [5, 7]


OVERLAY = """
suites:
  mixed:
    description: one cell a CPU runs, one it cannot
    measure: {warmup_ms: 5, min_repeats: 3, min_time_ms: 5}
    grids:
      - kernels: [naive, sdpa_flash]
        precisions: [fp32]
        seq_lens: [16]
        batches: [1]
        heads: [1]
        head_dims: [16]
"""
FLASH = "results/cells/mixed/sdpa_flash/fp32/L16-B1-H1-D16-full-fwd.json"
NAIVE = "results/cells/mixed/naive/fp32/L16-B1-H1-D16-full-fwd.json"


def test_cells_this_host_cannot_run_are_recorded_without_a_job_and_said_up_front(workdir):
    (workdir / "overlay.yaml").write_text(OVERLAY)
    args = ("--configfile", "config/config.yaml", "overlay.yaml", "--config", "suite=mixed")
    # Under Slurm the cells run on GPU nodes: nothing is decided on this GPU-less login node.
    # (--configfile on the command line replaces the profile's list, so it names executor.yaml again)
    slurm = snakemake(workdir, "-n", "--profile", "slurm", "--configfile", "config/config.yaml",
                      "profiles/slurm/executor.yaml", "overlay.yaml", "--config", "suite=mixed")
    assert slurm.returncode == 0 and "skipped_here" not in slurm.stdout, slurm.stderr[-2000:]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    # The two records only (no tables, figures or report to make); the command line's measure
    # settings win over the suite's own (min_repeats 3).
    run = subprocess.run([sys.executable, "-m", "flashwatt.cli", "run", "--cores", "2", NAIVE, FLASH, *args,
                          "measure={min_repeats: 4}"], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    notice = "flashwatt: 1 of 2 cells cannot run here: no CUDA device is visible on this host; they are recorded as " \
             "skipped without a job"
    assert notice in run.stderr and run.stderr.index(notice) < run.stderr.index("Finished jobid")
    skipped = json.loads((workdir / FLASH).read_text())
    assert skipped["status"] == "skipped" and skipped["reason"] == "sdpa_flash needs a CUDA device (running on cpu)"
    assert skipped["provenance"]["job_id"] is None and skipped["provenance"]["skipped_before_submission"]
    assert skipped["device"]["type"] == "cpu" and skipped["settings"]["min_repeats"] == 4
    assert not list((workdir / "results/logs/submitit").glob("*sdpa_flash*"))  # no job was started for it
    measured = json.loads((workdir / NAIVE).read_text())
    assert measured["status"] == "ok" and measured["settings"]["min_repeats"] == 4
    assert "cells by status: 1 ok, 1 skipped" in run.stdout
