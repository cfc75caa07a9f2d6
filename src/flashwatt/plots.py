"""Figures from the summary table (and, for power traces, the cells' telemetry traces).

Each figure is a function of the summary and has a caption; the registry `FIGURES` is
what the workflow's plot rule and the report iterate over. A figure with nothing to
show says so on the canvas instead of failing the run.
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

from flashwatt.cell import Cell  # noqa: E402

# Dense fp16/bf16 matmul rate measured on the device kinds we test on (docs/measurement.md:
# an 8192^3 bf16 product, 770-800 TFLOP/s on H100 and H200). Drawn as the ceiling line.
MEASURED_PEAK_TFLOPS = {("H100", "bf16"): 790.0, ("H100", "fp16"): 790.0,
                        ("H200", "bf16"): 790.0, ("H200", "fp16"): 790.0}
TOKENS_CONVENTION = 16384  # flash-attention's benchmarks hold B*L at 16k tokens


@dataclass(frozen=True)
class Figure:
    name: str
    ext: str
    caption: str
    draw: Callable[[pd.DataFrame, dict], plt.Figure]


def _ok(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    data = frame[(frame["status"] == "ok") & frame[column].notna()].copy()
    return data


def _empty(message: str, frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 3))
    counts = frame["status"].value_counts().to_dict() if len(frame) else {}
    detail = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no cells"
    ax.text(0.5, 0.5, f"{message}\n({detail})", ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return fig


def _series(data: pd.DataFrame) -> pd.DataFrame:
    """Each cell belongs to its fixed-batch series and, at 16k tokens, to that series too."""
    fixed = data.assign(series="B=" + data["batch"].astype(str))
    convention = data[data["batch"] * data["seq_len"] == TOKENS_CONVENTION].assign(series="16k tokens")
    return pd.concat([fixed, convention], ignore_index=True)


def _shape(data: pd.DataFrame) -> pd.Series:
    mask = data["causal"].map({True: "causal", False: "full"})
    return "D=" + data["head_dim"].astype(str) + " H=" + data["heads"].astype(str) + " " + mask + " " + data["pass"]


def _label(data: pd.DataFrame) -> pd.Series:
    variant = data["variant"].fillna("")
    return data["kernel"] + variant.map(lambda v: f"[{v}]" if v else "")


def _log_y(ax) -> None:
    """Log y scale on a facet that has positive values to scale. A facet with no cells (a
    shape not run at this precision) stays linear: matplotlib cannot log-scale it."""
    ys = [p.get_height() for p in ax.patches]
    ys += [y for line in ax.lines for y in np.asarray(line.get_ydata(), dtype=float)]
    if any(np.isfinite(y) and y > 0 for y in ys):
        ax.set_yscale("log")


def _lines_vs_L(frame: pd.DataFrame, y: str, ylabel: str, logy: bool, peak: bool = False) -> plt.Figure:
    data = _ok(frame, y)
    if data.empty:
        return _empty(f"no successful cells with {ylabel}", frame)
    data = _series(data)
    data["shape"] = _shape(data)
    data["kernel "] = _label(data)
    grid = sns.relplot(
        data=data, x="seq_len", y=y, hue="kernel ", style="series", col="precision", row="shape",
        kind="line", marker="o", height=3.2, aspect=1.3, facet_kws={"sharey": False},
    )
    for (shape, precision), ax in grid.axes_dict.items():
        ax.set_xscale("log", base=2)
        if logy:
            _log_y(ax)
        if peak:
            devices = data["device"].dropna().unique()
            for name in devices:
                for (family, dtype), tflops in MEASURED_PEAK_TFLOPS.items():
                    if family in name and dtype == precision:
                        ax.axhline(tflops, color="grey", ls="--", lw=1)
                        ax.text(ax.get_xlim()[0], tflops, f" matmul peak {name}", va="bottom", fontsize=7)
    grid.set_axis_labels("sequence length L", ylabel)
    grid.set_titles("{row_name} | {col_name}")
    return grid.figure


def latency(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _lines_vs_L(frame, "median_ms", "median latency per call (ms)", logy=True)


def tflops(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _lines_vs_L(frame, "tflops", "TFLOP/s", logy=False, peak=True)


def _speedup(frame: pd.DataFrame, baseline: str) -> plt.Figure:
    data = _ok(frame, "median_ms")
    keys = ["precision", "seq_len", "batch", "heads", "head_dim", "causal", "pass"]
    base = data[data["kernel"] == baseline][keys + ["median_ms"]].rename(columns={"median_ms": "base_ms"})
    merged = data[data["kernel"] != baseline].merge(base, on=keys)
    if merged.empty:
        return _empty(f"no cell has both a successful {baseline} run and another kernel to compare", frame)
    merged["speedup"] = merged["base_ms"] / merged["median_ms"]
    fig = _lines_vs_L(merged, "speedup", f"speedup over {baseline} (×)", logy=True)
    for ax in fig.axes:
        ax.axhline(1.0, color="black", lw=0.8)
    return fig


def speedup_vs_naive(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _speedup(frame, "naive")


def speedup_vs_sdpa_flash(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _speedup(frame, "sdpa_flash")


def power(frame: pd.DataFrame, options: dict) -> plt.Figure:
    data = _ok(frame, "avg_power_w")
    if data.empty:
        return _empty("no energy measurements (no NVML, or energy switched off)", frame)
    long = data.melt(id_vars=[c for c in data.columns if c not in ("avg_power_w", "peak_power_w")],
                     value_vars=["avg_power_w", "peak_power_w"], var_name="power", value_name="W")
    long["power"] = long["power"].map({"avg_power_w": "average (counter)", "peak_power_w": "peak (instant)"})
    long["kernel "] = _label(long)
    long["L"] = long["seq_len"].astype(str)
    grid = sns.catplot(data=long, x="kernel ", y="W", hue="L", col="precision", row="power",
                       kind="bar", height=3.2, aspect=1.5, sharey=True)
    idle = data["idle_power_w"].dropna()
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=30)
        if len(idle):
            ax.axhline(idle.median(), color="grey", ls=":", lw=1)
    grid.set_titles("{row_name} | {col_name}")
    return grid.figure


def _bars(frame: pd.DataFrame, y: str, ylabel: str, logy: bool) -> plt.Figure:
    data = _ok(frame, y)
    if data.empty:
        return _empty(f"no successful cells with {ylabel}", frame)
    data["kernel "] = _label(data)
    data["shape"] = _shape(data) + " B=" + data["batch"].astype(str)
    data["L"] = data["seq_len"].astype(str)
    grid = sns.catplot(data=data, x="kernel ", y=y, hue="L", col="precision", row="shape",
                       kind="bar", height=3.2, aspect=1.5, sharey=False)
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=30)
        if logy:
            _log_y(ax)
    grid.set_axis_labels("", ylabel)
    grid.set_titles("{row_name} | {col_name}")
    return grid.figure


def energy_per_call(frame: pd.DataFrame, options: dict) -> plt.Figure:
    scaled = frame.assign(energy_per_call_mj=frame["energy_per_call_j"] * 1e3)
    return _bars(scaled, "energy_per_call_mj", "energy per call (mJ, NVML counter)", logy=True)


def gflops_per_w(frame: pd.DataFrame, options: dict) -> plt.Figure:
    return _bars(frame, "gflops_per_w", "GFLOP/s per W", logy=False)


def seed_panels(frame: pd.DataFrame, options: dict) -> plt.Figure:
    """The seeds' combined figure: energy per call, GFLOP/s per watt, latency, side by side."""
    data = _ok(frame, "median_ms")
    if data.empty:
        return _empty("no successful cells", frame)
    data["kernel "] = _label(data)
    data["cell"] = data["precision"] + " L=" + data["seq_len"].astype(str)
    data["energy_per_call_mj"] = data["energy_per_call_j"] * 1e3
    panels = [("energy_per_call_mj", "energy per call (mJ)"), ("gflops_per_w", "GFLOP/s per W"),
              ("median_ms", "latency (ms)")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (column, label) in zip(axes, panels):
        if data[column].notna().any():
            sns.barplot(data=data, x="kernel ", y=column, hue="cell", ax=ax)
            _log_y(ax)
        else:
            ax.text(0.5, 0.5, "not measured\n(no NVML energy counter)", ha="center", va="center")
        ax.set_title(label)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def power_trace(frame: pd.DataFrame, options: dict) -> plt.Figure:
    """Instant power over time for chosen cells, the energy window shaded."""
    chosen = trace_cells(frame, options.get("trace_filter", ""))
    traces = []
    for _, row in chosen.iterrows():
        path = Path(Cell.trace_of(row["record"]))
        if path.exists():
            trace = pd.read_parquet(path)
            if len(trace) and "power_instant_w" in trace:
                trace["cell"] = row["cell_id"]
                traces.append(trace)
    if not traces:
        return _empty("no telemetry traces to draw (no NVML, or no successful cells)", frame)
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
    Figure("latency", "png", "Median latency per call against sequence length, one panel per precision "
           "and shape; lines per kernel, line style per batch series (fixed B, or 16k tokens per batch).", latency),
    Figure("tflops", "png", "Attention TFLOP/s (forward 4·B·H·L²·D, halved for causal, ×3.5 with backward) "
           "against sequence length; dashed: the dense-matmul rate measured on this GPU kind.", tflops),
    Figure("speedup_vs_naive", "png", "Speedup over the naive matmul-softmax-matmul baseline at the same "
           "cell (same precision and shape); above 1 is faster.", speedup_vs_naive),
    Figure("speedup_vs_sdpa_flash", "png", "Speedup over PyTorch SDPA's flash backend (FlashAttention-2) at "
           "the same cell; above 1 is faster.", speedup_vs_sdpa_flash),
    Figure("power", "png", "Average power (NVML energy counter over the window) and peak instant power per "
           "kernel; dotted: idle power measured before the windows.", power),
    Figure("energy_per_call", "png", "Energy per call: the NVML energy-counter delta over a window of "
           "back-to-back calls, divided by the number of calls.", energy_per_call),
    Figure("gflops_per_w", "png", "GFLOP/s per watt (= GFLOP per joule) from the same energy windows.",
           gflops_per_w),
    Figure("seed_panels", "pdf", "The seed study's three panels: energy per call, GFLOP/s per watt and "
           "latency, per kernel, for each precision and sequence length.", seed_panels),
    Figure("power_trace", "png", "Instant power (NVML field 186, sampled every 100 ms) over each chosen "
           "cell's measurement, with its energy window shaded.", power_trace),
)}


def draw(name: str, summary: str | Path, out: str | Path, options: dict | None = None) -> None:
    from flashwatt.records import atomic_write

    figure = FIGURES[name]
    frame = pd.read_parquet(summary)
    sns.set_theme(style="whitegrid", context="paper")
    fig = figure.draw(frame, options or {})
    atomic_write(out, lambda tmp: fig.savefig(tmp, format=figure.ext, dpi=130, bbox_inches="tight"))
    plt.close(fig)
