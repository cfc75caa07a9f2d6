"""The files and job name of any kind of cell, from its patterns and wildcards.

Attention, control and distributed cells each define RECORD_PATTERN, TRACE_PATTERN and
LOG_PATTERN (Snakemake patterns over their wildcards), `wildcards` and `id`; the paths
are formatted here, in one place, so that a rule's outputs and the cell's own idea of
its files cannot drift apart.
"""
from __future__ import annotations

from pathlib import PurePosixPath


class CellFiles:
    RECORD_PATTERN: str
    TRACE_PATTERN: str
    LOG_PATTERN: str

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
