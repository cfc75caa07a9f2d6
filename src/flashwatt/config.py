"""The configuration: validated once, before any job starts; each kind of cell
(flashwatt.kinds) then plans its cells from its own section of a suite.

Validation happens before any job starts. A bad value stops the run with one message
that names the key (as a path such as `suites.seed.grids[0].kernels[2]`) and what is
allowed there, instead of jsonschema's page of schema dump.
"""
from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from flashwatt.config_error import ConfigError
from flashwatt.devices import visible_gpu_count

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

# Package data, so an installed flashwatt validates configs too; workflow/schemas/ in
# the checkout links here, where Snakemake workflows keep their schema.
SCHEMA = resources.files("flashwatt") / "config.schema.yaml"


def _key_path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# How a schema type reads in a message.
_TYPE_WORDS = {"boolean": "true, false", "array": "a list", "string": "a string", "integer": "a whole number",
               "number": "a number", "object": "a mapping"}


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
    if error.validator in ("oneOf", "anyOf") and not all("required" in alt for alt in error.validator_value):
        words = [_TYPE_WORDS.get(alt.get("type"), str(alt.get("type"))) for alt in error.validator_value]
        return f"config key {where}: {error.instance!r} is not allowed; give {', '.join(words[:-1])} or {words[-1]}"
    if error.validator in ("oneOf", "anyOf"):
        choices = " or ".join("/".join(alt["required"]) for alt in error.validator_value)
        exactly = "exactly one" if error.validator == "oneOf" else "at least one"
        return f"config key {where}: give {exactly} of {choices}"
    if error.validator == "propertyNames":
        return f"config key {where}: name {error.instance!r} must use lower-case letters, digits and _"
    return f"config key {where}: {error.message}"


def load_schema(schema_file: Traversable | Path = SCHEMA) -> dict:
    """The config schema: the top-level keys from `schema_file`, and under each suite every
    kind's section (flashwatt.kinds), its enums filled in from the code that names them."""
    from flashwatt.kinds import all_kinds

    from flashwatt.failures import RETRIABLE

    schema = yaml.safe_load(schema_file.read_text())
    schema["properties"]["retry_failed"]["anyOf"][1]["items"] = {"enum": list(RETRIABLE)}
    suite = schema["properties"]["suites"]["additionalProperties"]
    sections = []
    for kind in all_kinds():
        section = kind.section_schema()
        if section is None:
            continue
        for name, definition in section.pop("$defs", {}).items():
            if name in schema["$defs"]:
                raise RuntimeError(f"kind {kind.name}: its schema's $defs.{name} is already defined")
            schema["$defs"][name] = definition
        suite["properties"][kind.section] = section
        sections.append(kind.section)
    # A suite holds the cells of one kind or several: at least one section.
    suite["anyOf"] = [{"required": [section]} for section in sections]
    return schema


def validate_config(config: dict, schema_file: Traversable | Path = SCHEMA) -> dict:
    """Check `config` against the schema, fill defaults in place, then plan every suite (a
    planner refuses what the schema cannot say, naming the key); return the config."""
    import json
    import tempfile

    import jsonschema
    from snakemake.utils import validate as snakemake_validate

    from flashwatt.kinds import plan_suite

    # Snakemake reads `--config retry_failed=false` as the string 'false' (its booleans are
    # spelt True and False): the word means the boolean, as it does in the config file.
    if isinstance(config.get("retry_failed"), str) and config["retry_failed"].lower() in ("true", "false"):
        config["retry_failed"] = config["retry_failed"].lower() == "true"
    schema = load_schema(schema_file)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_explain(jsonschema.exceptions.best_match(errors)))
    # Snakemake's validator fills the schema's defaults in place; it reads the schema from a file.
    with tempfile.NamedTemporaryFile("w", suffix=".schema.json") as assembled:
        json.dump(schema, assembled)
        assembled.flush()
        snakemake_validate(config, assembled.name, set_default=True)
    for name in config["suites"]:
        plan_suite(config, name, filtered=False)
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


def read_config_file(path: str | Path) -> dict:
    """One config file's keys; a ConfigError naming the file (and the line) when it is
    missing, is not YAML, or does not hold a mapping of keys."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: no such file") from None
    try:
        keys = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {path}{where}: not valid YAML ({problem})") from None
    if keys is None:
        return {}
    if not isinstance(keys, dict):
        raise ConfigError(f"config file {path}: holds a {type(keys).__name__}, not a mapping of config keys")
    return keys


def command_line_measure_first(config: dict, layers: list[dict]) -> dict:
    """Let `measure` keys set by `layers` win over a suite's own `measure`, in place.

    `layers` are what came after config/config.yaml, in order (config files named on the
    command line, then --config): a `measure` key one of them sets at the top level
    applies to every suite, also those whose own `measure` set it earlier (`--config
    'measure={min_repeats: 50}'` changes the smoke suite too). A suite's own key set by
    the same layer or a later one stays: the more specific setting of the same command line.
    """
    for index, layer in enumerate(layers):
        top = layer.get("measure") if isinstance(layer, dict) else None
        if not isinstance(top, dict):
            continue
        for name, suite in (config.get("suites") or {}).items():
            own = suite.get("measure") if isinstance(suite, dict) else None
            if not isinstance(own, dict):
                continue
            kept = {key for later in layers[index:] for key in _suite_measure(later, name)}
            for key in set(top) - kept:
                own.pop(key, None)
    return config


def _suite_measure(layer, suite: str) -> dict:
    """The `measure` a config layer sets for one suite ({} when none)."""
    suites = layer.get("suites") if isinstance(layer, dict) else None
    entry = suites.get(suite) if isinstance(suites, dict) else None
    measure = entry.get("measure") if isinstance(entry, dict) else None
    return measure if isinstance(measure, dict) else {}


def load_config(path: str | Path = "config/config.yaml", overrides: dict | None = None,
                configfiles: list[str | Path] | None = None) -> dict:
    """The config Snakemake runs with: `path`, each of `configfiles` over it, then
    `overrides`; their `measure` over the suites' own (command_line_measure_first)."""
    config = read_config_file(path)
    layers = [read_config_file(extra) for extra in configfiles or [] if not _same_file(extra, path)]
    layers.append(overrides or {})
    for layer in layers:
        merge_config(config, copy.deepcopy(layer))
    return validate_config(command_line_measure_first(config, layers))


def _same_file(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


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
