"""`snakemake --profile slurm` end to end on the real test cluster: the smoke suite, one
cell rerun, a failed cell recorded, and interrupted runs that leave no job behind."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_jobs import JOB_END_S, time_limit_s
from support import ci_log, copy_workflow, wait_until

from flashwatt.attention.cell import Cell
from flashwatt.attention.suite import suite_cells
from flashwatt.config import load_config
from flashwatt.failures import FAILED_CELLS_EXIT

pytestmark = [pytest.mark.slurm, pytest.mark.workflow, pytest.mark.usefixtures("slurm")]

RUN_LIMIT_S = 600  # every Snakemake below runs under `timeout -s KILL`


def snakemake_cmd(*args: str) -> list[str]:
    return ["timeout", "-s", "KILL", str(RUN_LIMIT_S), sys.executable, "-m", "snakemake", "--profile", "slurm",
            "--config", "suite=smoke", *args]


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "FLASHWATT_POLL_S": "0.5"}
    return subprocess.run(snakemake_cmd(*args), cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=RUN_LIMIT_S + 30)


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()


def job_ids(workdir: Path) -> set[str]:
    """Every Slurm job this working copy submitted, from the cells' logs."""
    ids: set[str] = set()
    for log in (workdir / "results/logs/cells").rglob("*.log"):
        ids.update(re.findall(r"submitted slurm job (\d+)", log.read_text(errors="replace")))
    return ids


def in_queue(ids: set[str]) -> set[str]:
    if not ids:
        return set()
    return set(sh("squeue", "-h", "-o", "%A", "-j", ",".join(sorted(ids))).split())


def states(ids: set[str]) -> dict[str, str]:
    out = sh("sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(sorted(ids)))
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def mine(workdir: Path, squeue_lines: str) -> list[str]:
    """The job ids of `squeue -o "%A %Z"` lines whose jobs were submitted from `workdir`: a
    cell's job name is the same in every copy of the workflow, and other test runs may share
    the cluster."""
    return [job for job, _, folder in (line.partition(" ") for line in squeue_lines.splitlines())
            if Path(folder.strip()).resolve() == workdir.resolve()]


def record(workdir: Path, cell: Cell) -> dict:
    return json.loads((workdir / cell.path).read_text())


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-smoke"))
    started = time.monotonic()
    proc = run(workdir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    ci_log(f"[slurm] smoke suite through Slurm in {time.monotonic() - started:.0f} s")
    report = run(workdir, "--report", "results/smoke/report.html")
    assert report.returncode == 0, report.stderr[-3000:]
    return workdir, suite_cells(load_config(workdir / "config/config.yaml"), "smoke")


def test_smoke_suite_runs_every_cell_as_a_slurm_job(smoke):
    workdir, cells = smoke
    assert (workdir / "results/smoke/summary.parquet").stat().st_size > 0
    assert (workdir / "results/smoke/report.html").stat().st_size > 0
    ids = {}
    for cell in cells:
        rec = record(workdir, cell)
        assert rec["status"] == "ok", (cell.id, rec.get("reason"))
        assert rec["provenance"]["executor"] == "slurm"
        ids[rec["provenance"]["job_id"]] = cell
    assert len(ids) == len(cells) and all(str(j).isdigit() for j in ids)
    final = states(set(ids))
    for job_id, cell in sorted(ids.items(), key=lambda kv: int(kv[0])):
        ci_log(f"[slurm] job {job_id} {cell.job_name} {final.get(job_id)}")
    assert set(final.values()) == {"COMPLETED"}


def test_rerun_of_one_cell_submits_one_new_job(smoke):
    workdir, cells = smoke
    target = cells[2]
    before = {c.path: (workdir / c.path).stat().st_mtime_ns for c in cells}
    old_job = record(workdir, target)["provenance"]["job_id"]
    proc = run(workdir, "-f", target.path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    changed = {c.path for c in cells if (workdir / c.path).stat().st_mtime_ns != before[c.path]}
    assert changed == {target.path}
    new_job = record(workdir, target)["provenance"]["job_id"]
    ci_log(f"[slurm] rerun {target.id}: job {old_job} -> {new_job}")
    assert new_job != old_job and record(workdir, target)["status"] == "ok"


def test_a_cell_whose_job_is_killed_is_recorded_and_the_run_goes_on(smoke):
    workdir, cells = smoke
    victim, survivor = cells[4], cells[5]
    killed: list[str] = []

    run_over = threading.Event()

    def kill_victim() -> None:  # scancel the victim's job as soon as it exists
        while not run_over.is_set() and not killed:
            found = mine(workdir, sh("squeue", "-h", "-n", victim.job_name, "-o", "%A %Z"))
            if found:
                sh("scancel", *found)
                killed.extend(found)
            time.sleep(0.2)

    thread = threading.Thread(target=kill_victim, daemon=True)
    thread.start()
    try:
        proc = run(workdir, "-f", victim.path, survivor.path)
    finally:
        run_over.set()
    thread.join(timeout=30)
    assert killed, "the victim's job was never seen in squeue"
    # The failure is an outcome, not a crash: the run goes on, then exits with the status
    # of a finished run with failed cells.
    assert proc.returncode == FAILED_CELLS_EXIT, proc.stderr[-3000:]
    failed, ok = record(workdir, victim), record(workdir, survivor)
    ci_log(f"[slurm] job {killed[0]} {victim.job_name} {states(set(killed)).get(killed[0])} -> status {failed['status']}")
    assert failed["status"] == "job_failed" and failed["provenance"]["job_id"] == killed[0]
    assert "CANCELLED" in failed["reason"]
    assert ok["status"] == "ok"


# Smoke cells finish in about a second, so a signal sent after one is seen RUNNING could
# arrive when every job has already completed. The interrupted runs warm up for a minute:
# their jobs are certainly still running when the signal comes, and one that ends before
# then was cancelled. (Not longer: after Ctrl-C Snakemake still runs the cells it had
# queued, a warm-up each, before it exits.)
SLOW_CELLS = "suites:\n  smoke:\n    measure: {warmup_ms: 60000}\n"


def drained(ids: set[str], what: str) -> None:
    """Wait until none of `ids` is in the queue: bounded by the jobs' own time limit (Slurm
    ends them by then), so a slow machine takes longer but cannot fail the wait."""
    if ids:
        limit = max(time_limit_s(j) for j in ids) + JOB_END_S
        wait_until(lambda: not in_queue(ids), limit, what, step=0.5)


def _start_forced_run(workdir: Path) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "FLASHWATT_POLL_S": "0.5"}
    (workdir / "slow-cells.yaml").write_text(SLOW_CELLS)
    # --configfile on the command line replaces the profile's list, so it names executor.yaml again.
    cmd = snakemake_cmd("-F", "--configfile", "config/config.yaml", "profiles/slurm/executor.yaml", "slow-cells.yaml")
    # Its own session, like a terminal's foreground job: a signal to the group reaches every cell.
    return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_for_running_job(workdir: Path, launcher: subprocess.Popen) -> None:
    """Until a cell's job runs; fails at once if Snakemake ends first (it runs under a limit)."""
    def running() -> bool:
        if any(s == "RUNNING" for s in _queue_states(workdir)):
            return True
        assert launcher.poll() is None, f"Snakemake ended ({launcher.returncode}) before any cell's job ran"
        return False

    wait_until(running, RUN_LIMIT_S, "a cell's job to run", step=0.5)


def _queue_states(workdir: Path) -> list[str]:
    ids = job_ids(workdir)
    return sh("squeue", "-h", "-o", "%T", "-j", ",".join(sorted(ids))).split() if ids else []


def _snakemake_pid(launcher: subprocess.Popen) -> int:
    """The Snakemake process under `timeout`."""
    children = sh("pgrep", "-P", str(launcher.pid)).split()
    assert children, "Snakemake did not start"
    return int(children[0])


def test_ctrl_c_cancels_running_cells_and_leaves_nothing_in_squeue(tmp_path):
    workdir = copy_workflow(tmp_path)
    launcher = _start_forced_run(workdir)
    try:
        _wait_for_running_job(workdir, launcher)
        queued = in_queue(job_ids(workdir))
        os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        launcher.wait(timeout=240)  # Snakemake still runs the cells it had queued, then exits
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    ids = job_ids(workdir)
    drained(ids, "the queue to drain")
    final = states(ids)
    ci_log(f"[slurm] after Ctrl-C: {sorted(final.items(), key=lambda kv: int(kv[0]))}")
    # Every job queued or running when Ctrl-C came was cancelled, none ran on to the end.
    assert queued and all(final[j].startswith("CANCELLED") for j in queued), (queued, final)
    assert launcher.returncode != 0


def test_snakemake_killed_outright_leaves_nothing_in_squeue(tmp_path):
    workdir = copy_workflow(tmp_path)
    launcher = _start_forced_run(workdir)
    try:
        _wait_for_running_job(workdir, launcher)
        os.kill(_snakemake_pid(launcher), signal.SIGKILL)  # OOM killer, kill -9: no chance to clean up
        killed_at = time.monotonic()
        ids = wait_until(lambda: job_ids(workdir), 30, "job ids")
        drained(ids, "the orphaned cells to cancel their jobs")
        ci_log(f"[slurm] queue empty {time.monotonic() - killed_at:.1f} s after Snakemake was killed")
    finally:
        time.sleep(2)
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    logs = "".join(p.read_text(errors="replace") for p in (workdir / "results/logs/cells").rglob("*.log"))
    assert "interrupted (Snakemake is gone)" in logs
    assert not in_queue(job_ids(workdir) | ids)
    # Cancelled by the orphaned cells, not left to end on their own (their warm-up is minutes).
    final = states(ids)
    assert ids and all(final[j].startswith("CANCELLED") for j in ids), final


# One cell of the smoke suite (bare Snakemake strips a --config value's closing quote, so
# the filter ends in a digit).
ONE_CELL = "filter=not causal and kernel == 'naive' and seq_len == 32"


def test_a_misplaced_run_exits_nonzero_and_the_same_command_fixed_measures_the_cell_again(tmp_path):
    """A cluster user's wrong partition: every cell's submission fails. The run records why,
    makes the summary, and exits non-zero; fixed, the same command measures the cell again."""
    workdir = copy_workflow(tmp_path)
    misplaced = run(workdir, ONE_CELL, "--set-resources", "cell:slurm_partition=nope")
    assert misplaced.returncode == FAILED_CELLS_EXIT, misplaced.stdout[-2000:] + misplaced.stderr[-4000:]
    assert "flashwatt: 1 of 1 cells of suite smoke failed (1 job_failed)" in misplaced.stderr
    cell = Cell("smoke", "naive", "fp32", 32, 2, 2, 16)
    failed = record(workdir, cell)
    ci_log(f"[slurm] wrong partition -> {failed['status']}: {failed['reason'].splitlines()[0]}")
    assert failed["status"] == "job_failed" and "nope" in failed["reason"]
    import pandas as pd

    summary = pd.read_parquet(workdir / "results/smoke/summary.parquet")
    assert list(summary["status"]) == ["job_failed"]  # the summary was made before the exit
    fixed = run(workdir, ONE_CELL)  # the profile's own partition
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-4000:]
    measured = record(workdir, cell)
    assert measured["status"] == "ok" and measured["provenance"]["executor"] == "slurm"
    assert [f["status"] for f in measured["previous_failures"]] == ["job_failed"]
    assert list(pd.read_parquet(workdir / "results/smoke/summary.parquet")["status"]) == ["ok"]
