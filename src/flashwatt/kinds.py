"""Every kind of cell flashwatt knows, in one list, and what is planned from it.

Planning, validation, the config schema, the workflow's rules, the report and the CLI
loop over `all_kinds()`; nothing else enumerates kinds. The built-in kinds are listed
below; more can be added without editing flashwatt: name the modules that define them in
FLASHWATT_KINDS (comma-separated import paths, each with a module-level `KIND`), e.g.

    FLASHWATT_KINDS=mylab.kinds.gemm snakemake ...

The variable reaches every process of a run (Snakemake, its jobs, the CLI), so the kind is
planned, run, tabled, drawn and counted like a built-in one.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from flashwatt.kind import Kind

BUILTIN = ("flashwatt.attention.kind", "flashwatt.control.kind", "flashwatt.distributed.kind",
           "flashwatt.models.kind", "flashwatt.training.kind")
PLUGINS_VARIABLE = "FLASHWATT_KINDS"

_LOADED: dict[tuple[str, ...], dict[str, Kind]] = {}


def _modules() -> tuple[str, ...]:
    extra = [m.strip() for m in os.environ.get(PLUGINS_VARIABLE, "").split(",") if m.strip()]
    return (*BUILTIN, *extra)


def _load(modules: tuple[str, ...]) -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    sections: dict[str, str] = {}
    for module in modules:
        try:
            kind = importlib.import_module(module).KIND
        except (ImportError, AttributeError) as err:
            raise RuntimeError(f"{PLUGINS_VARIABLE}: cannot load a kind from {module!r}: {err}") from err
        for taken, what in ((kind.name, kinds), (kind.section, sections)):
            if taken in what:
                raise RuntimeError(f"kind {kind.name!r} from {module}: {taken!r} is already used by another kind")
        kinds[kind.name] = kind
        sections[kind.section] = kind.name
    return kinds


def registry() -> dict[str, Kind]:
    """Each kind by name, the built-in ones first (loaded once per set of modules)."""
    modules = _modules()
    if modules not in _LOADED:
        _LOADED[modules] = _load(modules)
    return _LOADED[modules]


def all_kinds() -> list[Kind]:
    return list(registry().values())


def kind_named(name: str) -> Kind:
    kinds = registry()
    if name not in kinds:
        raise KeyError(f"unknown kind of cell {name!r}; known: {', '.join(kinds)}")
    return kinds[name]


def kind_of(cell: Any) -> Kind:
    """The kind a cell object belongs to."""
    for kind in registry().values():
        if isinstance(cell, kind.cell):
            return kind
    raise TypeError(f"{type(cell).__name__} is the cell of no registered kind")


def kind_of_record(path: str) -> Kind | None:
    """The kind whose record path this is, from the path alone (None when none)."""
    for kind in registry().values():
        try:
            kind.cell.from_path(path)
        except ValueError:
            continue
        return kind
    return None


def plan_suite(config: dict, suite: str, filtered: bool = True) -> dict[str, dict]:
    """{kind name: {cell: spec}} for every kind with cells in the suite (a validated config)."""
    planned = {}
    query = (config.get("filter") or "").strip()
    for kind in all_kinds():
        if not config["suites"][suite].get(kind.section):
            continue
        cells = kind.plan(config, suite)
        if cells and query and filtered and kind.filter is not None:
            cells = {cell: cells[cell] for cell in kind.filter(list(cells), query, suite)}
        if cells:
            planned[kind.name] = cells
    return planned


def every_cell(config: dict, suite: str) -> list:
    """Every cell a run of the suite writes a record for, kind by kind."""
    return [cell for cells in plan_suite(config, suite).values() for cell in cells]


def envelope_of(cell: Any, spec: dict) -> dict:
    """The start of a record for any cell, by its kind."""
    return kind_of(cell).envelope(cell, spec)
