"""What one side of a comparison is: one or more runs of a suite, each its tables and records.

A side is named on the command line by a suite folder (results/<suite>), a table file in
one (results/<suite>/summary.parquet), or several of them joined by commas: repeated runs
of the same cells. A suite folder that holds runs/<i>/ (what `flashwatt run --repeat N`
keeps, flashwatt.compare.repeat) stands for those runs; its own tables are the last of
them, so they are not counted twice.

Each run's tables are read for every kind (flashwatt.kinds) whose compared table is there;
the records beside a run (its snapshot's cells/, or results/cells/ next to a suite folder)
give each cell's provenance and its own repeats.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pandas as pd

from flashwatt.cell_files import RECORD_SUFFIX, RESULTS_ROOT
from flashwatt.config_error import ConfigError
from flashwatt.kind import Kind
from flashwatt.kinds import all_kinds
from flashwatt.records import read_record

RUNS_FOLDER = "runs"        # results/<suite>/runs/<i>/: one repeat of the suite
RUN_INFO = "run.json"       # what a kept run says of itself (when, which config, its status)
CELLS_FOLDER = "cells"      # a kept run's records, laid out as under results/cells/


@dataclass
class Run:
    """One run of a suite: each kind's compared table, and where its records are."""

    folder: Path
    tables: dict[str, pd.DataFrame]
    cells_dirs: list[Path]
    info: dict = field(default_factory=dict)
    _records: dict[str, dict | None] = field(default_factory=dict, repr=False)

    def record_path(self, row: pd.Series) -> Path | None:
        """The record of a table row: beside the run, wherever the results folder was moved."""
        written = row.get("record")
        if not isinstance(written, str) or not written:
            written = f"{RESULTS_ROOT}/{row['cell_id']}{RECORD_SUFFIX}"
        posix = PurePosixPath(written)
        root = PurePosixPath(RESULTS_ROOT)
        parts = posix.parts
        # the part after results/cells/: the same under a kept run's cells/ and results/cells/
        for i in range(len(parts) - len(root.parts) + 1):
            if parts[i:i + len(root.parts)] == root.parts:
                relative = PurePosixPath(*parts[i + len(root.parts):])
                for where in self.cells_dirs:
                    if (where / relative).is_file():
                        return where / relative
        for candidate in (Path(written), self.folder.parent.parent / written):
            if candidate.is_file():
                return candidate
        return None

    def record(self, row: pd.Series) -> dict | None:
        """The row's record (read once), or None where it is not beside the run."""
        path = self.record_path(row)
        if path is None:
            return None
        key = str(path)
        if key not in self._records:
            self._records[key] = read_record(path)
        return self._records[key]


@dataclass
class Side:
    """One side of a comparison: its label, what the user named, its runs."""

    label: str
    named: list[str]
    runs: list[Run]

    def kinds(self) -> list[str]:
        return sorted({name for run in self.runs for name in run.tables})


def _table_kind(path: Path) -> Kind | None:
    """The kind whose compared table (or its CSV twin) this file is."""
    for kind in all_kinds():
        table = Path(kind.compared_table().name)
        if path.name == table.name or (path.suffix == ".csv" and path.stem == table.stem):
            return kind
    return None


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as err:  # noqa: BLE001 - any unreadable file is named with why
        raise ConfigError(f"cannot read {path}: {err}") from err


def _run_of_folder(folder: Path, cells_dirs: list[Path]) -> Run | None:
    tables = {}
    for kind in all_kinds():
        path = folder / kind.compared_table().name
        if path.is_file():
            tables[kind.name] = _read_table(path)
    if not tables:
        return None
    info_path = folder / RUN_INFO
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    return Run(folder, tables, cells_dirs, info)


def _kept_runs(folder: Path) -> list[Path]:
    runs = folder / RUNS_FOLDER
    if not runs.is_dir():
        return []
    found = [p for p in runs.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def runs_named(name: str) -> list[Run]:
    """The runs one command-line path stands for (ConfigError naming it when none)."""
    path = Path(name)
    if path.is_file():
        kind = _table_kind(path)
        if kind is None:
            known = ", ".join(k.compared_table().name for k in all_kinds())
            raise ConfigError(f"{name}: not a table flashwatt compares (one of {known}, or a suite folder)")
        folder = path.parent
        return [Run(folder, {kind.name: _read_table(path)}, [folder / CELLS_FOLDER, folder.parent / CELLS_FOLDER])]
    if not path.is_dir():
        raise ConfigError(f"{name}: no such suite folder or table")
    kept = [run for run in (_run_of_folder(p, [p / CELLS_FOLDER]) for p in _kept_runs(path)) if run is not None]
    if kept:
        return kept
    run = _run_of_folder(path, [path / CELLS_FOLDER, path.parent / CELLS_FOLDER])
    if run is None:
        known = ", ".join(k.compared_table().name for k in all_kinds())
        raise ConfigError(f"{name}: a folder with none of the tables flashwatt compares ({known}) "
                          f"and no {RUNS_FOLDER}/<i>/ of them")
    return [run]


def load_side(argument: str, label: str | None = None) -> Side:
    """A side from its command-line argument: paths joined by commas, each one or more runs."""
    named = [part for part in argument.split(",") if part]
    if not named:
        raise ConfigError(f"{argument!r}: name a suite folder or a table")
    runs = [run for name in named for run in runs_named(name)]
    return Side(label or argument, named, runs)
