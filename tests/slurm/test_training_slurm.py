"""A training cell on a real Slurm, preempted mid-run: Slurm's USR2 requeues the job
(submitit), the requeued job resumes from the run's checkpoint, and the record it returns
has the curve of an unbroken run, every evaluation once."""
from __future__ import annotations

import copy
import json
import re
import threading
import uuid

import pytest

from slurm_jobs import join_waiter, release_requeued, sh, wait_while_job_lives
from support import ci_log, synthetic_corpus, wait_until

from flashwatt.config import load_config
from flashwatt.models.presets import model_spec
from flashwatt.submit.jobs import run_job
from flashwatt.training.cell import TrainCell
from flashwatt.training.data import prepare_data
from flashwatt.training.job import run_train_cell
from flashwatt.training.suite import training_runs, training_section

# Heavy: two training runs of 240 steps and a requeue (about 2 min). `make test` keeps USR2's
# requeue on Slurm (test_submit_slurm.py) and a killed run's resume
# (tests/test_training_cells.py).
pytestmark = [pytest.mark.slurm, pytest.mark.heavy, pytest.mark.usefixtures("slurm", "fast_wait")]


def test_a_preempted_training_job_resumes_where_it_stopped(tmp_path):
    config = load_config()
    config["suites"]["training_smoke"]["training"]["data"]["corpus"] = str(synthetic_corpus(tmp_path / "corpus"))
    section = training_section(config, "training_smoke")
    section["cache"] = str(tmp_path / "cache")
    manifest = tmp_path / "data.json"
    prepare_data(section, "training_smoke", manifest)
    cell = TrainCell("training_smoke", "llama_tiny", "sdpa_default", "fp32", "adamw", "cosine", 3e-3, 0.0, 0.1, 4,
                     64, 4 * 64 * 240, 0)
    spec = copy.deepcopy(next(iter(training_runs(config, "training_smoke").values())))
    spec.update(data=str(manifest), cache=section["cache"], model=model_spec("llama_tiny"),
                evaluation={"evals": 24, "validation_windows": 4}, checkpoint_every_s=0.0)

    log = tmp_path / "train.log"
    outcome: dict = {}

    # A time limit far past what the run takes on a loaded machine (minutes): Slurm's own
    # USR2 before the limit would requeue the job a second time (seen at 5 s a step under
    # load with a 10 min limit). The waits below are bounded by it.
    def wait() -> None:
        try:
            outcome["record"] = run_job(run_train_cell, cell, spec, job_name=f"fw-test-train-{uuid.uuid4().hex[:6]}",
                                        folder=tmp_path / "jobs", executor="slurm",
                                        resources={"slurm_partition": "cpu", "runtime": 60}, log_path=log).record
        except BaseException as error:  # surfaced by the asserts
            outcome["error"] = error

    thread = threading.Thread(target=wait)
    thread.start()

    def submitted() -> str:
        match = re.search(r"submitted slurm job (\d+)", log.read_text() if log.exists() else "")
        if not match and not thread.is_alive():
            raise AssertionError(f"run_job ended before submitting: {outcome}")
        return match.group(1) if match else ""

    job_id = wait_until(submitted, 120, "the submission")
    progress = tmp_path / "cache" / "checkpoints" / cell.id / "progress.json"
    wait_while_job_lives(job_id, lambda: progress.is_file() and json.loads(progress.read_text())["step"] >= 60,
                         "the run to pass step 60")
    # What Slurm sends before a time limit or on preemption; then skip the hold of a requeued job.
    sh("scancel", "--signal=USR2", job_id)
    release_requeued(job_id)
    join_waiter(thread, job_id)
    assert "error" not in outcome, outcome.get("error")
    record = outcome["record"]
    ci_log(f"[slurm] training job {job_id}: {record['status']}, resumes {record.get('resumes')}")
    assert record["status"] == "ok", record.get("traceback") or record.get("reason")
    [resume] = record["resumes"]
    assert 60 <= resume["at_step"] < cell.steps
    assert record["provenance"]["restarts"] == 1

    unbroken = run_train_cell(cell, {**spec, "cache": str(tmp_path / "cache-unbroken")}).record
    assert [r["step"] for r in record["curve"]] == [r["step"] for r in unbroken["curve"]]
    for a, b in zip(record["curve"], unbroken["curve"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6, abs=1e-6)
