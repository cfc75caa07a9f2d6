"""The DAG of every suite builds, bad config stops it with one clear line, lint is clean."""
import re

import pytest

from flashwatt.attention.suite import suite_cells
from flashwatt.config import load_config

from .conftest import REPO, snakemake

pytestmark = pytest.mark.workflow


# The sweep's plan (hundreds of cells) is the heavy tier's: smoke and seed go through the same
# planning in `make test`.
@pytest.mark.parametrize("suite", ["smoke", "seed", pytest.param("sweep", marks=pytest.mark.heavy)])
def test_dry_run_of_every_suite(suite, workdir):
    # A fresh copy of the workflow, so that every cell is still to run and must be planned.
    proc = snakemake(workdir, "-n", "--config", f"suite={suite}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = suite_cells(load_config(overrides={"suite": suite}), suite)
    # Each record is an output of the plan: of a cell job, or, for the cells this GPU-less
    # host cannot run, of the one job that records them skipped.
    outputs = [path for line in proc.stdout.splitlines() if line.strip().startswith("output:")
               for path in line.split(":", 1)[1].strip().split(", ") if path.endswith(".json")]
    assert sorted(outputs) == sorted(cell.path for cell in cells)
    jobs = re.search(r"^cell\s+(\d+)$", proc.stdout, re.M)
    assert jobs, proc.stdout[-2000:]
    runnable = [c for c in cells if c.kernel in ("naive", "sdpa_math") and c.precision == "fp32"]
    assert int(jobs.group(1)) == len(runnable)
    assert bool(re.search(r"^skipped_here\s+1$", proc.stdout, re.M)) == (len(runnable) < len(cells))


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
