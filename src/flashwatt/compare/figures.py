"""The comparison's figures, drawn and written the way every suite figure is (flashwatt.figure_base):

- a ratio heat map per kind and metric: a panel per shape family, a row per kernel (the
  kind's group), a column per remaining shape (sequence length and batch for attention);
  each square the ratio other / baseline, red where it got worse, blue where better, marked
  `*` where the change is beyond the cell's noise and `?` where it has no interval;
- per kind, the geometric-mean ratio of each kernel for every metric, with its interval
  over the cells, against the line at 1.

Titles name both sides ("<other> over <baseline>"); the line under them, as under every
suite figure, says which suites and devices the cells come from and how many were ok.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flashwatt.figure_base import FigureSpec, Source, nothing_to_draw, write_figure
from flashwatt.kind import CompareMetric
from flashwatt.kinds import kind_named
from flashwatt.plotting import plt, sns

MAX_PANELS = 12  # shape families drawn in one heat map; the rest are in the tables
MARKS = {"worse": "*", "better": "*", "no interval": "?"}


def both_sides(frame: pd.DataFrame) -> pd.DataFrame:
    """Each compared cell once per side (suite, device, status), for the line under the title."""
    parts = []
    for side in ("base", "other"):
        part = frame[frame[f"runs_{side}"] > 0]
        parts.append(pd.DataFrame({"suite": part[f"suite_{side}"].str.split(",").str[0],
                                   "device": part[f"device_{side}"].str.split(",").str[0],
                                   "device_type": part[f"device_type_{side}"].str.split(",").str[0],
                                   "status": part[f"status_{side}"].str.split(",").str[0]}))
    return pd.concat(parts, ignore_index=True)


def _column_label(measures: dict, skip: set[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in measures.items() if k not in skip and v not in ("", None))


def _heat_panel(ax, cells: pd.DataFrame, metric: CompareMetric, limit: float):
    ratio = cells[f"{metric.name}_ratio"].to_numpy(float)
    logs = pd.DataFrame({"row": cells["compare_group"], "col": cells["_column"], "v": np.log2(ratio),
                         "mark": [f"{r:.2f}{MARKS.get(c, '')}" for r, c in zip(ratio, cells[f"{metric.name}_change"])]})
    values = logs.pivot_table(index="row", columns="col", values="v", aggfunc="first", sort=False)
    marks = logs.pivot_table(index="row", columns="col", values="mark", aggfunc="first", sort=False)
    cmap = "RdBu_r" if metric.better == "lower" else "RdBu"
    sns.heatmap(values, ax=ax, cmap=cmap, center=0, vmin=-limit, vmax=limit, annot=marks.reindex_like(values),
                fmt="", cbar=False, linewidths=0.5, annot_kws={"fontsize": 7})
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.tick_params(axis="y", labelrotation=0, labelsize=8)


def draw_heat_map(frame: pd.DataFrame, metric: CompareMetric) -> plt.Figure:
    """Ratio heat map by shape: a panel per family, kernels down, shapes across."""
    cells = frame[frame[f"{metric.name}_ratio"].notna() & (frame[f"{metric.name}_ratio"] > 0)].copy()
    if cells.empty:
        return nothing_to_draw(f"no cell has {metric.label} on both sides")
    kind = kind_named(cells["kind"].iloc[0])
    measures = cells["measures"].map(json.loads)
    skip = {*kind.group_keys(measures.iloc[0]), *kind.family_keys(measures.iloc[0])}
    cells["_column"] = [_column_label(m, skip) or "cell" for m in measures]
    families = list(dict.fromkeys(cells["compare_family"]))[:MAX_PANELS]
    limit = max(0.05, float(np.nanmax(np.abs(np.log2(cells[f"{metric.name}_ratio"].to_numpy(float))))))
    widths = max(len(set(cells.loc[cells["compare_family"] == f, "_column"])) for f in families)
    heights = [cells.loc[cells["compare_family"] == f, "compare_group"].nunique() for f in families]
    fig, axes = plt.subplots(len(families), 1, squeeze=False, height_ratios=heights, layout="constrained",
                             figsize=(max(7.5, 1.1 * widths + 3.0), 1.2 + sum(0.45 * h + 1.2 for h in heights)))
    for ax, family in zip(axes[:, 0], families):
        _heat_panel(ax, cells[cells["compare_family"] == family], metric, limit)
        ax.set_title(family, fontsize=8)
    mappable = plt.cm.ScalarMappable(cmap="RdBu_r" if metric.better == "lower" else "RdBu",
                                     norm=plt.Normalize(-limit, limit))
    bar = fig.colorbar(mappable, ax=axes[:, 0].tolist(), shrink=0.8, pad=0.02)
    ticks = np.linspace(-limit, limit, 5)
    bar.set_ticks(ticks, labels=[f"{2 ** t:.2f}x" for t in ticks])
    bar.set_label("ratio (red: worse)")
    return fig


def draw_group_bars(summary: pd.DataFrame) -> plt.Figure:
    """Each kernel's geometric-mean ratio per metric, with its interval over the cells."""
    if summary.empty:
        return nothing_to_draw("no metric has a ratio for any cell")
    metrics = list(dict.fromkeys(summary["label"]))
    groups = list(dict.fromkeys(summary["kernel"]))
    columns = min(3, len(metrics))
    rows = -(-len(metrics) // columns)
    fig, axes = plt.subplots(rows, columns, squeeze=False, layout="constrained",
                             figsize=(3.4 * columns + 1.5, rows * (0.45 * len(groups) + 1.6)))
    for ax in axes.flat[len(metrics):]:
        ax.set_axis_off()
    for ax, label in zip(axes.flat, metrics):
        part = summary[summary["label"] == label].set_index("kernel").reindex(groups)
        y = np.arange(len(groups))
        ratio = part["geomean_ratio"].to_numpy(float)
        worse = (ratio > 1) == (part["better"] == "lower").to_numpy()
        ax.barh(y, ratio - 1, left=1, color=np.where(worse, "#c0504d", "#4f81bd"), height=0.6)
        low = np.nan_to_num(ratio - part["low"].to_numpy(float), nan=0.0)
        high = np.nan_to_num(part["high"].to_numpy(float) - ratio, nan=0.0)
        ax.errorbar(ratio, y, xerr=[low, high], fmt="none", ecolor="black", capsize=3, linewidth=1)
        ax.axvline(1, color="black", linewidth=0.8)
        ax.set_yticks(y, groups)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("ratio, geometric mean over cells")
    return fig


@dataclass(frozen=True)
class Pair:
    """One other side against the baseline, as the figures name them."""

    number: int
    baseline: str
    other: str

    def title(self, what: str) -> str:
        return f"{what}: {self.other} over {self.baseline}"


def _comparison(pair: Pair, kind_name: str):
    def read(path: str) -> pd.DataFrame:
        frame = pd.read_parquet(path)
        return frame[(frame["other"] == pair.other) & (frame["kind"] == kind_name)].reset_index(drop=True)
    return read


def _summary(pair: Pair, kind_name: str):
    def read(path: str) -> pd.DataFrame:
        frame = pd.read_parquet(path)
        if frame.empty:
            return frame
        return frame[(frame["other"] == pair.other) & (frame["kind"] == kind_name)].reset_index(drop=True)
    return read


def figure_specs(pair: Pair, kind_name: str, metrics: list[CompareMetric]) -> dict[str, FigureSpec]:
    """The figures of one pair and kind, by file stem."""
    source = Source(("comparison",), _comparison(pair, kind_name), both_sides)
    specs = {}
    for metric in (m for m in metrics if m.heat_map):
        name = f"{pair.number}-{kind_name}-{metric.name}"
        specs[name] = FigureSpec(
            name, "png", pair.title(f"{metric.label}, {kind_name} cells"),
            f"Ratio of {metric.label} ({pair.other} over {pair.baseline}) for each {kind_name} cell, by shape: "
            f"red is worse, blue better; * marks a change beyond the cell's noise, ? a cell with no interval.",
            lambda data, metric=metric: draw_heat_map(data, metric), source)
    summary = Source(("summary", "comparison"), lambda s, c: (_summary(pair, kind_name)(s),
                                                              _comparison(pair, kind_name)(c)),
                     lambda data: both_sides(data[1]))
    name = f"{pair.number}-{kind_name}-kernels"
    specs[name] = FigureSpec(
        name, "png", pair.title(f"each kernel's ratio, {kind_name} cells"),
        f"Geometric mean over each kernel's cells of the ratio {pair.other} over {pair.baseline}, per metric, "
        f"with its 95% interval over the cells; red is worse, blue better.",
        lambda data: draw_group_bars(data[0]), summary)
    return specs


def write_figures(pair: Pair, kind_name: str, metrics: list[CompareMetric], tables: dict[str, Path],
                  folder: Path) -> dict[str, tuple[Path, FigureSpec]]:
    """Write one pair's figures of a kind into `folder`; {stem: (path, spec)}."""
    out = {}
    for name, spec in figure_specs(pair, kind_name, metrics).items():
        path = folder / f"{name}.png"
        write_figure(spec, tables, path)
        out[name] = (path, spec)
    return out
