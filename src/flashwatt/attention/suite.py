"""A suite's `grids`, expanded into attention cells: the product of each grid's kernels,
precisions, lengths, head dims, masks, passes and launch variants, with batches (or
tokens per batch) and heads (or the model width), in a stable order.

    grids:
      - kernels: [naive, sdpa_flash, custom]
        precisions: [bf16]
        seq_lens: [1024, 4096]
        tokens_per_batch: 16384      # or batches: [...]
        model_dim: 512               # or heads: [...]
        head_dims: [64]
        causal: [false, true]
        passes: [fwd, fwd_bwd]

`filter` (a pandas query over the cell table) keeps a slice; a filter that keeps no cell
is an error, not an empty run. Every cell's spec is the suite's measurement settings.
"""
from __future__ import annotations

import itertools

from flashwatt.attention.cell import Cell
from flashwatt.config_error import ConfigError
from flashwatt.settings import measure_settings


def _check_grid(suite: str, i: int, grid: dict) -> None:
    """The grid's defaults filled in, and each variant name checked against the kernel's."""
    from flashwatt.kernels.custom import check_variant_name

    grid.setdefault("causal", [False])
    grid.setdefault("passes", ["fwd"])
    grid.setdefault("variants", [""])
    for j, variant in enumerate(grid["variants"]):
        try:
            check_variant_name(variant)
        except ValueError as err:
            raise ConfigError(f"config key suites.{suite}.grids[{i}].variants[{j}]: {err}") from None


def attention_cells(config: dict, suite: str) -> dict[Cell, dict]:
    """Each attention cell of the suite and its spec, the suite's measurement settings;
    empty without grids."""
    for i, grid in enumerate(config["suites"][suite].get("grids", [])):
        _check_grid(suite, i, grid)
    cells = suite_cells(config, suite, filtered=False)
    if not cells:
        return {}
    settings = measure_settings(config, suite)
    return {cell: settings for cell in cells}


def filter_cells(cells: list[Cell], query: str, suite: str) -> list[Cell]:
    """The cells a `filter` query keeps; a filter that keeps none is an error, not an empty run."""
    kept = apply_filter(cells, query)
    if not kept:
        raise ConfigError(f"config key filter: {query!r} selects none of the {len(cells)} cells of suite "
                          f"{suite}; columns: {', '.join(_filter_columns())}")
    return kept


def _grid_cells(suite: str, grid: dict, where: str) -> list[Cell]:
    cells = []
    batches = grid.get("batches")
    heads = grid.get("heads")
    for kernel, precision, L, D, causal, pass_, variant in itertools.product(
        grid["kernels"], grid["precisions"], grid["seq_lens"], grid["head_dims"],
        grid["causal"], grid["passes"], grid["variants"],
    ):
        if variant and kernel != "custom":
            continue  # variants name launch configurations of the custom kernel only
        if batches is None:
            tokens = grid["tokens_per_batch"]
            if tokens % L:
                raise ConfigError(f"config key {where}.tokens_per_batch: {tokens} is not a multiple of seq_len {L}")
            cell_batches = [tokens // L]
        else:
            cell_batches = batches
        if heads is None:
            if grid["model_dim"] % D:
                raise ConfigError(f"config key {where}.model_dim: {grid['model_dim']} is not a multiple of head_dim {D}")
            cell_heads = [grid["model_dim"] // D]
        else:
            cell_heads = heads
        for B, H in itertools.product(cell_batches, cell_heads):
            cells.append(Cell(suite, kernel, precision, L, B, H, D, causal, pass_, variant))
    return cells


def suite_cells(config: dict, suite: str, filtered: bool = True) -> list[Cell]:
    """The cell table of a suite, in a stable order, filtered by `config['filter']` (unless
    `filtered` is False). A filter that keeps no cell is an error, not an empty run."""
    cells: set[Cell] = set()
    for i, grid in enumerate(config["suites"][suite].get("grids", [])):
        cells.update(_grid_cells(suite, grid, f"suites.{suite}.grids[{i}]"))
    ordered = sorted(cells)
    query = (config.get("filter") or "").strip()
    return filter_cells(ordered, query, suite) if query and filtered else ordered


def _filter_columns() -> list[str]:
    return [c for c in Cell("x", "naive", "fp32", 1, 1, 1, 1).as_row() if c not in ("suite", "cell_id")]


def apply_filter(cells: list[Cell], query: str) -> list[Cell]:
    import pandas as pd

    table = pd.DataFrame([c.as_row() for c in cells])
    try:
        kept = table.query(query, engine="python")
    except Exception as err:  # pandas raises many types for a bad expression
        columns = ", ".join(c for c in table.columns if c not in ("suite", "cell_id"))
        raise ConfigError(f"config key filter: cannot apply {query!r}: {err}; columns: {columns}") from err
    keep = set(kept.index)
    return [c for i, c in enumerate(cells) if i in keep]
