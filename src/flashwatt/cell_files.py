"""The files and job name of any kind of cell, from its patterns and wildcards.

Every kind of cell (attention, control, distributed, model, training run) takes its
RECORD_PATTERN, TRACE_PATTERN and LOG_PATTERN (Snakemake patterns over its wildcards) from
`file_patterns` and defines `wildcards` and `id`; the paths are formatted here, in one
place, so that a rule's outputs and the cell's own idea of its files cannot drift apart.
"""
from __future__ import annotations

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


def record_wildcards(path: str, root: str, folder: str, dirs: int, suffix: str) -> tuple[str, ...] | None:
    """(suite, the `dirs` folders, the name) of a record path `<root>/<suite>/<folder>/<dirs
    folders>/<name><suffix>`, anywhere inside `path` (absolute or relative); None when it is
    not one. What each kind's `from_path` reads its wildcards from."""
    parts = PurePosixPath(str(path)).parts
    base = PurePosixPath(root).parts
    n = len(base)
    for i in range(len(parts) - n - dirs - 2):
        if parts[i:i + n] == base and parts[i + n + 1] == folder:
            suite, *middle, leaf = parts[i + n:i + n + dirs + 3]
            if leaf.endswith(suffix) and len(parts) == i + n + dirs + 3:
                return (suite, *middle[1:], leaf[:-len(suffix)])
    return None
