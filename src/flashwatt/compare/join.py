"""The cells of two sides joined by what they measure, kind by kind, into one table.

A cell is matched by `Kind.measures` (its row less suite and id: kernel, shape, precision,
mask, pass for an attention cell), so the same cells of two suites, devices or commits meet.
Each joined row has both sides' statuses, devices and commits, and for every metric of the
kind both values, their ratio (other over baseline), its interval and whether the change is
beyond noise (flashwatt.compare.intervals). A cell on one side only is kept, with `presence`
saying which side has it; its ratios are empty.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from flashwatt.cell_files import RECORD_SUFFIX, RESULTS_ROOT
from flashwatt.compare.intervals import CONFIDENCE, RESAMPLES, change, ratio_interval, samples_of
from flashwatt.compare.sides import Run, Side
from flashwatt.kind import CompareMetric, Kind, resolve
from flashwatt.kinds import kind_named

BOTH, ONLY_BASE, ONLY_OTHER = "both", "baseline only", "other only"


@dataclass
class CellRuns:
    """One cell on one side: its rows in each run that has it, and the runs."""

    label: str
    measures: dict
    rows: list[pd.Series]
    runs: list[Run]


def cell_label(cell) -> str:
    """The cell's id without its suite: what it measures, as its files name it."""
    prefix = f"{cell.suite}/"
    return cell.id[len(prefix):] if cell.id.startswith(prefix) else cell.id


def cells_of(side: Side, kind: Kind) -> dict[tuple, CellRuns]:
    """A side's cells of one kind, by what they measure (each with its rows in every run)."""
    out: dict[tuple, CellRuns] = {}
    for run in side.runs:
        table = run.tables.get(kind.name)
        if table is None:
            continue
        for _, row in table.iterrows():
            cell = kind.cell.from_path(f"{RESULTS_ROOT}/{row['cell_id']}{RECORD_SUFFIX}")
            measures = kind.measures(cell)
            key = tuple(measures.items())
            entry = out.setdefault(key, CellRuns(cell_label(cell), measures, [], []))
            entry.rows.append(row)
            entry.runs.append(run)
    return out


def _text(values) -> str:
    seen = [str(v) for v in dict.fromkeys(values) if v is not None and not (isinstance(v, float) and np.isnan(v))]
    return ",".join(seen)


def _side_columns(entry: CellRuns | None, suffix: str) -> dict:
    if entry is None:
        return {f"status_{suffix}": None, f"runs_{suffix}": 0, f"suite_{suffix}": None,
                f"device_{suffix}": None, f"device_type_{suffix}": None}
    return {f"status_{suffix}": _text(r.get("status") for r in entry.rows), f"runs_{suffix}": len(entry.rows),
            f"suite_{suffix}": _text(r.get("suite") for r in entry.rows),
            f"device_{suffix}": _text(r.get("device") for r in entry.rows),
            f"device_type_{suffix}": _text(r.get("device_type") for r in entry.rows)}


def _metric_samples(entry: CellRuns, metric: CompareMetric):
    """The side's samples of a metric: ok runs' values, and the one run's own repeats."""
    ok = [(row, run) for row, run in zip(entry.rows, entry.runs) if row.get("status") == "ok"]
    values = [row.get(metric.column) for row, _ in ok]
    values = [float(v) for v in values if v is not None and not pd.isna(v)]
    repeats = None
    if len(values) == 1 and metric.samples:
        record = ok[0][1].record(ok[0][0])
        repeats = resolve(metric.samples)(record) if record is not None else None
    return samples_of(values, repeats)


def _metric_columns(base: CellRuns | None, other: CellRuns | None, metric: CompareMetric,
                    confidence: float, resamples: int) -> dict:
    name = metric.name
    a = _metric_samples(base, metric) if base else None
    b = _metric_samples(other, metric) if other else None
    ratio = ratio_interval(a, b, confidence, resamples) if a is not None and b is not None else None
    return {f"{name}_base": a.value if a else np.nan, f"{name}_other": b.value if b else np.nan,
            f"{name}_ratio": ratio.ratio if ratio else np.nan,
            f"{name}_low": ratio.low if ratio and ratio.low is not None else np.nan,
            f"{name}_high": ratio.high if ratio and ratio.high is not None else np.nan,
            f"{name}_from": ratio.source if ratio else "", f"{name}_change": change(ratio, metric.better)}


def _row(kind: Kind, base: CellRuns | None, other: CellRuns | None, sides: tuple[Side, Side],
         confidence: float, resamples: int) -> dict:
    entry = base or other
    presence = BOTH if base and other else (ONLY_BASE if base else ONLY_OTHER)
    group = kind.group_keys(entry.measures)
    family = kind.family_keys(entry.measures)
    row = {"kind": kind.name, "baseline": sides[0].label, "other": sides[1].label, "cell": entry.label,
           "compare_group": " ".join(str(entry.measures[k]) for k in group if entry.measures.get(k) not in ("", None)),
           "compare_family": " ".join(f"{k}={entry.measures[k]}" for k in family), "presence": presence,
           **_side_columns(base, "base"), **_side_columns(other, "other")}
    for metric in kind.compare_metrics:
        row.update(_metric_columns(base, other, metric, confidence, resamples))
    row["measures"] = json.dumps(entry.measures, default=str)
    return row


def join_kind(kind: Kind, base: Side, other: Side, confidence: float = CONFIDENCE,
              resamples: int = RESAMPLES) -> pd.DataFrame:
    """One row per cell of the kind on either side, in the baseline's order then the other's."""
    a, b = cells_of(base, kind), cells_of(other, kind)
    keys = list(dict.fromkeys([*a, *b]))
    rows = [_row(kind, a.get(key), b.get(key), (base, other), confidence, resamples) for key in keys]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    # what the cell measures, as columns of its own (the kind's keys) after the labels, and
    # as JSON in `measures` (the keys differ between kinds, which share the table)
    measures = pd.DataFrame([json.loads(m) for m in frame["measures"]], index=frame.index)
    return pd.concat([frame.iloc[:, :7], measures, frame.iloc[:, 7:]], axis=1)


def join(base: Side, others: list[Side], confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> pd.DataFrame:
    """Every kind either side has, every other side against the baseline, in one table."""
    frames = []
    for other in others:
        for name in sorted({*base.kinds(), *other.kinds()}):
            frames.append(join_kind(kind_named(name), base, other, confidence, resamples))
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
