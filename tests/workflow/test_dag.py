"""The DAG of every suite builds, bad config stops it with one clear line, lint is clean."""
import re

import pytest

from flashwatt.attention.suite import suite_cells
from flashwatt.config import load_config

from .conftest import REPO, snakemake

pytestmark = pytest.mark.workflow


@pytest.mark.parametrize("suite", ["smoke", "seed", "sweep"])
def test_dry_run_of_every_suite(suite, workdir):
    # A fresh copy of the workflow, so that every cell is still to run and must be planned.
    proc = snakemake(workdir, "-n", "--config", f"suite={suite}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = re.search(r"^cell\s+(\d+)$", proc.stdout, re.M)
    assert jobs, proc.stdout[-2000:]
    assert int(jobs.group(1)) == len(suite_cells(load_config(overrides={"suite": suite}), suite))
    assert f"results/cells/{suite}/" in proc.stdout


def test_auto_without_gpu_is_smoke(workdir):
    proc = snakemake(workdir, "-n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "results/smoke/summary.parquet" in proc.stdout
    assert "results/cells/smoke/" in proc.stdout and "results/cells/seed/" not in proc.stdout


@pytest.mark.parametrize("config, message", [
    (["suite=nope"], "flashwatt: config key suite: unknown suite 'nope'; allowed: auto, smoke, seed, sweep"),
    (["executor=pbs"], "flashwatt: config key executor: 'pbs' is not allowed; allowed: local, slurm, inprocess"),
    (["filter=kernal == 1"], "flashwatt: config key filter"),
])
def test_bad_config_stops_before_any_job(config, message):
    proc = snakemake(REPO, "-n", "--config", *config)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout


def test_lint_is_clean():
    proc = snakemake(REPO, "--lint")
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr, proc.stdout
