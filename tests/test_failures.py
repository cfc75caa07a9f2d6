"""Failed cells (flashwatt.failures): which the next run measures again, and how the reason
of every failure survives the record that replaces it (flashwatt.cell_job)."""
from types import SimpleNamespace

import pytest

from flashwatt import cell_job, failures
from flashwatt.attention.cell import Cell
from flashwatt.job_frame import CellOutcome
from flashwatt.kinds import envelope_of, kind_named
from flashwatt.records import read_record, write_record
from flashwatt.submit.jobs import JobFailed


def test_what_retry_failed_measures_again():
    assert failures.retried_statuses({}) == {"job_failed", "error", "oom"}
    assert failures.retried_statuses({"retry_failed": True}) == {"job_failed", "error", "oom"}
    assert failures.retried_statuses({"retry_failed": False}) == set()
    assert failures.retried_statuses({"retry_failed": ["job_failed"]}) == {"job_failed"}
    assert "ok" not in failures.RETRIABLE and "skipped" not in failures.RETRIABLE


def test_which_statuses_fail_a_run():
    assert [s for s in ("ok", "skipped", "oom", "incorrect", "error", "diverged", "job_failed")
            if failures.is_failure(s)] == ["incorrect", "error", "diverged", "job_failed"]


def test_the_cells_to_retry_are_those_whose_record_has_a_retried_status(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = [Cell("t", "naive", "fp32", n, 1, 1, 16) for n in (16, 32, 64, 128)]
    for cell, status in zip(cells, ("ok", "job_failed", "skipped")):  # the fourth has no record
        record = envelope_of(cell, {})
        record["status"] = status
        write_record(cell.path, record)
    assert failures.to_retry(cells, failures.retried_statuses({})) == {cells[1]: "job_failed"}
    assert failures.to_retry(cells, frozenset()) == {}
    assert failures.history_path(cells[0].path).name == "L16-B1-H1-D16-full-fwd.failures.jsonl"


def _snakemake(tmp_path, cell) -> SimpleNamespace:
    """What Snakemake hands the cell script, as far as cell_job reads it."""
    return SimpleNamespace(log=[str(tmp_path / "cell.log")], params=SimpleNamespace(submitit_folder=str(tmp_path)),
                           config={"executor": "local"}, resources={},
                           output=SimpleNamespace(record=cell.path, trace=cell.trace_path))


def test_a_failure_is_kept_beside_the_record_and_named_by_the_record_that_replaces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kind = kind_named("attention")
    cell = Cell("t", "naive", "fp32", 16, 1, 1, 16)

    def dies(*_args, **_kwargs):
        raise JobFailed("slurm job 42 (fw-t) ended without a result, state NODE_FAIL", job_id="42")

    monkeypatch.setattr(cell_job, "run_job", dies)
    cell_job.submit_and_record(kind, cell, {}, _snakemake(tmp_path, cell))
    failed = read_record(cell.path)
    assert failed["status"] == "job_failed" and "previous_failures" not in failed
    [kept] = failures.history(cell.path)
    assert kept["reason"] == failed["reason"] and kept["provenance"]["job_id"] == "42"

    def measures(*_args, **_kwargs):
        record = envelope_of(cell, {})
        record.update(status="ok", provenance={"job_id": "43", "host": "node7"})
        return CellOutcome(record)

    monkeypatch.setattr(cell_job, "run_job", measures)
    cell_job.submit_and_record(kind, cell, {}, _snakemake(tmp_path, cell))
    measured = read_record(cell.path)
    assert measured["status"] == "ok"
    assert measured["previous_failures"] == [{"status": "job_failed", "reason": kept["reason"],
                                              "finished": kept["finished"], "job_id": "42", "host": None}]
    assert len(failures.history(cell.path)) == 1  # an ok record adds nothing to the history


@pytest.mark.parametrize("status", ["skipped", "ok"])
def test_an_expected_outcome_is_not_a_failure_to_keep(tmp_path, monkeypatch, status):
    monkeypatch.chdir(tmp_path)
    cell = Cell("t", "naive", "fp32", 16, 1, 1, 16)
    record = envelope_of(cell, {})
    record.update(status=status, reason="n/a")
    monkeypatch.setattr(cell_job, "run_job", lambda *_a, **_k: CellOutcome(record))
    cell_job.submit_and_record(kind_named("attention"), cell, {}, _snakemake(tmp_path, cell))
    assert failures.history(cell.path) == []


def test_a_failed_record_is_kept_once_before_a_run_replaces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = Cell("t", "naive", "fp32", 16, 1, 1, 16)
    record = envelope_of(cell, {})
    record.update(status="error", reason="RuntimeError: written before histories were kept", finished="t1")
    write_record(cell.path, record)
    failures.keep_before_rerun(cell.path)
    failures.keep_before_rerun(cell.path)  # twice (a second run before any replaced it): kept once
    assert [f["reason"] for f in failures.history(cell.path)] == ["RuntimeError: written before histories were kept"]
    record.update(status="ok", reason=None)
    write_record(cell.path, record)
    failures.keep_before_rerun(cell.path)  # an ok record is no failure to keep
    assert len(failures.history(cell.path)) == 1
