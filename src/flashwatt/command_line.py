"""A Snakemake command line read as Snakemake reads it: the profile it names (or
$SNAKEMAKE_PROFILE), the workflow profile (profiles/default), the config files and the
--config values, so that every `flashwatt` subcommand plans the same suite and cells as the
`snakemake` it drives or stands beside (`snakemake --profile slurm --forcerun $(flashwatt
failed --profile slurm)` targets the cells that run would measure).

Snakemake's own argument parser does the reading (snakemake.cli.parse_args, profiles
applied); only the values of --config are parsed here, as YAML, as `flashwatt run` passes
them on (config_through_a_file).
"""
from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import yaml

from flashwatt.config import ConfigError, load_config

# Options of Snakemake whose values are config files (later ones override earlier ones).
CONFIGFILE_OPTIONS = ("--configfile", "--configfiles")
CONFIG_OPTIONS = ("--config", "-C")


def snakemake_options(args: list[str]) -> argparse.Namespace:
    """`args` parsed by Snakemake, with the defaults its profiles give. A bad option or an
    unknown profile is a ConfigError with Snakemake's own words."""
    from snakemake.cli import parse_args

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):  # "Using profile ...", printed by Snakemake itself
            _parser, options = parse_args(list(args))
    except SystemExit:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        raise ConfigError(f"snakemake options {' '.join(args)!r}: {lines[-1] if lines else 'not understood'}") from None
    return options


def overrides(pairs: list[str]) -> dict:
    """`--config` KEY=VALUE pairs, each value read as YAML."""
    out = {}
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        if not sep or not key:
            raise ConfigError(f"--config {pair!r}: expected KEY=VALUE, e.g. --config suite=smoke "
                              "(a file to build goes before --config, which takes every word after it)")
        out[key] = yaml.safe_load(value) if value else ""
    return out


def config_pairs(args: list[str]) -> list[str]:
    """The --config items of a command line, or its profile's `config:` when it gives none."""
    return [str(item) for item in snakemake_options(args).config or []]


def configfiles(args: list[str]) -> list[str]:
    """The config files `snakemake args` reads over config/config.yaml, in order: those
    of the command line, which replace the profile's `configfiles`, else the profile's."""
    return [str(path) for path in snakemake_options(args).configfile or []]


def run_configfiles(args: list[str]) -> list[str]:
    """The config files `flashwatt run args` passes on: the command line's (or
    config/config.yaml), then the profile's. A command-line --configfile replaces the
    profile's list in Snakemake (profiles/slurm/README.md), so the wrapper passes them all."""
    named = (configfiles(args) if has_option(args, CONFIGFILE_OPTIONS) else []) or ["config/config.yaml"]
    profiles = configfiles(without_options(args, CONFIGFILE_OPTIONS))
    return named + [path for path in profiles if path not in named]


def config_as_snakemake_sees_it(args: list[str]) -> dict:
    """The validated config of `snakemake args`: config/config.yaml, its config files,
    then its --config."""
    return load_config(configfiles=configfiles(args), overrides=overrides(config_pairs(args)))


def run_config(args: list[str]) -> dict:
    """The validated config of `flashwatt run args` (run_configfiles, then --config)."""
    return load_config(configfiles=run_configfiles(args), overrides=overrides(config_pairs(args)))


def named_targets(args: list[str]) -> list[str]:
    """The files (or rules) a Snakemake command line asks for, as Snakemake parses it."""
    from snakemake.cli import get_argument_parser

    return sorted(get_argument_parser().parse_args(args).targets or ())


def has_option(args: list[str], options: tuple[str, ...]) -> bool:
    return any(arg in options or arg.partition("=")[0] in options and arg.startswith("--") for arg in args)


def without_options(args: list[str], options: tuple[str, ...]) -> list[str]:
    """`args` less the given options and their values."""
    out, dropping = [], False
    for arg in args:
        name = arg.partition("=")[0]
        if arg in options or (arg.startswith("--") and name in options):
            dropping = arg in options
        elif dropping and not arg.startswith("-"):
            continue
        else:
            dropping = False
            out.append(arg)
    return out


def config_through_a_file(args: list[str], folder: Path = Path(".snakemake")) -> list[str]:
    """The command line with its --config values moved into a YAML file given last in --configfile.

    Snakemake strips quotes from both ends of a --config value, so a filter that ends in
    a quote (`filter=kernel == "naive"`) would reach the workflow cut short; a config file
    carries it intact and overrides the other config files just as --config would.
    """
    pairs = config_pairs(args)
    if not pairs:
        return args
    folder.mkdir(parents=True, exist_ok=True)
    command_line = folder / "flashwatt-command-line-config.yaml"
    command_line.write_text(yaml.safe_dump(overrides(pairs), sort_keys=False))
    files = run_configfiles(args)
    rest = without_options(without_options(args, CONFIG_OPTIONS), CONFIGFILE_OPTIONS)
    return [*rest, "--configfile", *files, str(command_line)]
