"""A comparison summarised per kernel (a kind's group) and per shape family.

For each pair of sides, kind, metric and group: how many cells have a ratio, their
geometric-mean ratio with a bootstrap interval over the cells (how consistently they
moved; flashwatt.compare.intervals), and how many cells got worse or better beyond their
own noise, or stayed within it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from flashwatt.compare.intervals import CONFIDENCE, RESAMPLES, mean_ratio_interval
from flashwatt.kinds import kind_named

BY = {"kernel": "compare_group", "family": "compare_family"}


def metrics_with_ratios(frame: pd.DataFrame, kind_name: str) -> list:
    """The kind's metrics that have a ratio for at least one cell of `frame`."""
    kind = kind_named(kind_name)
    return [m for m in kind.compare_metrics
            if f"{m.name}_ratio" in frame and frame[f"{m.name}_ratio"].notna().any()]


def summarise(frame: pd.DataFrame, by: str, confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> pd.DataFrame:
    """One row per (other side, kind, metric, group or family) with a ratio."""
    column = BY[by]
    rows = []
    if frame.empty:
        return pd.DataFrame()
    for (other, kind_name, label), cells in frame.groupby(["other", "kind", column], sort=False, dropna=False):
        for metric in metrics_with_ratios(cells, kind_name):
            ratios = cells[f"{metric.name}_ratio"]
            ok = cells[ratios.notna() & (ratios > 0)]
            if ok.empty:
                continue
            mean, low, high = mean_ratio_interval(np.log(ok[f"{metric.name}_ratio"].to_numpy(float)), confidence,
                                                  resamples)
            changes = ok[f"{metric.name}_change"].value_counts()
            rows.append({"baseline": cells["baseline"].iloc[0], "other": other, "kind": kind_name, by: label,
                         "metric": metric.name, "label": metric.label, "better": metric.better, "cells": len(ok),
                         "geomean_ratio": mean, "low": low, "high": high,
                         "worse": int(changes.get("worse", 0)), "better_cells": int(changes.get("better", 0)),
                         "within_noise": int(changes.get("within noise", 0)),
                         "no_interval": int(changes.get("no interval", 0))})
    return pd.DataFrame(rows)
