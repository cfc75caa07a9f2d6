"""How much a ratio between two runs could move by noise alone: a bootstrap interval.

A cell's value on one side is the median of its samples there; the ratio is the other
side's median over the baseline's. The samples of a side are, in this order of preference:

- `runs`: the cell's value in each of two or more runs of that side (`flashwatt run
  --repeat N`, or several folders named for the side) - what a rerun of the suite moves,
  which is what a comparison must beat (one cell's timed latency moved by up to 35%
  between reruns before the timing fix, while its steps agreed within a few percent);
- `repeats`: the cell's own repeats in its one run (each timed step's latency, kept in
  the record), where the metric has them;
- `single`: one value, which carries no spread.

SciPy's bootstrap (`scipy.stats.bootstrap`, percentile method, each side resampled on its
own) resamples the sides that have two or more samples and holds a single value fixed; with
one value on both sides there is no interval. Resamples are drawn from a fixed seed, so a
comparison of the same files gives the same intervals.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from flashwatt.compare.defaults import CONFIDENCE, RESAMPLES, SEED


@dataclass(frozen=True)
class Samples:
    """One side's samples of one cell's metric and where they come from."""

    values: np.ndarray
    source: str  # runs, repeats, single

    @property
    def value(self) -> float:
        return float(np.median(self.values))


@dataclass(frozen=True)
class Ratio:
    ratio: float
    low: float | None   # the interval's ends; None where neither side has a spread
    high: float | None
    source: str         # e.g. "runs/repeats": where each side's samples came from


def samples_of(run_values: list[float], repeats: list[float] | None) -> Samples | None:
    """A side's samples: its runs' values where it has two or more, else the one run's own
    repeats (two or more), else its one value; None where it has none."""
    values = np.asarray([v for v in run_values if v is not None and np.isfinite(v)], dtype=float)
    if len(values) >= 2:
        return Samples(values, "runs")
    own = np.asarray([v for v in (repeats or []) if v is not None and np.isfinite(v)], dtype=float)
    if len(values) == 1 and len(own) >= 2:
        return Samples(own, "repeats")
    return Samples(values, "single") if len(values) == 1 else None


def _median_ratio(base, other, axis=-1):
    return np.median(other, axis=axis) / np.median(base, axis=axis)


def ratio_interval(base: Samples, other: Samples, confidence: float = CONFIDENCE,
                   resamples: int = RESAMPLES) -> Ratio | None:
    """The ratio of medians other / base with its bootstrap interval; None when the
    baseline's median is not positive (no ratio to take)."""
    if base.value <= 0 or not np.isfinite(base.value):
        return None
    ratio = other.value / base.value
    source = f"{base.source}/{other.source}"
    spread = [s for s in (base, other) if len(s.values) >= 2]
    if not spread:
        return Ratio(ratio, None, None, source)
    rng = np.random.default_rng(SEED)
    if len(spread) == 2:
        data, statistic = (base.values, other.values), _median_ratio
    elif spread[0] is base:
        data, statistic = (base.values,), lambda b, axis=-1: other.value / np.median(b, axis=axis)
    else:
        data, statistic = (other.values,), lambda o, axis=-1: np.median(o, axis=axis) / base.value
    result = stats.bootstrap(data, statistic, n_resamples=resamples, confidence_level=confidence,
                             method="percentile", vectorized=True, axis=-1, rng=rng)
    low, high = result.confidence_interval
    return Ratio(ratio, float(low), float(high), source)


def change(ratio: Ratio | None, better: str) -> str:
    """`worse`, `better` or `within noise` as the interval lies wholly above or below 1 (or
    contains it); `no interval` where there is none; `` where there is no ratio."""
    if ratio is None:
        return ""
    if ratio.low is None:
        return "no interval"
    up = "worse" if better == "lower" else "better"
    down = "better" if better == "lower" else "worse"
    if ratio.low > 1:
        return up
    if ratio.high < 1:
        return down
    return "within noise"


def mean_ratio_interval(log_ratios: np.ndarray, confidence: float = CONFIDENCE,
                        resamples: int = RESAMPLES) -> tuple[float, float | None, float | None]:
    """A group of cells' geometric-mean ratio, with a bootstrap interval over its cells
    (how consistently the cells moved); no interval for one cell."""
    log_ratios = np.asarray(log_ratios, dtype=float)
    mean = float(np.exp(log_ratios.mean()))
    if len(log_ratios) < 2:
        return mean, None, None
    result = stats.bootstrap((log_ratios,), np.mean, n_resamples=resamples, confidence_level=confidence,
                             method="percentile", vectorized=True, axis=-1, rng=np.random.default_rng(SEED))
    low, high = result.confidence_interval
    return mean, float(np.exp(low)), float(np.exp(high))
