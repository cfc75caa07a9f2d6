"""What `flashwatt compare` writes (flashwatt.compare.command lists the files), and its verdict."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from flashwatt.compare import figures as compare_figures
from flashwatt.compare import page
from flashwatt.compare.header import settings_rows, side_header
from flashwatt.compare.join import BOTH, join
from flashwatt.compare.regression import parse_rule, regressions, unchecked
from flashwatt.compare.sides import load_side
from flashwatt.compare.summaries import metrics_with_ratios, summarise
from flashwatt.config_error import ConfigError
from flashwatt.records import atomic_write

METHOD = (
    "Cells are matched by what they measure (for attention: kernel, precision, shape, mask, pass), whatever "
    "suite, device or commit measured them. Each ratio is the other side's median over the baseline's. Its "
    "{level:.0%} interval is SciPy's percentile bootstrap ({resamples} resamples) over each side's samples: the "
    "cell's values in each run where a side has two or more runs (flashwatt run --repeat N), else its own repeats "
    "in its one run (each timed step's latency), else none. 'worse' and 'better' mark cells whose whole interval "
    "lies on one side of 1, beyond the noise; 'within noise' an interval that contains 1; 'no interval' a cell "
    "with one value on each side. Summaries per kernel and per shape family give the geometric mean of their "
    "cells' ratios with a bootstrap interval over the cells.")



def _labels(args) -> list[str | None]:
    if not args.labels:
        return [None] * len(args.sides)
    labels = [x.strip() for x in args.labels.split(",")]
    if len(labels) != len(args.sides) or len(set(labels)) != len(labels) or not all(labels):
        raise ConfigError(f"--labels {args.labels!r}: give {len(args.sides)} distinct names, one per side")
    return labels


def _write(frame: pd.DataFrame, folder: Path, stem: str, parquet: bool = True) -> dict[str, Path]:
    paths = {"csv": folder / f"{stem}.csv"}
    atomic_write(paths["csv"], lambda tmp: frame.to_csv(tmp, index=False, float_format="%.6g"))
    if parquet:
        paths["parquet"] = folder / f"{stem}.parquet"
        atomic_write(paths["parquet"], lambda tmp: frame.to_parquet(tmp, index=False))
    return paths


def _section(pair, kind_name: str, cells: pd.DataFrame, by_kernel, by_family, tables, folder: Path,
             figures: bool) -> dict:
    """One pair and kind of the page: counts, summaries, figures, cells."""
    metrics = metrics_with_ratios(cells, kind_name)
    written = compare_figures.write_figures(pair, kind_name, metrics, tables, folder / "figures") if figures else {}
    both = cells[cells["presence"] == BOTH]
    pick = lambda s: s[(s["other"] == pair.other) & (s["kind"] == kind_name)] if not s.empty else s  # noqa: E731
    return {
        "title": f"{kind_name} cells: {pair.other} against {pair.baseline}",
        "counts": (f"{len(both)} cells on both sides, {int((cells['presence'] != BOTH).sum())} on one side only; "
                   f"compared: {', '.join(m.label for m in metrics) or 'nothing (no metric on both sides)'}."),
        "summaries": [("Per kernel", page.summary_table(pick(by_kernel), "kernel", f"by-kernel-{pair.number}-{kind_name}")),
                      ("Per shape family", page.summary_table(pick(by_family), "family",
                                                              f"by-family-{pair.number}-{kind_name}"))],
        "figures": [{"src": f"figures/{path.name}", "alt": spec.title,
                     "caption": spec.caption} for name, (path, spec) in written.items()],
        "cells": page.cells_table(both, metrics, f"cells-{pair.number}-{kind_name}"),
        "one_side": page.one_side_table(cells, f"one-side-{pair.number}-{kind_name}"),
    }


def _check(frame: pd.DataFrame, rules: list, folder: Path) -> tuple[dict | None, pd.DataFrame]:
    if not rules:
        return None, pd.DataFrame()
    failed = regressions(frame, rules)
    _write(failed, folder, "regressions", parquet=False)
    notes = [f"{r}: no cell has this metric on both sides, so nothing was checked" for r in unchecked(frame, rules)]
    verdict = (f"{len(failed)} failure(s) in {failed['cell'].nunique()} cell(s)." if len(failed)
               else "No cell got worse beyond its interval and the threshold.")
    return {"rules": ", ".join(map(str, rules)), "verdict": verdict, "rows": failed.to_dict("records"),
            "notes": notes}, failed


def write_comparison(args) -> int:
    """The comparison `flashwatt compare` asked for: its files, its report, its exit status."""
    rules = [parse_rule(text) for text in args.fail_if]
    if len(args.sides) < 2:
        raise ConfigError("compare: name at least two sides, the baseline first")
    if not 0 < args.confidence < 1 or args.resamples < 100:
        raise ConfigError("--confidence must lie between 0 and 1 and --resamples be at least 100")
    sides = [load_side(arg, label) for arg, label in zip(args.sides, _labels(args))]
    if len({s.label for s in sides}) != len(sides):
        raise ConfigError("two sides have the same label: name them with --labels")
    frame = join(sides[0], sides[1:], args.confidence, args.resamples)
    if frame.empty:
        raise ConfigError("no cells on any side: nothing to compare")
    folder = Path(args.out)
    tables = {"comparison": _write(frame, folder, "comparison")["parquet"]}
    by_kernel = summarise(frame, "kernel", args.confidence, args.resamples)
    by_family = summarise(frame, "family", args.confidence, args.resamples)
    tables["summary"] = _write(by_kernel, folder, "by_kernel")["parquet"]
    _write(by_family, folder, "by_family")
    check, failed = _check(frame, rules, folder)
    sections = []
    for number, other in enumerate(sides[1:], start=1):
        pair = compare_figures.Pair(number, sides[0].label, other.label)
        for kind_name, cells in frame[frame["other"] == other.label].groupby("kind", sort=True):
            sections.append(_section(pair, kind_name, cells, by_kernel, by_family, tables, folder,
                                     not args.no_figures))
    headers = [side_header(s) for s in sides]
    title = f"flashwatt comparison: {', '.join(s.label for s in sides[1:])} against {sides[0].label}"
    page.render(title, METHOD.format(level=args.confidence, resamples=args.resamples),
                [{"label": s.label, "header": h} for s, h in zip(sides, headers)], settings_rows(headers),
                sections, check, folder / "report.html")
    print(f"flashwatt: compared {len(frame)} cell row(s); table {tables['comparison'].resolve()}")
    print(f"flashwatt: report written to {(folder / 'report.html').resolve()}")
    if check is not None:
        for note in check["notes"]:
            print(f"flashwatt: {note}", file=sys.stderr)
        for row in failed.itertuples():
            print(f"flashwatt: regression: {row.kind} {row.cell} against {row.other}: {row.why}", file=sys.stderr)
        if len(failed):
            print(f"flashwatt: {check['verdict']}", file=sys.stderr)
            return 1
        print(f"flashwatt: {check['verdict']}")
    return 0
