"""`flashwatt`: run the workflow and write its report, name the suite, list failed cells.

    flashwatt run [--accept-failed-cells] [snakemake options...]
        the configured suite (the same config Snakemake sees: config/config.yaml, then any
        --configfile, then --config), then results/<suite>/report.html (not when files or
        rules are named: that run is not the suite's); ends with the count
        of cells per status and exits 1 when a cell ended error, incorrect or job_failed
    flashwatt suite [--configfile F ...] [--config k=v ...]
        which suite `auto` (or the config) resolves to
    flashwatt failed [--configfile F ...] [--config k=v ...]
        record paths of cells whose status is not ok, for `snakemake --forcerun $(flashwatt failed)`
    flashwatt control-cache [--clear]
        where the power-aware controller keeps what it learned (its warm starts), and what is
        there; --clear removes it (flashwatt.control.warm_start)
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

from flashwatt.config import ConfigError, load_config, resolve_suite
from flashwatt.failures import FAILED_CELLS_EXIT
from flashwatt.job_frame import EXPECTED_STATUSES
from flashwatt.kinds import all_kinds, every_cell
from flashwatt.records import read_record
# Snakemake options after which there is nothing to report: pass them through untouched.
NO_REPORT_OPTIONS = {"-h", "--help", "--version", "-v", "--unlock", "-n", "--dry-run", "--dryrun", "--lint",
                     "--list", "-l", "--list-target-rules", "--summary", "-S", "--detailed-summary", "-D",
                     "--report", "--dag", "--rulegraph", "--filegraph", "--cleanup-metadata", "--list-changes",
                     "--lc", "--list-code-changes", "--list-input-changes", "--li", "--list-params-changes",
                     "--lp", "--delete-all-output", "--delete-temp-output"}
# Options of Snakemake whose values are config files (later ones override earlier ones).
CONFIGFILE_OPTIONS = ("--configfile", "--configfiles")
CONFIG_OPTIONS = ("--config", "-C")


def _overrides(pairs: list[str]) -> dict:
    """`--config` KEY=VALUE pairs as Snakemake reads them (values parsed as YAML)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--config {pair!r}: expected KEY=VALUE")
        out[key] = yaml.safe_load(value) if value else ""
    return out


def _values_after(args: list[str], options: tuple[str, ...]) -> list[str]:
    """The values following any of `options` in a Snakemake command line (also `--opt=value`)."""
    values, taking = [], False
    for arg in args:
        name, eq, inline = arg.partition("=")
        if name in options and eq and arg.startswith("--"):
            values.append(inline)
            taking = False
        elif arg in options:
            taking = True
        elif arg.startswith("-") and not (taking and arg[1:2].isdigit()):
            taking = False
        elif taking:
            values.append(arg)
    return values


def _config_pairs(args: list[str]) -> list[str]:
    """KEY=VALUE items following --config/-C in a Snakemake command line."""
    return [v for v in _values_after(args, CONFIG_OPTIONS) if "=" in v]


def _profile_configfiles(args: list[str]) -> list[str]:
    """Config files a `--profile` folder adds (profiles/slurm adds the Slurm executor)."""
    files = []
    for profile in _values_after(args, ("--profile",)):
        settings = Path(profile) / "config.yaml"
        if settings.exists():
            files += [str(f) for f in (yaml.safe_load(settings.read_text()) or {}).get("configfiles", [])]
    return files


def _configfiles(args: list[str]) -> list[str]:
    """The config files of a run, in order: the command line's (or config/config.yaml),
    then the profile's. A command-line --configfile replaces the profile's list in
    Snakemake, so the wrapper passes them all (config_through_a_file) and reads them all."""
    files = _values_after(args, CONFIGFILE_OPTIONS) or ["config/config.yaml"]
    return files + [f for f in _profile_configfiles(args) if f not in files]


def config_as_snakemake_sees_it(args: list[str]) -> dict:
    """The run's config files over config/config.yaml, then --config."""
    return load_config(configfiles=_configfiles(args), overrides=_overrides(_config_pairs(args)))


def named_targets(args: list[str]) -> list[str]:
    """The files (or rules) a Snakemake command line asks for, as Snakemake parses it."""
    from snakemake.cli import get_argument_parser

    return sorted(get_argument_parser().parse_args(args).targets or ())


def _snakemake(args: list[str]) -> int:
    """Run Snakemake and wait for it, also when interrupted.

    Snakemake runs in a session of its own, so a Ctrl-C reaches this process only; it is
    forwarded once to Snakemake's process group (Snakemake and its jobs, as a terminal
    would) and then Snakemake is waited for: it cancels its jobs and removes its locks
    before it exits. Killing it in the middle of that shutdown is what leaves stale locks.
    """
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], start_new_session=True)
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in handled}
    try:
        status = proc.wait()  # PEP 475: the wait resumes after each forwarded signal
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        print(f"flashwatt: interrupted ({signal.Signals(received[0]).name}); Snakemake stopped its jobs and "
              "released its lock", file=sys.stderr, flush=True)
        return 128 + received[0]
    return status


def _without_options(args: list[str], options: tuple[str, ...]) -> list[str]:
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
    pairs = _config_pairs(args)
    if not pairs:
        return args
    folder.mkdir(parents=True, exist_ok=True)
    overrides = folder / "flashwatt-command-line-config.yaml"
    overrides.write_text(yaml.safe_dump(_overrides(pairs), sort_keys=False))
    rest = _without_options(_without_options(args, CONFIG_OPTIONS), CONFIGFILE_OPTIONS)
    return [*rest, "--configfile", *_configfiles(args), str(overrides)]


def status_counts(cells) -> Counter:
    """Status of each cell's record on disk ('missing' where none was written)."""
    counts: Counter = Counter()
    for cell in cells:
        path = Path(cell.path)
        counts[read_record(path).get("status") if path.exists() else "missing"] += 1
    return counts


def cmd_run(argv: list[str]) -> int:
    accept_failed = "--accept-failed-cells" in argv
    args = [a for a in argv if a != "--accept-failed-cells"]
    if NO_REPORT_OPTIONS & set(args):
        return _snakemake(args)  # help, dry run, unlock...: nothing ran, nothing to report
    config = config_as_snakemake_sees_it(args)
    args = config_through_a_file(args)
    suite = resolve_suite(config)
    cells = every_cell(config, suite)
    where = f", filter {config['filter']!r}" if (config.get("filter") or "").strip() else ""
    print(f"flashwatt: suite {suite}, {len(cells)} cells{where}", flush=True)
    status = _snakemake(args)
    if status > 128:
        return status  # interrupted: the outputs are not a finished run's
    if status == FAILED_CELLS_EXIT:
        status = 0  # every job finished, some cells failed: the report is made, the counts below decide
    report = Path("results") / suite / "report.html"
    targets = named_targets(args)
    if status == 0 and targets:
        # A run of named files (a cell rerun, say) is not the suite's run: the suite's
        # report, which its aggregate rules feed, stays as it was.
        print(f"flashwatt: {len(targets)} target(s) named; the suite's report is left as it was "
              f"(a run without targets writes {report})")
    elif status == 0:
        status = _snakemake([*args, "--report", str(report)])
        if status == 0:
            print(f"flashwatt: report written to {report.resolve()}")
    counts = status_counts(cells)
    print("flashwatt: cells by status: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for table in (t for kind in all_kinds() for t in kind.tables if t.about):
        if Path(table.path(suite)).exists():
            print(f"flashwatt: {table.about}: {Path(table.path(suite)).resolve()}")
    failed = sum(n for s, n in counts.items() if s not in EXPECTED_STATUSES and s != "missing")
    if failed and not accept_failed:
        print(f"flashwatt: {failed} cell(s) ended error, incorrect or job_failed "
              "(--accept-failed-cells to exit 0 anyway)", file=sys.stderr)
        return status or 1
    return status


def cmd_suite(args: argparse.Namespace) -> int:
    print(resolve_suite(load_config(configfiles=args.configfile, overrides=_overrides(args.config))))
    return 0


def cmd_failed(args: argparse.Namespace) -> int:
    config = load_config(configfiles=args.configfile, overrides=_overrides(args.config))
    for cell in every_cell(config, resolve_suite(config)):
        path = Path(cell.path)
        if path.exists() and read_record(path).get("status") != "ok":
            print(cell.path)
    return 0


def cmd_control_cache(args: argparse.Namespace) -> int:
    from flashwatt.control.warm_start import CACHE_VARIABLE, cache_root, clear, list_entries

    root = cache_root()
    if root is None:
        print(f"flashwatt: warm starts are switched off ({CACHE_VARIABLE}={os.environ.get(CACHE_VARIABLE)!r})")
        return 0
    if args.clear:
        print(f"flashwatt: removed {clear(root)} cache file(s) from {root}")
        return 0
    entries = list_entries(root)
    print(f"flashwatt: control cache {root}: {len(entries)} file(s)")
    for entry in entries:
        key = entry.get("key") or {}
        print(f"  {entry['path']}: {key.get('gpu')} driver {key.get('driver')}, {len(entry.get('shapes', []))} shape(s), "
              f"updated {entry.get('updated')}" if "error" not in entry else f"  {entry['path']}: {entry['error']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="flashwatt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the workflow with these Snakemake options, then write the report",
                   description="Everything after `run` goes to Snakemake (see `snakemake --help`), except "
                               "--accept-failed-cells, which makes failed cells exit 0.", add_help=False)
    helps = {"suite": "print the suite that the config resolves to",
             "failed": "print the record paths of cells whose status is not ok"}
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--configfile", nargs="*", default=[], metavar="FILE", help="config files merged over config/config.yaml")
        p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="values that override the config files")
    cache = sub.add_parser("control-cache", help="show (or --clear) the power-aware controller's warm-start cache",
                           description="show (or --clear) the power-aware controller's warm-start cache")
    cache.add_argument("--clear", action="store_true", help="remove every cache file")
    try:
        if argv[:1] == ["run"]:  # everything after `run` belongs to Snakemake
            if argv[1:] in (["-h"], ["--help"]):
                print(sub.choices["run"].description)
                return _snakemake(["--help"])
            return cmd_run(argv[1:])
        args = parser.parse_args(argv)
        return {"suite": cmd_suite, "failed": cmd_failed, "control-cache": cmd_control_cache}[args.command](args)
    except ConfigError as err:
        print(f"flashwatt: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
