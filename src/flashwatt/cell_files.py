"""The files and job name of any kind of cell, from its patterns and wildcards.

Every kind of cell (attention, control, distributed, model, training run) takes its
RECORD_PATTERN, TRACE_PATTERN and LOG_PATTERN (Snakemake patterns over its wildcards) from
`file_patterns` and defines `wildcards` and `id`; the paths are formatted here, in one
place, so that a rule's outputs and the cell's own idea of its files cannot drift apart.
"""
from __future__ import annotations

import functools
import re
from pathlib import PurePosixPath

RESULTS_ROOT = "results/cells"
LOGS_ROOT = "results/logs/cells"
RECORD_SUFFIX, TRACE_SUFFIX, LOG_SUFFIX = ".json", ".trace.parquet", ".log"


def file_patterns(where: str) -> tuple[str, str, str]:
    """The record, trace and log patterns of a kind of cell whose files sit at `where`
    (e.g. "/{suite}/model/{mmodel}/..."; Snakemake wildcards) under the results and the
    logs roots."""
    return (RESULTS_ROOT + where + RECORD_SUFFIX, RESULTS_ROOT + where + TRACE_SUFFIX, LOGS_ROOT + where + LOG_SUFFIX)


class CellFiles:
    RECORD_PATTERN: str
    TRACE_PATTERN: str
    LOG_PATTERN: str
    # What each wildcard of the record pattern may match (the suite's is shared by every kind).
    WILDCARD_CONSTRAINTS: dict[str, str]

    @property
    def path(self) -> str:
        """The cell's result record, relative to the workflow directory."""
        return self.RECORD_PATTERN.format(**self.wildcards)

    @property
    def trace_path(self) -> str:
        """Its telemetry trace (Parquet), beside the record."""
        return self.TRACE_PATTERN.format(**self.wildcards)

    @property
    def log_path(self) -> str:
        return self.LOG_PATTERN.format(**self.wildcards)

    @property
    def job_name(self) -> str:
        return "fw-" + self.id.replace("/", "-")

    @classmethod
    def from_path(cls, path: str):
        """The cell whose record `path` is, wherever the results folder was moved to (the
        path may be absolute or relative); ValueError when it is not one. Read from the
        record pattern and its wildcard constraints, so `from_path(cell.path) == cell`."""
        match = _record_regex(cls).search(PurePosixPath(str(path)).as_posix())
        if match is None:
            raise ValueError(f"{str(path)!r} is not a {cls.__name__} record (expected {cls.RECORD_PATTERN})")
        return cls.from_wildcards(**match.groupdict())

    @classmethod
    def trace_of(cls, record_path: str) -> str:
        """The trace file beside a record, wherever the results folder was moved."""
        cls.from_path(record_path)  # refuse anything that is not a record of this kind
        return str(record_path)[: -len(RECORD_SUFFIX)] + TRACE_SUFFIX


# What a suite name may be, in every kind's paths.
SUITE_RE = "[a-z0-9_]+"


@functools.cache
def _record_regex(cls) -> re.Pattern:
    """The record pattern as a regex: each {wildcard} its constraint (none may span a folder)."""
    constraints = {"suite": SUITE_RE, **cls.WILDCARD_CONSTRAINTS}
    out, last = "", 0
    for field in re.finditer(r"{(\w+)}", cls.RECORD_PATTERN):
        out += re.escape(cls.RECORD_PATTERN[last:field.start()])
        out += f"(?P<{field[1]}>(?:{constraints.get(field[1], '[^/]+')}))"
        last = field.end()
    out += re.escape(cls.RECORD_PATTERN[last:])
    return re.compile(f"(?:^|/){out}$")
