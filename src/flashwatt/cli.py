"""`flashwatt`: run the workflow and write its report, name the suite, list failed cells.

    flashwatt run [--accept-failed-cells] [snakemake options...]
        the configured suite (the same config Snakemake sees: config/config.yaml, then any
        --configfile, then --config), then results/<suite>/report.html (not when files or
        rules are named: that run is not the suite's); ends with the count
        of cells per status and exits 1 when a cell ended error, incorrect, diverged or job_failed
    flashwatt suite [snakemake options...]
        which suite `auto` (or the config) resolves to
    flashwatt failed [snakemake options...]
        record paths of cells whose status is not ok, for
        `snakemake --profile slurm --forcerun $(flashwatt failed --profile slurm)`
    flashwatt run --repeat N [snakemake options...]
        the suite N times, every cell measured again each time, each run kept under
        results/<suite>/runs/<i>/ (flashwatt.compare.repeat)
    flashwatt compare BASELINE OTHER [...] [--fail-if METRIC:+PCT% ...] [-o DIR]
        the cells of runs side by side, each ratio with its interval; exits 1 when a
        --fail-if rule finds a cell worse beyond its noise (docs/compare.md)
    flashwatt control-cache [--clear]
        where the power-aware controller keeps what it learned (its warm starts), and what is
        there; --clear removes it (flashwatt.control.warm_start)

`run`, `suite` and `failed` read their Snakemake options as Snakemake does
(flashwatt.command_line): the profile (--profile, or $SNAKEMAKE_PROFILE), its config files,
--configfile and --config, so they name the suite and cells of `snakemake` run with the
same options.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

from flashwatt.command_line import config_as_snakemake_sees_it, config_through_a_file, named_targets, run_config
from flashwatt.compare import command as compare_parser
from flashwatt.config import ConfigError, resolve_suite
from flashwatt.failures import FAILED_CELLS_EXIT, is_failure
from flashwatt.kinds import all_kinds, every_cell
from flashwatt.records import read_record
from flashwatt.snakemake_process import run_snakemake

# Snakemake options after which there is nothing to report: pass them through untouched.
NO_REPORT_OPTIONS = {"-h", "--help", "--version", "-v", "--unlock", "-n", "--dry-run", "--dryrun", "--lint",
                     "--list", "-l", "--list-target-rules", "--summary", "-S", "--detailed-summary", "-D",
                     "--report", "--dag", "--rulegraph", "--filegraph", "--cleanup-metadata", "--list-changes",
                     "--lc", "--list-code-changes", "--list-input-changes", "--li", "--list-params-changes",
                     "--lp", "--delete-all-output", "--delete-temp-output"}
# ...of which these read no config at all.
NO_CONFIG_OPTIONS = {"-h", "--help", "--version", "-v"}


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
    if NO_CONFIG_OPTIONS & set(args):
        return run_snakemake(args)
    if NO_REPORT_OPTIONS & set(args):  # dry run, unlock...: nothing ran, nothing to report
        return run_snakemake(config_through_a_file(args))
    config = run_config(args)
    args = config_through_a_file(args)
    suite = resolve_suite(config)
    cells = every_cell(config, suite)
    where = f", filter {config['filter']!r}" if (config.get("filter") or "").strip() else ""
    print(f"flashwatt: suite {suite}, {len(cells)} cells{where}", flush=True)
    status = run_snakemake(args)
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
        status = run_snakemake([*args, "--report", str(report)])
        if status == 0:
            print(f"flashwatt: report written to {report.resolve()}")
    counts = status_counts(cells)
    print("flashwatt: cells by status: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for table in (t for kind in all_kinds() for t in kind.tables if t.about):
        if Path(table.path(suite)).exists():
            print(f"flashwatt: {table.about}: {Path(table.path(suite)).resolve()}")
    failed = sum(n for s, n in counts.items() if s != "missing" and is_failure(s))
    if failed and not accept_failed:
        print(f"flashwatt: {failed} cell(s) ended error, incorrect, diverged or job_failed "
              "(--accept-failed-cells to exit 0 anyway)", file=sys.stderr)
        return status or 1
    return status


def cmd_suite(args: list[str]) -> int:
    print(resolve_suite(config_as_snakemake_sees_it(args)))
    return 0


def cmd_failed(args: list[str]) -> int:
    config = config_as_snakemake_sees_it(args)
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
                               "--accept-failed-cells, which makes failed cells exit 0, and --repeat N, which "
                               "runs the suite N times and keeps each run (docs/compare.md).", add_help=False)
    helps = {"suite": "print the suite that the config resolves to",
             "failed": "print the record paths of cells whose status is not ok"}
    for name, text in helps.items():
        sub.add_parser(name, help=text, add_help=False,
                       description=f"{text}. Takes Snakemake's options and reads them as Snakemake does: --profile "
                                   "(or $SNAKEMAKE_PROFILE) with its config files, --configfile, --config.")
    cache = sub.add_parser("control-cache", help="show (or --clear) the power-aware controller's warm-start cache",
                           description="show (or --clear) the power-aware controller's warm-start cache")
    cache.add_argument("--clear", action="store_true", help="remove every cache file")
    compare_parser.add_parser(sub)
    takes_snakemake_options = {"run": cmd_run, "suite": cmd_suite, "failed": cmd_failed}
    try:
        if argv[:1] and argv[0] in takes_snakemake_options:  # everything after it belongs to Snakemake
            if argv[1:] in (["-h"], ["--help"]):
                print(sub.choices[argv[0]].description)
                return run_snakemake(["--help"]) if argv[0] == "run" else 0
            if argv[0] == "run" and any(a == "--repeat" or a.startswith("--repeat=") for a in argv[1:]):
                from flashwatt.compare.repeat import run_repeated  # the suite N times, each run kept

                return run_repeated(argv[1:], cmd_run, config_as_snakemake_sees_it)
            return takes_snakemake_options[argv[0]](argv[1:])
        args = parser.parse_args(argv)
        return {"control-cache": cmd_control_cache, "compare": compare_parser.compare}[args.command](args)
    except ConfigError as err:
        print(f"flashwatt: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `flashwatt failed | head`: the reader stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
