"""A suite's `distributed` section, expanded into distributed cells and the job spec of each.

    distributed:
      repeats: 10          # timed calls per rank (median), after `warmup`
      warmup: 3
      grids:
        - strategies: [ring, zigzag, ulysses]
          gpus: [1, 2, 4, 8]
          blocks: [flash]
          precisions: [bf16]
          seq_lens: [8192, 16384]
          batches: [1]
          heads: [32]
          kv_heads: [8]
          head_dims: [128]
          causal: [true]
          passes: [fwd_bwd]
          nodes: [1]         # optional: the nodes a cell spans (gpus in all, gpus / nodes on each)

Every spec carries the suite's measurement settings (`measure`: the energy window).
A combination a strategy cannot run (L not divisible by 2 x the world size, heads not
divisible by it for Ulysses) is refused with the grid's key, before any job starts.
"""
from __future__ import annotations

import itertools

from flashwatt.config_error import ConfigError
from flashwatt.settings import measure_settings
from flashwatt.distributed.cell import DistributedCell

DEFAULT_REPEATS, DEFAULT_WARMUP = 10, 3


def distributed_runs(config: dict, suite: str) -> dict[DistributedCell, dict]:
    """Each distributed cell of the suite and its job spec, in a stable order; empty for a
    suite without a distributed section."""
    section = config["suites"][suite].get("distributed")
    if not section:
        return {}
    options = {"repeats": int(section.get("repeats", DEFAULT_REPEATS)),
               "warmup": int(section.get("warmup", DEFAULT_WARMUP)), "measure": measure_settings(config, suite)}
    cells: dict[DistributedCell, dict] = {}
    for i, grid in enumerate(section["grids"]):
        where = f"suites.{suite}.distributed.grids[{i}]"
        for values in itertools.product(
                grid["strategies"], grid["blocks"], grid["precisions"], grid["gpus"], grid["seq_lens"],
                grid["batches"], grid["heads"], grid["kv_heads"], grid["head_dims"], grid.get("causal", [False]),
                grid.get("passes", ["fwd"]), grid.get("nodes", [1])):
            try:
                cell = DistributedCell(suite, *values)
            except ValueError as err:
                raise ConfigError(f"config key {where}: {err}") from None
            cells[cell] = cell.spec(**options)
    return {cell: cells[cell] for cell in sorted(cells)}
