"""Figures from the summary table (and, for power traces, the cells' telemetry traces).

Each figure is a function of the summary with a title and a caption; the registry
`FIGURES` is what the workflow's plot rule and the report iterate over. Only cells that
finished `ok` are drawn (an `incorrect` cell's speed is not a result). A figure with
nothing to show says why on the canvas, in words from the summary (flashwatt.placeholder),
instead of failing the run. `Figure.render` returns the matplotlib figure, titled, so
what a figure shows can be checked without reading pixels.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from flashwatt.attention.summary import device_labels  # noqa: E402
from flashwatt.attention.cell import Cell  # noqa: E402
from flashwatt.placeholder import no_baseline, no_cells_ok, no_values  # noqa: E402
from flashwatt.plot_axes import plain_log_y, sequence_length_label, sequence_length_x  # noqa: E402

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


@dataclass(frozen=True)
class Figure:
    name: str
    ext: str
    title: str
    caption: str
    draw: Callable[[pd.DataFrame, dict], plt.Figure]

    def render(self, frame: pd.DataFrame, options: dict | None = None) -> plt.Figure:
        """The figure for this summary, titled with what it shows and where it was measured."""
        sns.set_theme(style="whitegrid", context="paper")
        fig = self.draw(frame, options or {})
        # Above the axes (and their facet titles); savefig's tight bounding box takes it in.
        fig.suptitle(f"{self.title}\n{measured_where(frame)}", y=1.0, va="bottom", fontsize=11)
        return fig


def measured_where(frame: pd.DataFrame) -> str:
    """'suite smoke · CPU x86_64 · 8 of 8 cells ok': the line under every figure's title."""
    if frame.empty:
        return "no cells in the summary"
    suites = ", ".join(sorted(frame["suite"].dropna().unique())) or "unknown suite"
    devices = sorted(device_labels(frame).dropna().unique())
    ok = int((frame["status"] == "ok").sum())
    parts = [f"suite {suites}", *([", ".join(devices)] if devices else []), f"{ok} of {len(frame)} cells ok"]
    return " · ".join(parts)


def _ok(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[(frame["status"] == "ok") & frame[column].notna()].copy()


@dataclass(frozen=True)
class TableFigure:
    """A figure drawn from one kind's table (distributed cells, model cells), titled like the
    attention figures and written atomically."""
    name: str
    ext: str
    title: str
    caption: str
    draw: Callable[[pd.DataFrame], plt.Figure]

    def render(self, table: pd.DataFrame) -> plt.Figure:
        sns.set_theme(style="whitegrid", context="paper")
        fig = self.draw(table)
        fig.suptitle(f"{self.title}\n{measured_where(table)}", y=1.0, va="bottom", fontsize=11)
        return fig

    def save(self, table_path: str | Path, out: str | Path) -> None:
        from flashwatt.records import atomic_write

        fig = self.render(pd.read_parquet(table_path))
        atomic_write(out, lambda tmp: fig.savefig(tmp, format=self.ext, bbox_inches="tight"))
        plt.close(fig)


def ok_rows_or_why(table: pd.DataFrame, column: str, kind: str) -> tuple[pd.DataFrame, str | None]:
    """The `ok` rows of a kind's table with a value in `column`, or why there are none."""
    ok = table[(table["status"] == "ok") & table[column].notna()].copy()
    if len(ok):
        return ok, None
    if table.empty:
        return ok, f"the suite has no {kind} cells in its summary"
    done = table[table["status"] == "ok"]
    if len(done):
        return ok, f"none of the {len(done)} ok cells has {column.replace('_', ' ')}"
    reasons = table["reason"].dropna().unique()
    return ok, f"none of the {len(table)} {kind} cells finished ok" + (f"; reason: {reasons[0]}" if len(reasons) else "")


def nothing_to_draw(message: str) -> plt.Figure:
    """The canvas of a figure with nothing to draw: the words say why."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.text(0.5, 0.5, "Nothing to draw.\n" + message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return fig


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
    """Whether a facet drew positive values to put on a log scale. A facet with no cells
    (a shape not run at this precision) stays linear: matplotlib cannot log-scale it."""
    ys = [p.get_height() for p in ax.patches]
    ys += [y for line in ax.lines for y in np.asarray(line.get_ydata(), dtype=float)]
    return any(np.isfinite(y) and y > 0 for y in ys)


def _lines_vs_L(data: pd.DataFrame, y: str, ylabel: str, log_y: bool, unit: str = "",
                peak: bool = False, reference: float | None = None) -> plt.Figure:
    """One line per kernel against L, a panel per shape (rows) and precision (columns);
    a line style per batch series only where there is more than one."""
    data = _series(data)
    data["shape"] = _shape(data)
    data["kernel"] = _label(data)
    several_series = data["series"].nunique() > 1
    grid = sns.relplot(
        data=data, x="seq_len", y=y, hue="kernel", hue_order=sorted(data["kernel"].unique()),
        style="series" if several_series else None, col="precision", row="shape",
        kind="line", marker="o", height=3.2, aspect=1.3, facet_kws={"sharey": False},
    )
    for (shape, precision), ax in grid.axes_dict.items():
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
    return grid.figure


def latency(frame: pd.DataFrame, options: dict) -> plt.Figure:
    data = _ok(frame, "median_ms")
    if data.empty:
        return nothing_to_draw(no_values(frame, "median_ms", "a timed latency"))
    return _lines_vs_L(data, "median_ms", "median latency per call (ms)", log_y=True)


def tflops(frame: pd.DataFrame, options: dict) -> plt.Figure:
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


def speedup_vs_naive(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _speedup(frame, "naive")


def speedup_vs_sdpa_flash(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _speedup(frame, "sdpa_flash")


def _length_order(data: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """Sequence lengths as legend labels, ordered by length (not alphabetically: 512 < 1k)."""
    lengths = sorted(data["seq_len"].unique())
    return data["seq_len"].map(sequence_length_label), [sequence_length_label(n) for n in lengths]


def power(frame: pd.DataFrame, options: dict) -> plt.Figure:
    data = _ok(frame, "avg_power_w")
    if data.empty:
        return nothing_to_draw(no_values(frame, "avg_power_w", "a power measurement", "energy_reason"))
    long = data.melt(id_vars=[c for c in data.columns if c not in ("avg_power_w", "peak_power_w")],
                     value_vars=["avg_power_w", "peak_power_w"], var_name="power", value_name="W")
    long["power"] = long["power"].map({"avg_power_w": "average (counter)", "peak_power_w": "peak (instant)"})
    long["kernel"] = _label(long)
    long["L"], order = _length_order(long)
    grid = sns.catplot(data=long, x="kernel", y="W", hue="L", hue_order=order, col="precision", row="power",
                       kind="bar", height=3.2, aspect=1.5, sharey=True, errorbar=None)
    idle = data["idle_power_w"].dropna()
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=30)
        if len(idle):
            ax.axhline(idle.median(), color="grey", ls=":", lw=1)
    grid.set_axis_labels("", "W")
    grid.set_titles("{row_name} | {col_name}")
    return grid.figure


def _bars(frame: pd.DataFrame, y: str, ylabel: str, what: str, log_y: bool) -> plt.Figure:
    data = _ok(frame, y)
    if data.empty:
        return nothing_to_draw(no_values(frame, y, what, "energy_reason"))
    data["kernel"] = _label(data)
    data["shape"] = _shape(data) + " B=" + data["batch"].astype(str)
    data["L"], order = _length_order(data)
    grid = sns.catplot(data=data, x="kernel", y=y, hue="L", hue_order=order, col="precision", row="shape",
                       kind="bar", height=3.2, aspect=1.5, sharey=False, errorbar=None)
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=30)
        if log_y and _has_positive(ax):
            ax.set_yscale("log")
            plain_log_y(ax)
    grid.set_axis_labels("", ylabel)
    grid.set_titles("{row_name} | {col_name}")
    return grid.figure


def energy_per_call(frame: pd.DataFrame, options: dict) -> plt.Figure:
    scaled = frame.assign(energy_per_call_mj=frame["energy_per_call_j"] * 1e3)
    return _bars(scaled, "energy_per_call_mj", "energy per call (mJ, NVML counter)",
                 "an energy measurement", log_y=True)


def gflops_per_w(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _bars(frame, "gflops_per_w", "GFLOP/s per W", "an energy measurement", log_y=False)


def cell_labels(data: pd.DataFrame) -> pd.Series:
    """Each cell named by the fields that vary among `data` (precision and L for the seed
    study; the shape too where a suite runs more than one), so no two cells share a bar."""
    varying = [f for f in CELL_FIELDS if data[f].nunique(dropna=False) > 1] or ["precision"]
    parts = {
        "precision": data["precision"].astype(str),
        "seq_len": "L=" + data["seq_len"].map(sequence_length_label),
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
# the summary column giving the reason, and whether the axis is logarithmic (energy and
# latency span orders of magnitude across L; efficiency does not).
OVERVIEW_PANELS = [("energy_per_call_mj", "energy per call (mJ)", "an energy measurement", "energy_reason", True),
                   ("gflops_per_w", "GFLOP/s per W", "an energy measurement", "energy_reason", False),
                   ("median_ms", "median latency per call (ms)", "a timed latency", None, True)]


def overview(frame: pd.DataFrame, options: dict) -> plt.Figure:
    """Energy per call, GFLOP/s per watt and latency per kernel side by side, a bar per cell."""
    frame = frame.assign(energy_per_call_mj=frame["energy_per_call_j"] * 1e3)
    why = no_cells_ok(frame)
    if why:
        return nothing_to_draw(why)
    data = frame[frame["status"] == "ok"].copy()
    data["kernel"] = _label(data)
    data["cell"] = cell_labels(data)
    cells = data["cell"].nunique()
    if cells > MAX_OVERVIEW_CELLS:
        return nothing_to_draw(f"This suite has {cells} different cells per kernel, too many to read as bars side "
                            f"by side (at most {MAX_OVERVIEW_CELLS}).\nThe latency, energy_per_call and "
                            "gflops_per_w figures show them by shape.")
    order = list(dict.fromkeys(data.sort_values(CELL_FIELDS)["cell"]))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    legend = None
    for ax, (column, label, what, reason_column, log_y) in zip(axes, OVERVIEW_PANELS):
        drawn = data[data[column].notna()]
        if drawn.empty:
            ax.text(0.5, 0.5, "Not measured.\n" + no_values(frame, column, what, reason_column), ha="center",
                    va="center", wrap=True, fontsize=8, transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            sns.barplot(data=drawn, x="kernel", y=column, hue="cell", hue_order=order,
                        order=sorted(drawn["kernel"].unique()), errorbar=None, ax=ax)
            # One legend for the three panels (same cells, same colours), outside the bars.
            legend = legend or ax.get_legend_handles_labels()
            ax.get_legend().remove()
            if log_y and _has_positive(ax):
                ax.set_yscale("log")
                plain_log_y(ax)
            ax.tick_params(axis="x", rotation=30)
        ax.set_title(label)
        ax.set_xlabel("")
        ax.set_ylabel(label)
    fig.tight_layout()
    if legend:
        fig.legend(*legend, title="cell", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return fig


def power_trace(frame: pd.DataFrame, options: dict) -> plt.Figure:
    """Instant power over time for chosen cells, the energy window shaded."""
    query = options.get("trace_filter", "")
    chosen = trace_cells(frame, query)
    if chosen.empty:
        if query:
            return nothing_to_draw(f"trace_filter {query!r} selects none of the ok cells with a power trace.")
        return nothing_to_draw(no_values(frame, "peak_power_w", "a power trace", "energy_reason"))
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


FIGURES = {f.name: f for f in (
    Figure("latency", "png", "Median latency per call",
           "Median latency per call against sequence length, one panel per precision and shape; a line per "
           "kernel, and a line style per batch series (fixed B, or 16k tokens per batch) where there are "
           "several.", latency),
    Figure("tflops", "png", "Attention throughput",
           "Attention TFLOP/s (forward 4·B·H·L²·D, halved for causal, ×3.5 with backward) against sequence "
           "length; dashed: the dense-matmul rate measured on this GPU kind.", tflops),
    Figure("speedup_vs_naive", "png", "Speedup over the naive kernel",
           "Speedup over the naive matmul-softmax-matmul baseline at the same cell (same precision and "
           "shape); above 1× is faster.", speedup_vs_naive),
    Figure("speedup_vs_sdpa_flash", "png", "Speedup over SDPA flash (FlashAttention-2)",
           "Speedup over PyTorch SDPA's flash backend (FlashAttention-2) at the same cell; above 1× is "
           "faster.", speedup_vs_sdpa_flash),
    Figure("power", "png", "Power while running",
           "Average power (NVML energy counter over the window) and peak instant power per kernel; dotted: "
           "idle power measured before the windows.", power),
    Figure("energy_per_call", "png", "Energy per call",
           "Energy per call: the NVML energy-counter delta over a window of back-to-back calls, divided by "
           "the number of calls.", energy_per_call),
    Figure("gflops_per_w", "png", "Energy efficiency",
           "GFLOP/s per watt (= GFLOP per joule) from the same energy windows.", gflops_per_w),
    Figure("overview", "pdf", "Energy, efficiency and latency per kernel",
           "Energy per call, GFLOP/s per watt and median latency per kernel side by side, one bar per cell "
           "(named by what varies among the suite's cells: precision and L, and the shape where there is "
           "more than one).", overview),
    Figure("power_trace", "png", "Power over each cell's measurement",
           "Instant power (NVML field 186, sampled every 100 ms) over each chosen cell's measurement, with "
           "its energy window shaded.", power_trace),
)}


def draw(name: str, summary: str | Path, out: str | Path, options: dict | None = None) -> None:
    from flashwatt.attention.summary import read_summary
    from flashwatt.records import atomic_write

    figure = FIGURES[name]
    fig = figure.render(read_summary(summary), options)
    atomic_write(out, lambda tmp: fig.savefig(tmp, format=figure.ext, dpi=130, bbox_inches="tight"))
    plt.close(fig)
