"""`flashwatt run --repeat N ...`: the suite run N times, every cell measured again each
time, each run kept under results/<suite>/runs/<i>/ for `flashwatt compare`.

A kept run holds each kind's tables as the run wrote them, its records under cells/ (laid
out as under results/cells/) and run.json (when, the command, the config's measure and
suite sections, the run's exit status). Numbering continues after the runs already kept,
so a second `--repeat 3` adds runs 4 to 6. results/<suite>/ itself (tables, figures,
report) is the last run's, as after a plain `flashwatt run`.

Each run is `flashwatt run` with `--forcerun` on every cell rule of the suite's kinds, so no
run reuses another's records: the spread between runs is what a rerun of the suite moves.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Callable

from flashwatt.config import resolve_suite
from flashwatt.config_error import ConfigError
from flashwatt.kinds import kind_named, plan_suite
from flashwatt.compare.sides import CELLS_FOLDER, RUN_INFO, RUNS_FOLDER
from flashwatt.provenance import utc_now
from flashwatt.records import atomic_write

OPTION = "--repeat"


def repeat_count(argv: list[str]) -> tuple[int | None, list[str]]:
    """(N, the other arguments) of a `run` command line; N is None without --repeat."""
    count, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == OPTION or arg.startswith(OPTION + "="):
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{OPTION} {value!r}: give how many times to run the suite, a whole number >= 1")
            count = int(value)
            continue
        rest.append(arg)
        i += 1
    return count, rest


def next_run_number(suite_folder: Path) -> int:
    runs = suite_folder / RUNS_FOLDER
    taken = [int(p.name) for p in runs.iterdir() if p.name.isdigit()] if runs.is_dir() else []
    return max(taken, default=0) + 1


def keep_run(config: dict, suite: str, number: int, info: dict, root: Path = Path(".")) -> Path:
    """Copy the suite's tables and records into results/<suite>/runs/<number>/."""
    suite_folder = root / "results" / suite
    dest = suite_folder / RUNS_FOLDER / str(number)
    if dest.exists():
        raise ConfigError(f"{dest} exists already: a kept run is never overwritten")
    dest.mkdir(parents=True)
    for kind_name, cells in plan_suite(config, suite, filtered=False).items():
        kind = kind_named(kind_name)
        for table in kind.tables:
            src = root / table.path(suite)
            if src.is_file():
                shutil.copy2(src, dest / table.name)
        for cell in cells:
            src = root / cell.path
            if src.is_file():
                target = dest / CELLS_FOLDER / Path(cell.path).relative_to("results/cells")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    text = json.dumps(info, indent=1, default=str) + "\n"
    atomic_write(dest / RUN_INFO, lambda tmp: Path(tmp).write_text(text))
    return dest


def cell_rules(config: dict, suite: str) -> list[str]:
    return [f"{kind_named(name).rule_prefix}cell" for name in plan_suite(config, suite)]


def run_repeated(argv: list[str], run: Callable[[list[str]], int], config_of: Callable[[list[str]], dict]) -> int:
    """Run the suite N times (`run` is `flashwatt run`'s own function) and keep each run."""
    count, args = repeat_count(argv)
    config = config_of(args)
    suite = resolve_suite(config)
    first = next_run_number(Path("results") / suite)
    for i in range(count):
        number = first + i
        print(f"flashwatt: run {i + 1} of {count} (kept as results/{suite}/{RUNS_FOLDER}/{number})", flush=True)
        started = utc_now()
        status = run([*args, "--forcerun", *cell_rules(config, suite)])
        if status > 128:
            return status  # interrupted: nothing of this run is kept
        info = {"run": number, "repeat": i + 1, "of": count, "started": started, "finished": utc_now(),
                "exit_status": status, "command": ["flashwatt", "run", *argv], "suite": suite,
                "measure": config.get("measure"), "suite_config": config["suites"][suite],
                "filter": config.get("filter") or ""}
        dest = keep_run(config, suite, number, info)
        print(f"flashwatt: run {i + 1} of {count} kept in {dest.resolve()}", flush=True)
        if status != 0:
            print(f"flashwatt: run {i + 1} of {count} exited {status}; the repeats stop here", file=sys.stderr)
            return status
    return 0
