"""`flashwatt`: run the workflow and write its report, name the suite, list failed cells.

    flashwatt run [snakemake options...]   the configured suite, then results/<suite>/report.html
    flashwatt suite [--config k=v ...]     which suite `auto` (or the config) resolves to
    flashwatt failed [--config k=v ...]    record paths of cells whose status is not ok,
                                           for `snakemake --forcerun $(flashwatt failed)`
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from flashwatt.config import ConfigError, load_config, resolve_suite, suite_cells
from flashwatt.records import read_record


def _overrides(pairs: list[str]) -> dict:
    """`--config k=v` pairs as Snakemake reads them (values parsed as YAML)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--config {pair!r}: expected KEY=VALUE")
        out[key] = yaml.safe_load(value) if value else ""
    return out


def _config_pairs(args: list[str]) -> list[str]:
    """KEY=VALUE items following --config/-C in a Snakemake command line."""
    pairs, taking = [], False
    for arg in args:
        if arg in ("--config", "-C"):
            taking = True
        elif arg.startswith("-"):
            taking = False
        elif taking and "=" in arg:
            pairs.append(arg)
    return pairs


def cmd_run(snakemake_args: list[str]) -> int:
    config = load_config(overrides=_overrides(_config_pairs(snakemake_args)))
    suite = resolve_suite(config)
    base = [sys.executable, "-m", "snakemake", *snakemake_args]
    print(f"flashwatt: suite {suite}, {len(suite_cells(config, suite))} cells", flush=True)
    status = subprocess.call(base)
    report = Path("results") / suite / "report.html"
    if status == 0:
        status = subprocess.call([*base, "--report", str(report)])
    if status == 0:
        print(f"flashwatt: report written to {report.resolve()}")
    return status


def cmd_suite(pairs: list[str]) -> int:
    print(resolve_suite(load_config(overrides=_overrides(pairs))))
    return 0


def cmd_failed(pairs: list[str]) -> int:
    config = load_config(overrides=_overrides(pairs))
    for cell in suite_cells(config):
        path = Path(cell.path)
        if path.exists() and read_record(path).get("status") != "ok":
            print(cell.path)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # everything after `run` belongs to Snakemake
        try:
            return cmd_run(argv[1:])
        except ConfigError as err:
            print(f"flashwatt: {err}", file=sys.stderr)
            return 2
    parser = argparse.ArgumentParser(prog="flashwatt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the workflow with these Snakemake options, then write the report")
    for name in ("suite", "failed"):
        p = sub.add_parser(name)
        p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        return {"suite": cmd_suite, "failed": cmd_failed}[args.command](args.config)
    except ConfigError as err:
        print(f"flashwatt: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
