"""A kind of cell, defined in one place: what every part of flashwatt needs to know of it.

flashwatt measures several kinds of cell (an attention call, a controlled run, attention
across GPUs, a whole model's step, a training run). Each kind's package declares one
`Kind` in its `kind.py`, and `flashwatt.kinds` lists them; planning, validation, the
config schema, the workflow's rules, the tables, the figures, the report and the CLI
loop over that list, so a kind added there is planned, run, tabled, drawn and counted
with no other edit (docs/architecture.md, "How to add a kind").

Torch-free: the DAG is built on login nodes. What needs torch or pandas (the job, the
tables, the figures) is named as "module:function" and imported where it runs.
"""
from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Mapping

import yaml

from flashwatt.job_frame import envelope


def resolve(target: str) -> Callable:
    """The function a "package.module:function" string names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class TableFile:
    """One file of a kind's tables, results/<suite>/<name>."""

    key: str                     # the table rule's output name (what the writer and the figures read)
    name: str                    # file name under results/<suite>/
    caption: str | None = None   # caption file under workflow/report/ when the report shows the file
    label: str | None = None     # the report's label for it
    about: str | None = None     # what the CLI says of it after a run ("cells to look at")

    def path(self, suite: str) -> str:
        return f"results/{suite}/{self.name}"


@dataclass(frozen=True)
class CompareMetric:
    """A quantity `flashwatt compare` takes the ratio of, between two runs of the same cells."""

    name: str     # what a user calls it (`--fail-if latency:+5%`); shared by kinds where it means the same
    column: str   # its column in the kind's compared table
    better: str   # "lower" or "higher"
    label: str    # what the report calls it, with its unit
    # "module:function": samples(record) -> the cell's own repeats of the value (a timed
    # step's latency, say), which the interval is drawn from when a side has one run
    samples: str | None = None
    heat_map: bool = True  # drawn as a ratio heat map by shape (every metric is in the tables and bars)

    def __post_init__(self):
        if self.better not in ("lower", "higher"):
            raise ValueError(f"metric {self.name}: better must be 'lower' or 'higher', not {self.better!r}")


@dataclass(frozen=True)
class Kind:
    """Everything flashwatt needs to plan, run, table, draw and report one kind of cell."""

    name: str          # the record's `kind`
    section: str       # the key of a suite that holds this kind's cells (config/README.md)
    cell: type         # frozen dataclass: RECORD_PATTERN, TRACE_PATTERN, LOG_PATTERN,
                       # WILDCARD_CONSTRAINTS, from_wildcards, from_path, path, id, as_row
    plan: Callable[[dict, str], dict]  # plan(config, suite) -> {cell: spec}, in order; raises
                                       # ConfigError naming the key of a bad value
    job: str           # "module:function": job(cell, spec) -> CellOutcome (None on ranks > 0)
    tables: tuple[TableFile, ...]
    write_tables: str  # "module:function": write(records, outputs: {key: path}) -> status counts text
    # filter(cells, query, suite) -> the cells a `filter` query keeps (ConfigError when none);
    # a kind without one runs every cell whatever the filter
    filter: Callable[[list, str, str], list] | None = None
    # name -> flashwatt.figure_base.FigureSpec: each drawn from the tables its source names
    figures: Mapping[str, Any] = field(default_factory=dict)
    schema: str | dict | None = None  # the section's JSON schema: a YAML file, package data beside
                                      # the kind, or the schema itself
    fill_schema: Callable[[dict], None] | None = None  # fills the section's enums from the code's names
    report: str | None = None  # report text (reStructuredText) of the method, package data
    report_values: str | None = None  # "module:function": values(suite) -> {name: text} for the report's {name}s
    figure_caption: str = "figure.rst"  # caption file of the kind's figures under workflow/report/
    rule_prefix: str = ""      # rules <prefix>cell, <prefix>aggregate, <prefix>figure
    runtime_min: int = 30      # a cell job's time limit (Slurm), minutes
    spec_field: str = "spec"   # where the record keeps the cell's spec
    cell_inputs: Mapping[str, str] = field(default_factory=dict)  # more inputs of the cell rule (patterns)
    rules: str | None = None   # a Snakemake file of the kind's other rules (those making cell_inputs),
                               # relative to workflow/rules/ or absolute
    # What `flashwatt compare` (flashwatt.compare) reads and joins: the table (a key of
    # `tables`; default its first Parquet table, one row per cell), the metrics, and which
    # of a cell's row (`as_row`) say what it measures (default: all but its suite and id).
    # A cell's group ("per kernel") defaults to its first key, its family ("per shape
    # family") to its other keys that are not numbers.
    compare_table: str | None = None
    compare_metrics: tuple[CompareMetric, ...] = ()
    compare_keys: tuple[str, ...] | None = None
    compare_group: tuple[str, ...] | None = None
    compare_family: tuple[str, ...] | None = None
    # refusal_without_cuda(cell) -> why the cell cannot run where no CUDA device is visible,
    # in the words its job records there, or None (it may, or only its job can tell): what
    # lets a run on such a host record those cells as skipped without a job for each
    # (flashwatt.host_skips)
    refusal_without_cuda: Callable[[Any], str | None] | None = None

    # ---- derived, never written twice ----------------------------------------------
    def envelope(self, cell: Any, spec: dict) -> dict:
        """The start of a record of this kind (what a job that died is recorded with)."""
        return envelope(self.name, cell, spec, self.spec_field)

    def resources(self, cell: Any) -> dict:
        """The cell job's resources: its GPUs, one task per GPU for a job of several, its time."""
        gpus = int(getattr(cell, "gpus", 1))
        out = {"gpus": gpus, "runtime": self.runtime_min}
        if gpus > 1:
            out["tasks"] = gpus
        return out

    def table_paths(self, suite: str) -> dict[str, str]:
        return {t.key: t.path(suite) for t in self.tables}

    def figure_tables(self, suite: str) -> dict[str, str]:
        """The tables the kind's figures are drawn from (what their sources read), by key."""
        paths = self.table_paths(suite)
        keys = dict.fromkeys(key for spec in self.figures.values() for key in spec.source.inputs)
        missing = [key for key in keys if key not in paths]
        if missing:
            raise ValueError(f"kind {self.name}: its figures read {', '.join(missing)}, which no table of it writes")
        return {key: paths[key] for key in keys}

    def figure_paths(self, suite: str) -> list[str]:
        return [f"figures/{suite}/{name}.{spec.ext}" for name, spec in self.figures.items()]

    def outputs(self, suite: str) -> list[str]:
        """What a run of a suite with cells of this kind builds: its tables and figures."""
        return [*self.table_paths(suite).values(), *self.figure_paths(suite)]

    def section_schema(self) -> dict | None:
        if self.schema is None:
            return None
        if isinstance(self.schema, dict):
            schema = copy.deepcopy(self.schema)
        else:
            schema = yaml.safe_load((resources.files(self.package) / self.schema).read_text())
        if self.fill_schema is not None:
            self.fill_schema(schema)
        return schema

    def report_text(self, suite: str) -> str:
        """The report's paragraph on how this kind's cells were measured."""
        if self.report is None:
            return ""
        text = (resources.files(self.package) / self.report).read_text()
        return text.format_map(resolve(self.report_values)(suite)) if self.report_values else text

    # ---- comparison (flashwatt.compare) ---------------------------------------------
    def compared_table(self) -> TableFile:
        """The table a comparison reads: `compare_table`, or the first Parquet one."""
        for table in self.tables:
            if table.key == self.compare_table or (self.compare_table is None and table.name.endswith(".parquet")):
                return table
        raise ValueError(f"kind {self.name}: no table {self.compare_table or 'in Parquet'} to compare "
                         f"(tables: {', '.join(t.key for t in self.tables)})")

    def measures(self, cell: Any) -> dict:
        """What a cell measures, whatever suite, device or commit measured it: its row
        (`as_row`) less its suite and id, or the declared `compare_keys` of it."""
        row = cell.as_row()
        keys = self.compare_keys or [k for k in row if k not in ("suite", "cell_id")]
        return {key: row[key] for key in keys}

    def group_keys(self, measures: Mapping[str, Any]) -> list[str]:
        return list(self.compare_group or list(measures)[:1])

    def family_keys(self, measures: Mapping[str, Any]) -> list[str]:
        if self.compare_family is not None:
            return list(self.compare_family)
        group = self.group_keys(measures)
        return [k for k, v in measures.items()
                if k not in group and (isinstance(v, bool) or not isinstance(v, (int, float)))]

    def compare_metric(self, name: str) -> CompareMetric | None:
        return next((m for m in self.compare_metrics if m.name == name), None)

    @property
    def package(self) -> str:
        """The package the kind lives in (its schema and report text are data there)."""
        return self.cell.__module__.rpartition(".")[0]
