"""What a new user and a cluster user do, end to end from a copy of the workflow: Ctrl-C
and rerun, an overlay suite, an empty slice, a failed cell, the Slurm profile's plan."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashwatt.attention.cell import Cell
from flashwatt.records import write_record
from support import copy_workflow, wait_until

from .conftest import snakemake

pytestmark = pytest.mark.workflow

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
OVERLAY = """
suites:
  mini:
    description: two CPU cells
    measure: {warmup_ms: 5, min_repeats: 3, min_time_ms: 5}
    grids:
      - kernels: [naive]
        precisions: [fp32]
        seq_lens: [16, 32]
        batches: [1]
        heads: [1]
        head_dims: [16]
"""


def flashwatt(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashwatt.cli", *args], cwd=workdir, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def outputs(workdir: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted((workdir / "results").rglob("*")) if p.is_file()
            and "logs" not in p.parts}


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A copy of the workflow with an overlay defining suite `mini`, run once."""
    workdir = copy_workflow(tmp_path_factory.mktemp("mini"))
    (workdir / "overlay.yaml").write_text(OVERLAY)
    args = ("run", "--cores", "2", "--configfile", "config/config.yaml", "overlay.yaml", "--config", "suite=mini")
    proc = flashwatt(workdir, *args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return workdir, args, proc


def test_overlay_suite_report_lands_in_its_own_folder(mini):
    workdir, _, proc = mini
    assert "flashwatt: suite mini, 2 cells" in proc.stdout
    assert (workdir / "results/mini/report.html").exists()
    assert not (workdir / "results/smoke").exists()  # nothing written under another suite's name
    assert "cells by status: 2 ok" in proc.stdout and "results/mini/flagged.csv" in proc.stdout


def test_filter_selecting_nothing_is_refused_and_nothing_changes(mini):
    workdir, args, _ = mini
    before = outputs(workdir)
    for query in ("seq_len > 100000", 'kernel == "nope"'):
        proc = flashwatt(workdir, *args, f"filter={query}")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"config key filter: {query!r} selects none of the 2 cells" in proc.stderr
        assert "columns: kernel, precision, seq_len" in proc.stderr
    # Bare Snakemake refuses it too (the check is in the workflow). Snakemake itself strips a
    # --config value's closing quote, so this one ends in a digit; the wrapper passes both intact.
    bare = snakemake(workdir, "-n", "--configfile", "config/config.yaml", "overlay.yaml", "--config",
                     "suite=mini", "filter=seq_len > 100000")
    assert bare.returncode != 0 and "selects none of the 2 cells" in bare.stdout + bare.stderr
    assert outputs(workdir) == before


# Heavy: three runs of the CLI; tests/workflow/test_failed_cells.py fails a cell, exits with
# FAILED_CELLS_EXIT and measures it again in the next run in `make test`.
@pytest.mark.heavy
def test_a_failed_cell_gives_a_nonzero_exit_and_the_counts_then_the_next_run_measures_it_again(mini):
    workdir, args, _ = mini
    cell = Cell("mini", "naive", "fp32", 16, 1, 1, 16)
    record = json.loads((workdir / cell.path).read_text())
    record.update(status="error", reason="RuntimeError: planted failure")
    write_record(workdir / cell.path, record)
    kept = (*args, "retry_failed=false")  # keep the failure: nothing runs, the counts say it
    proc = flashwatt(workdir, *kept)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cells by status: 1 error, 1 ok" in proc.stdout
    assert "1 cell(s) ended error, incorrect, diverged or job_failed" in proc.stderr
    assert flashwatt(workdir, *kept, "--accept-failed-cells").returncode == 0
    retried = flashwatt(workdir, *args)  # the plain command measures it again
    assert retried.returncode == 0, retried.stdout[-2000:] + retried.stderr[-2000:]
    assert "cells by status: 2 ok" in retried.stdout
    measured = json.loads((workdir / cell.path).read_text())
    assert measured["status"] == "ok"
    # the planted record was no job's, yet its reason is kept beside the cell and named in the new record
    assert [f["reason"] for f in measured["previous_failures"]] == ["RuntimeError: planted failure"]


def test_ctrl_c_then_rerun_without_unlock(tmp_path):
    workdir = copy_workflow(tmp_path)
    # two cells on one core: the interrupt lands while the first is measured (3 s), the second waiting
    (workdir / "overlay.yaml").write_text(OVERLAY.replace("min_time_ms: 5", "min_time_ms: 3000"))
    args = ["run", "--cores", "1", "--configfile", "config/config.yaml", "overlay.yaml", "--config", "suite=mini"]
    proc = subprocess.Popen([sys.executable, "-m", "flashwatt.cli", *args], cwd=workdir, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    # Interrupt while a cell is being measured, as a terminal's Ctrl-C does (the whole group).
    wait_until(lambda: list((workdir / "results/logs/submitit").glob("*/*_0_log.out")), 120, "a cell to start")
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "flashwatt: interrupted (SIGINT)" in err
    # One line, not the tracebacks of every interrupted process (Snakemake's jobs, submitit's
    # controllers, the cells' jobs, their logs): the run's output stops at the interrupt.
    assert err.rstrip().splitlines()[-1].startswith("flashwatt: interrupted (SIGINT); Snakemake stopped its jobs")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert not list((workdir / ".snakemake/locks").glob("*")), "Snakemake left its lock"
    rerun = flashwatt(workdir, *args[:-2], "--config", "suite=mini", "measure={min_time_ms: 5}")
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert "cells by status: 2 ok" in rerun.stdout


def test_slurm_profile_plans_the_gpu_suite_on_a_gpu_less_host(workdir):
    proc = snakemake(workdir, "-n", "--profile", "slurm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "results/cells/seed/" in proc.stdout and "results/cells/smoke/" not in proc.stdout
    counts = dict(line.split() for line in proc.stdout.splitlines() if line.startswith("cell "))
    from flashwatt.attention.suite import suite_cells
    from flashwatt.config import load_config

    assert int(counts["cell"]) == len(suite_cells(load_config(workdir / "config/config.yaml"), "seed")) == 58


def test_misspelt_cell_resource_is_refused_before_any_job(workdir):
    proc = snakemake(workdir, "-n", "--profile", "slurm", "--set-resources", "cell:slurm_acount=myproj")
    assert proc.returncode != 0
    assert "unknown resource(s) for rule cell: slurm_acount; known: account" in proc.stdout + proc.stderr
    ok = snakemake(workdir, "-n", "--profile", "slurm", "--set-resources", "cell:slurm_account=myproj")
    assert ok.returncode == 0, ok.stderr[-2000:]


CONTROL_OVERLAY = """
suites:
  ctl:
    description: the scheduler's runs on a host without a GPU
    control:
      runs:
        - {mode: budget, budgets_w: [450]}
        - {mode: energy}
"""


# Heavy: `make test` keeps cells this host cannot run recorded without a job and counted
# (tests/workflow/test_failed_cells.py), a control cell skipped without a GPU with its reason,
# and the control kind's tables and figures (tests/test_control_pipeline.py).
@pytest.mark.heavy
def test_control_suite_without_a_gpu_records_why_and_still_reports(tmp_path):
    """A user trying the control suite on a laptop: every control cell says why it did not
    run, the tables and figures are made (saying there is nothing to draw), the report too."""
    import pandas as pd

    workdir = copy_workflow(tmp_path)
    (workdir / "overlay.yaml").write_text(CONTROL_OVERLAY)
    proc = flashwatt(workdir, "run", "--cores", "2", "--configfile", "config/config.yaml", "overlay.yaml",
                     "--config", "suite=ctl")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "flashwatt: suite ctl, 3 cells" in proc.stdout
    assert "cells by status: 3 skipped" in proc.stdout
    assert "controlled runs against their oracle: " in proc.stdout and "flagged.csv" not in proc.stdout
    runs = pd.read_parquet(workdir / "results/ctl/control.parquet")
    assert sorted(runs["scenario"]) == ["budget-450w", "energy"]
    assert set(runs["status"]) == {"skipped"} and runs["reason"].str.contains("CUDA GPU").all()
    assert set(runs["device_type"]) == {"cpu"}
    for name in ("control_power", "control_pareto", "control_energy"):
        assert (workdir / f"figures/ctl/{name}.pdf").stat().st_size > 0
    report = (workdir / "results/ctl/report.html")
    assert report.exists()
    assert "WARNING/2" not in proc.stdout + proc.stderr  # every caption renders as reStructuredText
    assert not (workdir / "results/ctl/summary.parquet").exists()  # no attention cells, no summary


DISTRIBUTED_OVERLAY = """
suites:
  dist:
    description: two distributed cells on CPU processes
    distributed:
      repeats: 2
      warmup: 1
      grids:
        - strategies: [zigzag, ulysses]
          gpus: [2]
          blocks: [math]
          precisions: [fp64]
          seq_lens: [16]
          batches: [1]
          heads: [2]
          kv_heads: [2]
          head_dims: [8]
          causal: [true]
          passes: [fwd_bwd]
        - strategies: [ring]
          gpus: [2]
          blocks: [flash]
          precisions: [bf16]
          seq_lens: [16]
          batches: [1]
          heads: [2]
          kv_heads: [2]
          head_dims: [8]
"""


# Heavy: a workflow run of two-rank cells, each rank importing torch; `make test` keeps
# two-rank jobs through submitit's local executor (tests/distributed/test_job_cpu.py,
# test_rank_faults.py) and the workflow's rules for a kind (the other tests here).
@pytest.mark.heavy
def test_distributed_cells_run_as_one_job_supervising_a_process_per_gpu(tmp_path):
    """Two-rank cells through submitit's local executor (one task supervising two processes
    that meet over gloo; each record says how every rank ended),
    checked against float64, in the suite's table, figures and report; a GPU precision on
    a host without one is recorded as skipped."""
    import pandas as pd

    workdir = copy_workflow(tmp_path)
    (workdir / "overlay.yaml").write_text(DISTRIBUTED_OVERLAY)
    proc = flashwatt(workdir, "run", "--cores", "2", "--configfile", "config/config.yaml", "overlay.yaml",
                     "--config", "suite=dist")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "flashwatt: suite dist, 3 cells" in proc.stdout and "cells by status: 2 ok, 1 skipped" in proc.stdout
    table = pd.read_parquet(workdir / "results/dist/distributed.parquet").set_index("strategy")
    for strategy in ("zigzag", "ulysses"):
        row = table.loc[strategy]
        assert row["status"] == "ok" and row["world_size"] == 2 and bool(row["check_passed"])
        assert row["error_dq"] < 1e-12 and row["total_ms"] > 0 and row["speedup"] > 0
        record = json.loads((workdir / f"results/cells/dist/distributed/{strategy}-math/fp64/"
                             "G2-L16-B1-H2-K2-D8-causal-fwd_bwd.json").read_text())
        assert [r["state"] for r in record["ranks"]["per_rank"]] == ["ok", "ok"]
    assert table.loc["ring", "status"] == "skipped" and "no CUDA device" in table.loc["ring", "reason"]
    for name in ("distributed_scaling", "distributed_memory", "distributed_time", "distributed_error",
                 "distributed_energy"):
        assert (workdir / f"figures/dist/{name}.pdf").stat().st_size > 0
    assert (workdir / "results/dist/report.html").exists()
    assert "WARNING/2" not in proc.stdout + proc.stderr
