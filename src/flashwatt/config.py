"""The configuration: validated once, then expanded into the suite's cell table.

Validation happens before any job starts. A bad value stops the run with one message
that names the key (as a path such as `suites.seed.grids[0].kernels[2]`) and what is
allowed there, instead of jsonschema's page of schema dump.
"""
from __future__ import annotations

import itertools
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from flashwatt.attention.cell import Cell
from flashwatt.devices import visible_gpu_count
from flashwatt.kernels.custom import check_variant_name
from flashwatt.settings import MeasureSettings
from flashwatt.vocabulary import SCHEMA_ENUMS

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

# Package data, so an installed flashwatt validates configs too; workflow/schemas/ in
# the checkout links here, where Snakemake workflows keep their schema.
SCHEMA = resources.files("flashwatt") / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the config."""


def _key_path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _explain(error) -> str:
    parent = error.parent  # a failed alternative of a list of allowed names: name the whole list
    if parent is not None and parent.validator == "anyOf" and all("enum" in alt or "pattern" in alt
                                                                   for alt in parent.validator_value):
        error = parent
    where = _key_path(error.absolute_path)
    schema = error.schema
    if error.validator == "additionalProperties":
        allowed = ", ".join(sorted(schema.get("properties", {})))
        unexpected = sorted(set(error.instance) - set(schema.get("properties", {})))
        return f"config key {where}: unknown key(s) {', '.join(map(repr, unexpected))}; allowed: {allowed}"
    if error.validator == "enum":
        allowed = ", ".join(map(str, error.validator_value))
        return f"config key {where}: {error.instance!r} is not allowed; allowed: {allowed}"
    if error.validator in ("oneOf", "anyOf") and all("enum" in alt or "pattern" in alt for alt in error.validator_value):
        allowed = ", ".join(", ".join(map(str, alt["enum"])) if "enum" in alt else f"a name matching {alt['pattern']}"
                            for alt in error.validator_value)
        return f"config key {where}: {error.instance!r} is not allowed; allowed: {allowed}"
    if error.validator in ("oneOf", "anyOf"):
        choices = " or ".join("/".join(alt["required"]) for alt in error.validator_value)
        exactly = "exactly one" if error.validator == "oneOf" else "at least one"
        return f"config key {where}: give {exactly} of {choices}"
    if error.validator == "propertyNames":
        return f"config key {where}: name {error.instance!r} must use lower-case letters, digits and _"
    return f"config key {where}: {error.message}"


def load_schema(schema_file: Traversable | Path = SCHEMA) -> dict:
    """The config schema with its enums filled in from the code that names them:
    flashwatt.vocabulary (kernels, precisions, passes, head dims of a grid), the control and
    distributed cells (their modes, workloads, strategies, blocks, ...)."""
    from flashwatt.control import cell as control
    from flashwatt.distributed import cell as distributed

    schema = yaml.safe_load(schema_file.read_text())
    grid = schema["properties"]["suites"]["additionalProperties"]["properties"]["grids"]["items"]["properties"]
    for key, names in SCHEMA_ENUMS.items():
        grid[key]["items"] = {"enum": list(names)}
    spread = schema["$defs"]["distributed"]["properties"]["grids"]["items"]["properties"]
    for key, names in (("strategies", distributed.STRATEGIES), ("blocks", distributed.BLOCKS),
                       ("precisions", distributed.PRECISIONS), ("passes", distributed.PASSES)):
        spread[key]["items"] = {"enum": list(names)}
    from flashwatt.models import cell as models

    grid_of_models = schema["$defs"]["models"]["properties"]["grids"]["items"]["properties"]
    for key, names in (("precisions", models.MODEL_PRECISIONS), ("phases", models.PHASES),
                       ("strategies", models.MODEL_STRATEGIES)):
        grid_of_models[key]["items"] = {"enum": list(names)}
    grid_of_models["backends"]["items"] = {"anyOf": [{"enum": list(models.MODEL_BACKENDS)},
                                                     {"type": "string", "pattern": f"^{models.CONTROL_BACKEND_RE}$"}]}
    run = schema["$defs"]["control"]["properties"]["runs"]["items"]["properties"]
    for key, names in (("mode", [m for m in control.CONTROL_MODES if m != "oracle"]), ("workload", control.WORKLOADS),
                       ("precision", control.CONTROL_PRECISIONS), ("disturbance", control.DISTURBANCES)):
        run[key] = {"enum": list(names)}
    return schema


def validate_config(config: dict, schema_file: Traversable | Path = SCHEMA) -> dict:
    """Check `config` against the schema, fill defaults in place, return it."""
    import jsonschema
    from snakemake.utils import validate as snakemake_validate

    schema = load_schema(schema_file)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_explain(jsonschema.exceptions.best_match(errors)))
    # Snakemake's validator fills the schema's defaults in place.
    with resources.as_file(schema_file) as schema_path:  # Snakemake reads the schema from a file
        snakemake_validate(config, str(schema_path), set_default=True)
    for name, suite in config["suites"].items():
        for i, grid in enumerate(suite.get("grids", [])):
            grid.setdefault("causal", [False])
            grid.setdefault("passes", ["fwd"])
            grid.setdefault("variants", [""])
            for j, variant in enumerate(grid["variants"]):
                try:
                    check_variant_name(variant)
                except ValueError as err:
                    raise ConfigError(f"config key suites.{name}.grids[{i}].variants[{j}]: {err}") from None
    from flashwatt.control.suite import control_runs  # they raise ConfigError, defined here
    from flashwatt.distributed.suite import distributed_runs
    from flashwatt.models.suite import model_runs
    from flashwatt.training.suite import training_runs

    for name in config["suites"]:
        control_runs(config, name)
        distributed_runs(config, name)
        model_runs(config, name)
        training_runs(config, name)
    return config


def merge_config(base: dict, update: dict) -> dict:
    """`update` merged into `base` key by key, nested mappings too: how Snakemake combines
    config files and --config (snakemake.utils.update_config)."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = value
    return base


def load_config(path: str | Path = "config/config.yaml", overrides: dict | None = None,
                configfiles: list[str | Path] | None = None) -> dict:
    """The config Snakemake runs with: `path`, each of `configfiles` over it, then `overrides`."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    for extra in configfiles or []:
        try:
            merge_config(config, yaml.safe_load(Path(extra).read_text()) or {})
        except FileNotFoundError:
            raise ConfigError(f"--configfile {extra}: no such file") from None
    merge_config(config, overrides or {})
    return validate_config(config)


def resolve_suite(config: dict) -> str:
    """`auto` means smoke without a visible CUDA device and seed with one; under the Slurm
    executor it means seed, since the cells run on the GPU nodes, not on this login node."""
    suite = config.get("suite", "auto")
    if suite == "auto":
        on_gpus = config.get("executor") == "slurm" or visible_gpu_count() > 0
        suite = "seed" if on_gpus else "smoke"
    if suite not in config["suites"]:
        allowed = ", ".join(["auto", *config["suites"]])
        raise ConfigError(f"config key suite: unknown suite {suite!r}; allowed: {allowed}")
    return suite


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


def suite_cells(config: dict, suite: str | None = None, filtered: bool = True) -> list[Cell]:
    """The cell table of a suite, in a stable order, filtered by `config['filter']` (unless
    `filtered` is False). A filter that keeps no cell is an error, not an empty run."""
    suite = suite or resolve_suite(config)
    if suite not in config["suites"]:
        raise ConfigError(f"config key suite: unknown suite {suite!r}; allowed: {', '.join(config['suites'])}")
    cells: set[Cell] = set()
    for i, grid in enumerate(config["suites"][suite].get("grids", [])):
        cells.update(_grid_cells(suite, grid, f"suites.{suite}.grids[{i}]"))
    ordered = sorted(cells)
    query = (config.get("filter") or "").strip()
    if query and filtered:
        kept = apply_filter(ordered, query)
        if not kept:
            raise ConfigError(f"config key filter: {query!r} selects none of the {len(ordered)} cells of suite "
                              f"{suite}; columns: {', '.join(_filter_columns())}")
        ordered = kept
    return ordered


def every_cell(config: dict, suite: str | None = None) -> list:
    """The suite's attention cells (filtered), then its control, distributed and model cells:
    everything a run of the suite writes a record for."""
    from flashwatt.control.suite import control_runs
    from flashwatt.distributed.suite import distributed_runs
    from flashwatt.models.suite import model_runs

    suite = suite or resolve_suite(config)
    return [*suite_cells(config, suite), *control_runs(config, suite), *distributed_runs(config, suite),
            *model_runs(config, suite)]


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


def measure_settings(config: dict, suite: str) -> dict[str, Any]:
    """The measurement settings a suite's cells run with (recorded in every cell record).

    Plain data, because Snakemake compares a rule's params between runs; the job turns
    it into `flashwatt.settings.MeasureSettings`, which refuses unknown keys.
    """
    merged = {**config["measure"], **config["suites"][suite].get("measure", {})}
    return MeasureSettings.from_mapping(merged).as_dict()
