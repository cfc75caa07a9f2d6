"""The one frame every kind's job runs in: the envelope, and each outcome that is not the
measurement's own, whatever the kind."""
import json

import pytest

from flashwatt.attention.cell import Cell
from flashwatt.control.cell import ControlCell
from flashwatt.job_frame import STATUSES, CellSkipped, job_failed, run_in_frame
from flashwatt.kernels.base import UnsupportedCell
from flashwatt.kinds import all_kinds, envelope_of, kind_of
from flashwatt.records import SCHEMA_VERSION, read_record, write_record

CELL = Cell("t", "naive", "fp32", 8, 1, 1, 16)


def test_the_envelope_names_kind_schema_cell_and_spec():
    record = run_in_frame("attention", CELL, {"seed": 3}, lambda job: job.record.update(status="ok"),
                          spec_field="settings").record
    assert record["schema_version"] == SCHEMA_VERSION == 2 and record["kind"] == "attention"
    assert record["cell"] == CELL.as_row() and record["settings"] == {"seed": 3} and record["status"] == "ok"
    assert record["provenance"]["host"] and record["finished"] >= record["started"] and record["duration_s"] >= 0


@pytest.mark.parametrize("refusal", [CellSkipped("no GPU here"), UnsupportedCell("no GPU here")])
def test_a_refusal_is_a_skipped_record_with_its_reason(refusal):
    def body(job):
        raise refusal

    record = run_in_frame("attention", CELL, {}, body).record
    assert record["status"] == "skipped" and record["reason"] == "no GPU here" and "traceback" not in record


def test_running_out_of_memory_names_the_stage():
    def body(job):
        job.stages.enter("timed steps")
        raise MemoryError("can't allocate memory")

    record = run_in_frame("model", CELL, {}, body, first_stage="startup").record
    assert record["status"] == "oom" and record["oom_stage"] == "timed steps"
    assert record["reason"].startswith("out of memory during timed steps")
    assert set(record["stages_s"]) == {"startup", "timed steps"}


def test_anything_else_is_an_error_with_its_traceback():
    def body(job):
        raise KeyError("missing")

    record = run_in_frame("control", ControlCell("t", mode="energy"), {}, body).record
    assert record["status"] == "error" and record["reason"] == "KeyError: 'missing'"
    assert "raise KeyError" in record["traceback"]


def test_a_rank_other_than_zero_returns_nothing():
    def body(job):
        job.rank_zero = False
        return [{"t": 1}]

    assert run_in_frame("distributed", CELL, {}, body) is None


def test_every_kind_starts_its_records_from_the_same_envelope():
    for kind in all_kinds():
        assert kind_of(kind.cell.__new__(kind.cell)) is kind
    record = job_failed(envelope_of(ControlCell("t", mode="energy"), {"seconds": 2.0}), "killed", "42")
    assert record["kind"] == "control" and record["spec"] == {"seconds": 2.0}
    assert record["status"] == "job_failed" in STATUSES and record["provenance"] == {"job_id": "42"}


def test_records_of_the_previous_schema_are_read_and_newer_ones_refused(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 1, "cell": CELL.as_row(), "status": "ok"}))
    assert read_record(old)["kind"] == "attention"
    new = tmp_path / "new.json"
    write_record(new, {"schema_version": SCHEMA_VERSION + 1, "kind": "attention"})
    with pytest.raises(ValueError, match=rf"{new}.*schema version 3.*snakemake -f {new}"):
        read_record(new)
