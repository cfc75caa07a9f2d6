"""The files and job name of any kind of cell, from its patterns and wildcards.

Attention, control and distributed cells each define RECORD_PATTERN, TRACE_PATTERN and
LOG_PATTERN (Snakemake patterns over their wildcards), `wildcards` and `id`; the paths
are formatted here, in one place, so that a rule's outputs and the cell's own idea of
its files cannot drift apart.
"""
from __future__ import annotations


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
