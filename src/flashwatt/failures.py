"""Failed cells: which records count as failed, which of them the next run measures again,
and where the reason of every failure is kept.

A record whose status is a failure stays where it is, so the summary, the report and
`flashwatt failed` show it. The next plain run measures the cell again when its status is
one of those `retry_failed` names (config/README.md): by default a job that died
(`job_failed`), raised (`error`) or ran out of memory (`oom`, which a busy or smaller card
can cause); `retry_failed: false` keeps every failure as it is. Ok cells and skipped cells
are never measured again by this.

Measuring a cell again replaces its record, so every failure is also appended, whole, to
the cell's history (`<record>.failures.jsonl`, beside the record), and the record written
next carries a short list of them (`previous_failures`): why a cell failed is never lost.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from flashwatt.job_frame import EXPECTED_STATUSES, STATUSES
from flashwatt.records import read_record

# What `retry_failed: true` measures again.
RETRIED_BY_DEFAULT = ("job_failed", "error", "oom")
# What `retry_failed` may name: any status but those of a measured or skipped cell.
RETRIABLE = tuple(s for s in STATUSES if s not in ("ok", "skipped"))
HISTORY_SUFFIX = ".failures.jsonl"
# The exit status of a Snakemake run whose jobs all finished but in which a cell of the
# suite failed (workflow/rules/run_outcome.smk); flashwatt.cli reads it as such.
FAILED_CELLS_EXIT = 3


def is_failure(status: str | None) -> bool:
    """A status a run reports as failed (exits non-zero for): not ok, skipped or oom."""
    return status not in EXPECTED_STATUSES


def retried_statuses(config: dict) -> frozenset[str]:
    """The statuses the next plain run measures again, from config key `retry_failed`
    (true: RETRIED_BY_DEFAULT, false: none, or a list of statuses)."""
    setting = config.get("retry_failed", True)
    if setting is True:
        return frozenset(RETRIED_BY_DEFAULT)
    if setting is False:
        return frozenset()
    return frozenset(setting)


def history_path(record_path: str | Path) -> Path:
    """The file beside a record that keeps the cell's failures, one JSON record per line."""
    return Path(str(record_path).removesuffix(".json") + HISTORY_SUFFIX)


def history(record_path: str | Path) -> list[dict]:
    """Every failure recorded for the cell, oldest first (none when it never failed)."""
    path = history_path(record_path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def remember(record_path: str | Path, record: dict) -> None:
    """Append a failed record to the cell's history (whole: reason, traceback, job id)."""
    with open(history_path(record_path), "a") as stream:
        stream.write(json.dumps(record, default=str) + "\n")


def keep_before_rerun(record_path: str | Path) -> None:
    """Make sure the failed record at `record_path` is in its cell's history before a run
    replaces it (a record written before histories were kept, or by hand, is not yet)."""
    try:
        record = read_record(record_path)
    except ValueError:
        return  # nothing readable to keep
    if record.get("status") not in RETRIABLE:
        return
    kept = history(record_path)
    same = ("status", "reason", "started", "finished")
    if not any(all(old.get(key) == record.get(key) for key in same) for old in kept):
        remember(record_path, {k: v for k, v in record.items() if k != "previous_failures"})


def in_brief(failure: dict) -> dict:
    """What a later record says of one earlier failure."""
    provenance = failure.get("provenance") or {}
    return {"status": failure.get("status"), "reason": failure.get("reason"), "finished": failure.get("finished"),
            "job_id": provenance.get("job_id"), "host": provenance.get("host")}


def status_on_disk(record_path: str | Path) -> str | None:
    """The status of the record at `record_path`; None when there is none (or it cannot
    be read: a run rewrites such a record, since the job's output is then incomplete)."""
    path = Path(record_path)
    if not path.exists():
        return None
    try:
        return read_record(path).get("status")
    except ValueError:
        return None


def to_retry(cells: Iterable[Any], statuses: frozenset[str]) -> dict[Any, str]:
    """{cell: status} of the cells whose record on disk has one of `statuses`."""
    if not statuses:
        return {}
    found = {}
    for cell in cells:
        status = status_on_disk(cell.path)
        if status in statuses:
            found[cell] = status
    return found
