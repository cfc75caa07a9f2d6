"""The attention suite's figures, from its summary table (and, for power traces, the
cells' telemetry traces).

Each figure is a `FigureSpec` of flashwatt.figure_base (titled, captioned and written the
same way as every kind's); the registry `FIGURES` is what the workflow's figure rule and
the report iterate over. Only cells that finished `ok` are drawn (an `incorrect` cell's
speed is not a result). A figure with nothing to show says why on the canvas, in words
from the summary (flashwatt.placeholder), instead of failing the run; a facet with no
cells is not drawn, and a bar missing from its group is marked with its cell's outcome
("skipped: runs fp16/bf16 only ...", "not in grid").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flashwatt.attention.cell import Cell
from flashwatt.attention.summary import read_summary
from flashwatt.figure_base import FigureSpec, Source, not_measured_panel, nothing_to_draw, registry, spoken_list
from flashwatt.placeholder import energy_reasons, missing_bar, no_baseline, no_cells_ok, no_values
from flashwatt.plot_axes import (bar_slots, drop_empty_facets, mark_missing_bars, plain_log_y, sequence_length_label,
                                 sequence_length_x)
from flashwatt.plotting import plt, sns

# Dense fp16/bf16 matmul rate measured on the device kinds we test on (docs/measurement.md:
# an 8192^3 bf16 product, 770-800 TFLOP/s on H100 and H200). Drawn as the ceiling line.
MEASURED_PEAK_TFLOPS = {("H100", "bf16"): 790.0, ("H100", "fp16"): 790.0,
                        ("H200", "bf16"): 790.0, ("H200", "fp16"): 790.0}
TOKENS_CONVENTION = 16384  # flash-attention's benchmarks hold B*L at 16k tokens
# The overview draws one bar per cell and kernel; past this many cells per kernel the
# bars are too thin to read, and the per-shape figures are the ones to look at.
MAX_OVERVIEW_CELLS = 12
# Cell fields that tell cells apart once the kernel is known, in the order a label names them.
CELL_FIELDS = ["precision", "seq_len", "batch", "heads", "head_dim", "causal", "pass"]
# Every figure is drawn from the suite's summary (read with every column it may lack).
SUMMARY = Source(("summary",), read_summary)


def _ok(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[(frame["status"] == "ok") & frame[column].notna()].copy()


def _series(data: pd.DataFrame) -> pd.DataFrame:
    """Each cell belongs to its fixed-batch series and, at 16k tokens, to that series too,
    which is drawn where it is a line (two or more sequence lengths)."""
    fixed = data.assign(series="B=" + data["batch"].astype(str))
    convention = data[data["batch"] * data["seq_len"] == TOKENS_CONVENTION].assign(series="16k tokens")
    if convention["seq_len"].nunique() < 2:
        return fixed
    return pd.concat([fixed, convention], ignore_index=True)


def _shape(data: pd.DataFrame) -> pd.Series:
    mask = data["causal"].map({True: "causal", False: "full"})
    return "D=" + data["head_dim"].astype(str) + " H=" + data["heads"].astype(str) + " " + mask + " " + data["pass"]


def _label(data: pd.DataFrame) -> pd.Series:
    variant = data["variant"].fillna("")
    return data["kernel"] + variant.map(lambda v: f"[{v}]" if v else "")


def _has_positive(ax) -> bool:
    """Whether a facet drew positive values to put on a log scale: one that did not (its
    cells' values all zero, say) stays linear, as matplotlib cannot log-scale it."""
    ys = [p.get_height() for p in ax.patches]
    ys += [y for line in ax.lines for y in np.asarray(line.get_ydata(), dtype=float)]
    return any(np.isfinite(y) and y > 0 for y in ys)


def _lines_vs_L(data: pd.DataFrame, y: str, ylabel: str, log_y: bool, unit: str = "",
                peak: bool = False, reference: float | None = None) -> plt.Figure:
    """One line per kernel against L, a panel per shape (rows) and precision (columns) that
    was run; a line style per batch series only where there is more than one."""
    data = _series(data)
    data["shape"] = _shape(data)
    data["kernel"] = _label(data)
    several_series = data["series"].nunique() > 1
    grid = sns.relplot(
        data=data, x="seq_len", y=y, hue="kernel", hue_order=sorted(data["kernel"].unique()),
        style="series" if several_series else None, col="precision", row="shape",
        kind="line", marker="o", height=3.2, aspect=1.3, facet_kws={"sharey": False},
    )
    drawn = set(zip(data["shape"], data["precision"]))
    for (shape, precision), ax in grid.axes_dict.items():
        if (shape, precision) not in drawn:
            continue
        sequence_length_x(ax, data["seq_len"])
        if reference is not None:
            ax.axhline(reference, color="black", lw=0.8)
        if peak:
            for name in data["device"].dropna().unique():
                for (family, dtype), tflops in MEASURED_PEAK_TFLOPS.items():
                    if family in name and dtype == precision:
                        ax.axhline(tflops, color="grey", ls="--", lw=1)
                        ax.text(ax.get_xlim()[0], tflops, f" matmul peak {name}", va="bottom", fontsize=7)
        if log_y and _has_positive(ax):
            ax.set_yscale("log")
            plain_log_y(ax, unit)
    grid.set_axis_labels("sequence length L", ylabel)
    grid.set_titles("{row_name} | {col_name}")
    drop_empty_facets(grid, drawn)
    return grid.figure


def latency(frame: pd.DataFrame) -> plt.Figure:
    data = _ok(frame, "median_ms")
    if data.empty:
        return nothing_to_draw(no_values(frame, "median_ms", "a timed latency"))
    return _lines_vs_L(data, "median_ms", "median latency per call (ms)", log_y=True)


def tflops(frame: pd.DataFrame) -> plt.Figure:
    data = _ok(frame, "tflops")
    if data.empty:
        return nothing_to_draw(no_values(frame, "tflops", "a TFLOP/s figure"))
    return _lines_vs_L(data, "tflops", "TFLOP/s", log_y=False, peak=True)


def speedups(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Each ok cell of another kernel beside the ok baseline cell of the same shape and
    precision, with `speedup` = baseline latency / its latency."""
    data = _ok(frame, "median_ms")
    keys = ["precision", "seq_len", "batch", "heads", "head_dim", "causal", "pass"]
    base = data[data["kernel"] == baseline][keys + ["median_ms"]].rename(columns={"median_ms": "base_ms"})
    merged = data[data["kernel"] != baseline].merge(base, on=keys)
    return merged.assign(speedup=merged["base_ms"] / merged["median_ms"])


def _speedup(frame: pd.DataFrame, baseline: str) -> plt.Figure:
    why = no_baseline(frame, baseline)
    if why:
        return nothing_to_draw(why)
    merged = speedups(frame, baseline)
    if merged.empty:
        n = int(((frame["kernel"] == baseline) & (frame["status"] == "ok")).sum())
        return nothing_to_draw(f"No other kernel finished ok at the {n} cells where {baseline} did.")
    return _lines_vs_L(merged, "speedup", f"speedup over {baseline}", log_y=True, unit="×", reference=1.0)


def speedup_vs_naive(frame: pd.DataFrame) -> plt.Figure:
    return _speedup(frame, "naive")


def speedup_vs_sdpa_flash(frame: pd.DataFrame) -> plt.Figure:
    return _speedup(frame, "sdpa_flash")


def _length_labels(lengths: pd.Series) -> pd.Series:
    return lengths.map(lambda n: sequence_length_label(int(n)) if pd.notna(n) else "")


def _length_order(data: pd.DataFrame) -> list[str]:
    """Sequence lengths as legend labels, ordered by length (not alphabetically: 512 < 1k)."""
    return [sequence_length_label(int(n)) for n in sorted(data["seq_len"].dropna().unique())]


def _bar_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell of the summary, whatever its outcome, labelled as the bar figures group
    them: kernel (with its variant), shape (with the batch) and L."""
    return frame.assign(kernel=_label(frame), shape=_shape(frame) + " B=" + frame["batch"].astype(str),
                        L=_length_labels(frame["seq_len"]))


def _mark_gaps(ax, cells: pd.DataFrame, drawn: pd.DataFrame, order: list, hue: str, hue_order: list,
               column: str, reasons=None) -> None:
    """Mark each bar place of `ax` that has no bar with why, from `cells` (the facet's cells
    of every outcome): skipped, failed, not measured or not in grid. `drawn`: the rows drawn."""
    present = set(zip(drawn["kernel"], drawn[hue]))
    marks = {}
    for (kernel, level), position in bar_slots(order, hue_order).items():
        if (kernel, level) not in present:
            rows = cells[(cells["kernel"] == kernel) & (cells[hue] == level)]
            marks[position] = missing_bar(rows, column, reasons, subject=kernel.split("[")[0])
    mark_missing_bars(ax, marks)


def _ok_kernels(cells: pd.DataFrame) -> list[str]:
    """The kernels on a bar figure's axis: those with a cell that finished ok (a kernel that
    never did is not a result; one whose ok cells lack the quantity shows why in its place)."""
    return sorted(cells.loc[cells["status"] == "ok", "kernel"].unique())


# The power figure's rows: the measure named as the reader sees it, and its summary column.
POWER_MEASURES = {"average (counter)": "avg_power_w", "peak (instant)": "peak_power_w"}


def power(frame: pd.DataFrame) -> plt.Figure:
    if _ok(frame, "avg_power_w").empty:
        return nothing_to_draw(no_values(frame, "avg_power_w", "a power measurement", energy_reasons))
    cells = _bar_cells(frame)
    ok = cells[cells["status"] == "ok"]
    long = ok.melt(id_vars=["kernel", "precision", "L"], value_vars=list(POWER_MEASURES.values()),
                   var_name="power", value_name="W").dropna(subset=["W"])
    long["power"] = long["power"].map({column: name for name, column in POWER_MEASURES.items()})
    order, lengths = _ok_kernels(cells), _length_order(ok)
    grid = sns.catplot(data=long, x="kernel", y="W", hue="L", hue_order=lengths, order=order, col="precision",
                       row="power", kind="bar", height=3.2, aspect=1.5, sharey=True, errorbar=None)
    idle = ok["idle_power_w"].dropna()
    drawn = set(zip(long["power"], long["precision"]))
    for (measure, precision), ax in grid.axes_dict.items():
        if (measure, precision) not in drawn:
            continue
        ax.tick_params(axis="x", rotation=30)
        if len(idle):
            ax.axhline(idle.median(), color="grey", ls=":", lw=1)
        _mark_gaps(ax, cells[cells["precision"] == precision],
                   long[(long["power"] == measure) & (long["precision"] == precision)],
                   order, "L", lengths, POWER_MEASURES[measure], energy_reasons)
    grid.set_axis_labels("", "W")
    grid.set_titles("{row_name} | {col_name}")
    drop_empty_facets(grid, drawn)
    return grid.figure


def _bars(frame: pd.DataFrame, y: str, ylabel: str, what: str, log_y: bool) -> plt.Figure:
    """A bar per kernel and L, a panel per shape (rows) and precision (columns) that was run."""
    if _ok(frame, y).empty:
        return nothing_to_draw(no_values(frame, y, what, energy_reasons))
    cells = _bar_cells(frame)
    data = _ok(cells, y)
    order, lengths = _ok_kernels(cells), _length_order(cells[cells["status"] == "ok"])
    grid = sns.catplot(data=data, x="kernel", y=y, hue="L", hue_order=lengths, order=order, col="precision",
                       row="shape", kind="bar", height=3.2, aspect=1.5, sharey=False, errorbar=None)
    drawn = set(zip(data["shape"], data["precision"]))
    for (shape, precision), ax in grid.axes_dict.items():
        if (shape, precision) not in drawn:
            continue
        ax.tick_params(axis="x", rotation=30)
        if log_y and _has_positive(ax):
            ax.set_yscale("log")
            plain_log_y(ax)
        facet = (cells["shape"] == shape) & (cells["precision"] == precision)
        _mark_gaps(ax, cells[facet], data[(data["shape"] == shape) & (data["precision"] == precision)],
                   order, "L", lengths, y, energy_reasons)
    grid.set_axis_labels("", ylabel)
    grid.set_titles("{row_name} | {col_name}")
    drop_empty_facets(grid, drawn)
    return grid.figure


def energy_per_call(frame: pd.DataFrame) -> plt.Figure:
    scaled = frame.assign(energy_per_call_mj=frame["energy_per_call_j"] * 1e3)
    return _bars(scaled, "energy_per_call_mj", "energy per call (mJ, NVML counter)",
                 "an energy measurement", log_y=True)


def gflops_per_w(frame: pd.DataFrame) -> plt.Figure:
    return _bars(frame, "gflops_per_w", "GFLOP/s per W", "an energy measurement", log_y=False)


def cell_labels(data: pd.DataFrame, among: pd.DataFrame | None = None) -> pd.Series:
    """Each cell named by the fields that vary among `among` (by default `data` itself:
    precision and L for the seed study; the shape too where a suite runs more than one),
    so no two of those cells share a bar."""
    among = data if among is None else among
    varying = [f for f in CELL_FIELDS if among[f].nunique(dropna=False) > 1] or ["precision"]
    parts = {
        "precision": data["precision"].astype(str),
        "seq_len": "L=" + _length_labels(data["seq_len"]),
        "batch": "B=" + data["batch"].astype(str),
        "heads": "H=" + data["heads"].astype(str),
        "head_dim": "D=" + data["head_dim"].astype(str),
        "causal": data["causal"].map({True: "causal", False: "full"}),
        "pass": data["pass"].astype(str),
    }
    label = parts[varying[0]]
    for f in varying[1:]:
        label = label + " " + parts[f]
    return label


# The overview's panels: column drawn, axis label, what a cell lacks when it has no value,
# where the reason for that is recorded, whether the axis is logarithmic (energy and
# latency span orders of magnitude across L; efficiency does not), and the panel's name in
# the title.
OVERVIEW_PANELS = [("energy_per_call_mj", "energy per call (mJ)", "an energy measurement", energy_reasons, True,
                    "energy"),
                   ("gflops_per_w", "GFLOP/s per W", "an energy measurement", energy_reasons, False, "efficiency"),
                   ("median_ms", "median latency per call (ms)", "a timed latency", None, True, "latency")]


def overview_title(frame: pd.DataFrame) -> str:
    """'Energy, efficiency and latency per kernel', naming only the panels that draw bars
    (on a machine without a GPU: 'Latency per kernel')."""
    ok = frame.assign(energy_per_call_mj=frame["energy_per_call_j"] * 1e3)
    ok = ok[ok["status"] == "ok"]
    parts = [name for column, *_, name in OVERVIEW_PANELS if ok[column].notna().any()]
    parts = parts or [name for *_, name in OVERVIEW_PANELS]
    said = spoken_list(parts)
    return f"{said[0].upper()}{said[1:]} per kernel"


def overview(frame: pd.DataFrame) -> plt.Figure:
    """Energy per call, GFLOP/s per watt and latency per kernel side by side, a bar per cell."""
    frame = frame.assign(energy_per_call_mj=frame["energy_per_call_j"] * 1e3)
    why = no_cells_ok(frame)
    if why:
        return nothing_to_draw(why)
    cells = frame.assign(kernel=_label(frame), cell=cell_labels(frame, among=frame[frame["status"] == "ok"]))
    data = cells[cells["status"] == "ok"]
    count = data["cell"].nunique()
    if count > MAX_OVERVIEW_CELLS:
        return nothing_to_draw(f"This suite has {count} different cells per kernel, too many to read as bars side "
                               f"by side (at most {MAX_OVERVIEW_CELLS}).\nThe latency, energy_per_call and "
                               "gflops_per_w figures show them by shape.")
    order = list(dict.fromkeys(data.sort_values(CELL_FIELDS)["cell"]))
    kernels = _ok_kernels(cells)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    legend = None
    for ax, (column, label, what, reasons, log_y, _) in zip(axes, OVERVIEW_PANELS):
        drawn = data[data[column].notna()]
        if drawn.empty:
            not_measured_panel(ax, label, no_values(frame, column, what, reasons))
        else:
            sns.barplot(data=drawn, x="kernel", y=column, hue="cell", hue_order=order, order=kernels,
                        errorbar=None, ax=ax)
            # One legend for the three panels (same cells, same colours), outside the bars.
            legend = legend or ax.get_legend_handles_labels()
            ax.get_legend().remove()
            if log_y and _has_positive(ax):
                ax.set_yscale("log")
                plain_log_y(ax)
            ax.tick_params(axis="x", rotation=30)
            _mark_gaps(ax, cells, drawn, kernels, "cell", order, column, reasons)
            ax.set_title(label)
        ax.set_xlabel("")
        ax.set_ylabel(label)
    fig.tight_layout()
    if legend:
        fig.legend(*legend, title="cell", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return fig


def power_trace(frame: pd.DataFrame, trace_filter: str = "") -> plt.Figure:
    """Instant power over time for chosen cells, the energy window shaded."""
    chosen = trace_cells(frame, trace_filter)
    if chosen.empty:
        if trace_filter:
            return nothing_to_draw(f"trace_filter {trace_filter!r} selects none of the ok cells with a power trace.")
        return nothing_to_draw(no_values(frame, "peak_power_w", "a power trace", energy_reasons))
    traces = []
    for _, row in chosen.iterrows():
        path = Path(Cell.trace_of(row["record"]))
        if path.exists():
            trace = pd.read_parquet(path)
            if len(trace) and "power_instant_w" in trace:
                trace["cell"] = row["cell_id"]
                traces.append(trace)
    if not traces:
        return nothing_to_draw(f"The power traces of the {len(chosen)} chosen cells are missing or empty "
                               f"(e.g. {Cell.trace_of(chosen['record'].iloc[0])}).")
    n = len(traces)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.4 * n), squeeze=False)
    for ax, trace in zip(axes[:, 0], traces):
        t = trace["t"] - trace["t"].min()
        ax.plot(t, trace["power_instant_w"], lw=1, label="instant power")
        if "in_window" in trace:
            inside = t[trace["in_window"].astype(bool)]
            if len(inside):
                ax.axvspan(inside.min(), inside.max(), color="tab:orange", alpha=0.2, label="energy window")
        ax.set_title(trace["cell"].iloc[0], fontsize=9)
        ax.set_ylabel("W")
        ax.legend(loc="lower right", fontsize=7)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    return fig


def trace_cells(frame: pd.DataFrame, query: str = "", limit: int = 6) -> pd.DataFrame:
    """Cells whose power trace is drawn: a query over the summary, or each kernel's hungriest cell."""
    data = frame[frame["status"] == "ok"]
    if query:
        try:
            return data.query(query, engine="python").head(limit)
        except Exception as err:  # pandas raises many types for a bad expression
            raise ValueError(f"config key trace_filter: cannot apply {query!r} to the summary: {err}") from err
    data = data[data["peak_power_w"].notna()]
    if data.empty:
        return data
    return data.loc[data.groupby("kernel")["peak_power_w"].idxmax()].head(limit)


FIGURES = registry(
    FigureSpec("latency", "png", "Median latency per call",
               "Median latency per call against sequence length, one panel per precision and shape; a line per "
               "kernel, and a line style per batch series (fixed B, or 16k tokens per batch) where there are "
               "several.", latency, SUMMARY),
    FigureSpec("tflops", "png", "Attention throughput",
               "Attention TFLOP/s (forward 4·B·H·L²·D, halved for causal, ×3.5 with backward) against sequence "
               "length; dashed: the dense-matmul rate measured on this GPU kind.", tflops, SUMMARY),
    FigureSpec("speedup_vs_naive", "png", "Speedup over the naive kernel",
               "Speedup over the naive matmul-softmax-matmul baseline at the same cell (same precision and "
               "shape); above 1× is faster.", speedup_vs_naive, SUMMARY),
    FigureSpec("speedup_vs_sdpa_flash", "png", "Speedup over SDPA flash (FlashAttention-2)",
               "Speedup over PyTorch SDPA's flash backend (FlashAttention-2) at the same cell; above 1× is "
               "faster.", speedup_vs_sdpa_flash, SUMMARY),
    FigureSpec("power", "png", "Power while running",
               "Average power (NVML energy counter over the window) and peak instant power per kernel; dotted: "
               "idle power measured before the windows. A missing bar is marked with its cell's outcome.",
               power, SUMMARY),
    FigureSpec("energy_per_call", "png", "Energy per call",
               "Energy per call: the NVML energy-counter delta over a window of back-to-back calls, divided by "
               "the number of calls. A missing bar is marked with its cell's outcome (skipped and why, failed, "
               "not measured, or not in grid: the suite has no such cell).", energy_per_call, SUMMARY),
    FigureSpec("gflops_per_w", "png", "Energy efficiency",
               "GFLOP/s per watt (= GFLOP per joule) from the same energy windows. A missing bar is marked with "
               "its cell's outcome.", gflops_per_w, SUMMARY),
    FigureSpec("overview", "pdf", overview_title,
               "Energy per call, GFLOP/s per watt and median latency per kernel side by side, one bar per cell "
               "(named by what varies among the suite's cells: precision and L, and the shape where there is "
               "more than one); a panel whose quantity was not measured says why, and a missing bar is marked "
               "with its cell's outcome.", overview, SUMMARY),
    FigureSpec("power_trace", "png", "Power over each cell's measurement",
               "Instant power (NVML field 186, sampled every 100 ms) over each chosen cell's measurement, with "
               "its energy window shaded.", power_trace, SUMMARY, options=("trace_filter",)),
)
