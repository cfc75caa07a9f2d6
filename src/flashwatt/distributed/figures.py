"""The distributed suite's figures, from its table (flashwatt.distributed.summary):

- distributed_scaling: speedup and parallel efficiency against GPUs, a line per strategy;
- distributed_memory: peak memory per GPU against the sequence length, per world size;
- distributed_time: forward, backward and exposed communication per strategy and world size;
- distributed_error: error of the output and dQ against float64, against the world size;
- distributed_energy: joules per token summed over the job's GPUs, and that against one GPU
  running the whole problem alone, against GPUs.

Only cells that finished `ok` are drawn; a figure with nothing to draw says why, and a
facet without cells is not drawn. Each is a `FigureSpec` of flashwatt.figure_base, drawn
from the suite's distributed table.
"""
from __future__ import annotations

import pandas as pd

from flashwatt.figure_base import FigureSpec, nothing_to_draw, parquet_table, registry
from flashwatt.placeholder import Rows, energy_reasons, rows_or_why
from flashwatt.plot_axes import drop_empty_facets
from flashwatt.plotting import plt, sns

ROWS = Rows("distributed cell", "the suite's distributed table")
TABLE = parquet_table("table")


def _shape(data: pd.DataFrame) -> pd.Series:
    mask = data["causal"].map({True: "causal", False: "full"})
    return ("L=" + data["seq_len"].astype(str) + " H=" + data["heads"].astype(str) + "/" + data["kv_heads"].astype(str)
            + " D=" + data["head_dim"].astype(str) + " " + data["precision"] + " " + mask + " " + data["pass"])


def _against_gpus(data: pd.DataFrame, measures: list[str], references: dict[str, tuple[str, object]]) -> plt.Figure:
    """A line per strategy / block against GPUs: a column per measure, a row per shape;
    references[measure] = (label, f(gpus) -> values), drawn dotted."""
    data["shape"] = _shape(data)
    data["method"] = data["strategy"] + " / " + data["block"]
    long = data.melt(id_vars=["gpus", "method", "shape"], value_vars=measures, var_name="measure")
    long = long.dropna(subset=["value"])
    grid = sns.relplot(data=long, x="gpus", y="value", hue="method", col="measure", col_order=measures,
                       row="shape", kind="line", marker="o", height=3.0, aspect=1.3, facet_kws={"sharey": False})
    gpus = sorted(data["gpus"].unique())
    drawn = set(zip(long["shape"], long["measure"]))
    for (shape, measure), ax in grid.axes_dict.items():
        if (shape, measure) not in drawn:
            continue
        if measure in references:
            label, values = references[measure]
            ax.plot(gpus, values(gpus), color="0.6", ls=":", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
    grid.set_axis_labels("GPUs", "")
    drop_empty_facets(grid, drawn)
    return grid.figure


def draw_scaling(table: pd.DataFrame) -> plt.Figure:
    data, why = rows_or_why(table, "speedup", "a speedup over one GPU", rows=ROWS)
    if why:
        return nothing_to_draw(why)
    return _against_gpus(data, ["speedup", "efficiency"],
                         {"speedup": ("ideal", list), "efficiency": ("ideal", lambda g: [1.0] * len(g))})


def draw_memory(table: pd.DataFrame) -> plt.Figure:
    data, why = rows_or_why(table, "peak_bytes_per_gpu", "a peak memory measurement", rows=ROWS)
    if why:
        return nothing_to_draw(why)
    data["GiB per GPU"] = data["peak_bytes_per_gpu"] / 2**30
    data["method"] = data["strategy"] + " / " + data["block"]
    grid = sns.relplot(data=data, x="seq_len", y="GiB per GPU", hue="method", style="gpus", kind="line", marker="o",
                       col="pass", height=3.2, aspect=1.3)
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
    grid.set_axis_labels("sequence length L (whole sequence)", "peak memory per GPU (GiB)")
    return grid.figure


def draw_time(table: pd.DataFrame) -> plt.Figure:
    data, why = rows_or_why(table, "total_ms", "a timed step", rows=ROWS)
    if why:
        return nothing_to_draw(why)
    data["label"] = data["strategy"] + " " + data["gpus"].astype(str) + " GPUs, L=" + data["seq_len"].astype(str)
    parts = pd.DataFrame({
        "forward compute": data["forward_ms"] - data["forward_comm_exposed_ms"].fillna(0),
        "forward exposed communication": data["forward_comm_exposed_ms"].fillna(0),
        "backward compute": (data["backward_ms"] - data["backward_comm_exposed_ms"].fillna(0)).fillna(0),
        "backward exposed communication": data["backward_comm_exposed_ms"].fillna(0),
    }).set_index(data["label"])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(parts) + 1.5))
    parts.plot.barh(stacked=True, ax=ax, width=0.8)
    ax.set_xlabel("time per step, slowest rank (ms)")
    ax.set_ylabel("")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def draw_error(table: pd.DataFrame) -> plt.Figure:
    data, why = rows_or_why(table, "error_out", "an error against float64", rows=ROWS)
    if why:
        return nothing_to_draw(why)
    data["shape"] = _shape(data)
    value_vars = [c for c in ("error_out", "error_dq", "error_dk", "error_dv") if data[c].notna().any()]
    long = data.melt(id_vars=["gpus", "strategy", "shape"], value_vars=value_vars, var_name="tensor", value_name="error")
    long["tensor"] = long["tensor"].str.replace("error_", "")
    grid = sns.relplot(data=long.dropna(subset=["error"]), x="gpus", y="error", hue="strategy", style="tensor",
                       col="shape", kind="line", marker="o", height=3.2, aspect=1.2, col_wrap=3)
    for ax in grid.axes.flat:
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
    grid.set_axis_labels("GPUs", "||x - ref|| / ||ref|| against float64")
    return grid.figure


def draw_energy(table: pd.DataFrame) -> plt.Figure:
    data, why = rows_or_why(table, "j_per_token", "an energy measurement", energy_reasons, rows=ROWS)
    if why:
        return nothing_to_draw(why)
    data["mJ per token, all GPUs"] = data["j_per_token"] * 1e3
    data["energy / one GPU's"] = data["energy_ratio_to_one_gpu"]
    return _against_gpus(data, ["mJ per token, all GPUs", "energy / one GPU's"],
                         {"energy / one GPU's": ("one GPU", lambda g: [1.0] * len(g))})


DISTRIBUTED_FIGURES = registry(
    FigureSpec("distributed_scaling", "pdf", "Speedup and parallel efficiency against GPUs",
               "Each strategy's time for the whole problem against one GPU running the same block backend "
               "in the same job (speedup), and that over the number of GPUs (efficiency); dotted: ideal.",
               draw_scaling, TABLE),
    FigureSpec("distributed_memory", "pdf", "Peak memory per GPU against the sequence length",
               "The largest peak memory of any rank for one step (forward, and backward where run).",
               draw_memory, TABLE),
    FigureSpec("distributed_time", "pdf", "Where the time goes: compute and exposed communication",
               "Forward and backward per step on the slowest rank, each split into compute and the "
               "communication not hidden under it (the record says how each is measured).", draw_time, TABLE),
    FigureSpec("distributed_error", "pdf", "Error against float64 as the world grows",
               "The gathered output and gradients against a float64 reference on the same data; each must "
               "stay within twice the same block backend's single-GPU error.", draw_error, TABLE),
    FigureSpec("distributed_energy", "pdf", "Energy per token across GPUs",
               "Energy per call summed over every GPU of the job (each GPU's NVML counter between its "
               "own updates) per token of the whole problem, and that against one GPU running the "
               "whole problem alone in the same job; dotted: one GPU's.", draw_energy, TABLE),
)
