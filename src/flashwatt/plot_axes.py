"""Axes a reader can read at a glance, shared by every kind's figures.

Matplotlib labels a log axis that spans less than a decade with its minor ticks in
scientific notation (4×10⁻¹, 6×10⁻¹) and a base-2 axis with powers (2⁵, 2⁶). The
helpers here put ticks on round values (0.5, 1, 2 or 0.8, 0.9, 1) and the sequence
lengths that were run, and label them as plain numbers with an optional unit.

A grid of facets (seaborn's FacetGrid) has a facet for every row and column value, run
or not: `drop_empty_facets` removes those without data, so no figure shows an empty axis.
A bar that is missing from its place in a group of bars is marked there with why
(`mark_missing_bars`, at the places `bar_slots` gives), never left a silent gap.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator
from matplotlib.transforms import blended_transform_factory

# Round values per decade for a log axis spanning a decade or more; the sparser row is
# used when the denser one would put more than MAX_TICKS on the axis.
DECADE_STEPS = ((1, 2, 5), (1, 3), (1,))
MAX_TICKS = 8
# The width seaborn gives a category's group of bars (its default), shared by the bars of its hue levels.
BAR_GROUP_WIDTH = 0.8
# The artist id of a missing bar's mark, by which a reader of the figure object finds them.
MISSING_BAR = "missing bar"


def plain_number(value: float) -> str:
    """0.5, 1, 20, 0.003: positional, never an exponent; rounded to 6 significant digits
    first, so a tick computed as 0.30000000000000004 reads 0.3."""
    return np.format_float_positional(float(f"{value:.6g}"), trim="-")


def log_ticks(low: float, high: float) -> list[float]:
    """Round tick values inside [low, high] for a log axis, at least two where the range
    allows: 1-2-5 per decade over wide ranges, evenly spaced round values over narrow ones."""
    if not (low > 0 and high > low):
        return []
    if high / low >= 10:
        for steps in DECADE_STEPS:
            ticks = [s * 10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                     for s in steps]
            ticks = [t for t in ticks if low <= t <= high]
            if len(ticks) <= MAX_TICKS:
                return ticks
        return ticks
    ticks = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
    return [float(t) for t in ticks if low <= t <= high and t > 0]


def _plain_log(axis, get_lim, set_lim, unit: str) -> None:
    low, high = get_lim()
    set_lim(low, high)
    axis.set_major_locator(FixedLocator(log_ticks(low, high)))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda value, _: plain_number(value) + unit))


def plain_log_y(ax, unit: str = "") -> None:
    """Label a log y axis with round plain numbers (and `unit`, e.g. '×'); the limits
    are frozen first, so the ticks are chosen for the range the axis shows."""
    _plain_log(ax.yaxis, ax.get_ylim, ax.set_ylim, unit)


def plain_log_x(ax, unit: str = "") -> None:
    """`plain_log_y` for an x axis."""
    _plain_log(ax.xaxis, ax.get_xlim, ax.set_xlim, unit)


def sequence_length_label(length: int) -> str:
    """512, 1k, 16k: sequence lengths as attention papers write them."""
    return f"{length // 1024}k" if length >= 1024 and length % 1024 == 0 else str(length)


def sequence_length_x(ax, lengths) -> None:
    """A log-2 x axis with a tick at each sequence length that was run, labelled plainly."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in np.asarray(lengths, dtype=float) if np.isfinite(v)})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: sequence_length_label(int(round(value)))))


def drop_empty_facets(grid, drawn) -> None:
    """Remove the facets of a seaborn FacetGrid whose key (as in `grid.axes_dict`) is not
    among `drawn`, the keys of the facets that have data. A kept facet that a removed one
    sat below (or right of) gets the tick labels and axis label the grid had put on the
    removed facet only."""
    removed = [ax for key, ax in grid.axes_dict.items() if key not in set(drawn)]
    if not removed:
        return
    xlabel = next((ax.get_xlabel() for ax in grid.axes.flat if ax.get_xlabel()), "")
    ylabel = next((ax.get_ylabel() for ax in grid.axes.flat if ax.get_ylabel()), "")
    for ax in removed:
        ax.remove()
    kept = [ax for ax in grid.axes.flat if ax not in removed]
    places = {ax: (ax.get_subplotspec().rowspan.start, ax.get_subplotspec().colspan.start) for ax in kept}
    for ax, (row, col) in places.items():
        if not any(c == col and r > row for r, c in places.values()):
            ax.xaxis.set_tick_params(which="both", labelbottom=True)
            for label in ax.get_xticklabels():
                label.set_visible(True)
            ax.set_xlabel(xlabel)
            ax.xaxis.label.set_visible(True)
        if not any(r == row and c < col for r, c in places.values()):
            ax.yaxis.set_tick_params(which="both", labelleft=True)
            for label in ax.get_yticklabels():
                label.set_visible(True)
            ax.set_ylabel(ylabel)
            ax.yaxis.label.set_visible(True)


def bar_slots(order, hue_order) -> dict[tuple, float]:
    """Where seaborn centres each bar of a dodged bar plot, by (category, hue level): the
    bars of category k share BAR_GROUP_WIDTH around k, one place per level of `hue_order`
    whether or not that bar has data."""
    m = len(hue_order)
    return {(x, h): k + (j - (m - 1) / 2) * BAR_GROUP_WIDTH / m
            for k, x in enumerate(order) for j, h in enumerate(hue_order)}


def mark_missing_bars(ax, marks: dict[float, str], horizontal: bool = False) -> None:
    """Write each mark at its bar's place (a position on the category axis), along the bar
    from the axis: what a reader sees where the bar would be."""
    for position, text in marks.items():
        if horizontal:
            ax.text(0.01, position, text, transform=blended_transform_factory(ax.transAxes, ax.transData),
                    ha="left", va="center", fontsize=6, color="0.35", clip_on=True, gid=MISSING_BAR)
        else:
            ax.text(position, 0.01, text, transform=blended_transform_factory(ax.transData, ax.transAxes),
                    rotation=90, ha="center", va="bottom", fontsize=6, color="0.35", clip_on=True, gid=MISSING_BAR)
