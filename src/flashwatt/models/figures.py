"""The models suite's figures, from its table (flashwatt.models.summary):

- model_throughput: tokens per second per backend, for each model, phase and context;
- model_energy: joules per token per backend, the same cells;
- model_memory: peak memory of a training step against the context, with and without
  activation recompute (none, every block, a share of the blocks);
- model_attention_share: the attention's share of the step per backend;
- model_paired: each paired cell's speed and joules per token against the SDPA default
  in the same process on the same GPU (flashwatt.models.paired), with the rounds' range;
- model_governed_power: power against time of each run under a budget, per GPU and in
  total (flashwatt.models.governed_figures).

Only cells that finished `ok` are drawn; a figure with nothing to draw says why, a bar
missing beside its cell's other backends is marked with its outcome, and a quantity not
measured (joules per token on a CPU) has a panel saying why. Each is a `FigureSpec` of
flashwatt.figure_base, drawn from the suite's model table.
"""
from __future__ import annotations

import pandas as pd

from flashwatt.figure_base import FigureSpec, not_measured_panel, nothing_to_draw, parquet_table, registry
from flashwatt.models.governed_figures import GOVERNED_FIGURES
from flashwatt.models.recompute import recompute_words
from flashwatt.placeholder import Rows, energy_reasons, missing_bar, no_values, rows_or_why
from flashwatt.plot_axes import bar_slots, mark_missing_bars, plain_log_x
from flashwatt.plotting import plt, sns

ROWS = Rows("model cell", "the suite's model table")
TABLE = parquet_table("table")


def _label(data: pd.DataFrame) -> pd.Series:
    options = (data["recompute"].map(lambda share: f" {recompute_words(share)}" if share else "")
               + data["compiled"].map({True: " compiled", False: ""}))
    if "gpus" in data:
        options = options + [f" {g} GPUs {s}" if g > 1 else "" for g, s in zip(data["gpus"], data["strategy"])]
    return (data["model"] + "\nL=" + data["seq_len"].astype(str) + " B=" + data["batch"].astype(str) + " "
            + data["precision"] + options)


def _mark_gaps(ax, cells: pd.DataFrame, drawn: pd.DataFrame, order: list, backends: list, column: str,
               reasons) -> None:
    """Mark each backend's place beside a cell that has no bar there, with why."""
    present = set(zip(drawn["cell"], drawn["backend"]))
    marks = {}
    for (cell, backend), position in bar_slots(order, backends).items():
        if (cell, backend) not in present:
            rows = cells[(cells["cell"] == cell) & (cells["backend"] == backend)]
            marks[position] = missing_bar(rows, column, reasons, subject=backend)
    mark_missing_bars(ax, marks, horizontal=True)


def _bars(table: pd.DataFrame, column: str, xlabel: str, what: str, reasons=None, log: bool = False) -> plt.Figure:
    """Horizontal bars per cell and backend, a panel per phase with ok cells. `log`: a log
    x axis over each panel's own range, for a quantity that spans decades between models
    (GPT-2's tokens per second and Llama-3-8B's are 30x apart: on a linear axis the 8B's
    bars would be slivers)."""
    data, why = rows_or_why(table, column, what, reasons, ROWS)
    if why:
        return nothing_to_draw(why)
    cells = table.assign(cell=_label(table))  # every outcome, for the missing bars' marks
    data = data.assign(cell=_label(data))
    ok = cells[cells["status"] == "ok"]
    phases, backends = sorted(data["phase"].unique()), sorted(ok["backend"].unique())
    orders = {phase: sorted(ok.loc[ok["phase"] == phase, "cell"].unique()) for phase in phases}
    bars = max(len(order) for order in orders.values()) * len(backends)
    height = max(3.0, 0.22 * bars + 1.0)  # a bar a quarter inch high; panels 6 inches wide
    fig, axes = plt.subplots(1, len(phases), figsize=(6.0 * len(phases), height), squeeze=False)
    for ax, phase in zip(axes[0], phases):
        drawn = data[data["phase"] == phase]
        sns.barplot(data=drawn, y="cell", x=column, hue="backend", hue_order=backends, order=orders[phase],
                    orient="h", errorbar=None, ax=ax)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(drawn[column].min() / 1.5, drawn[column].max() * 1.3)  # bars start at the left edge
            plain_log_x(ax)
        _mark_gaps(ax, cells[cells["phase"] == phase], drawn, orders[phase], backends, column, reasons)
        ax.set_title(f"phase = {phase}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("")
        ax.get_legend().remove()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, title="backend", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return fig


def draw_throughput(table: pd.DataFrame) -> plt.Figure:
    return _bars(table, "tokens_per_s", "tokens per second (log scale)", "a timed step", log=True)


def draw_energy(table: pd.DataFrame) -> plt.Figure:
    return _bars(table, "j_per_token", "joules per token (NVML counter over whole steps; log scale)",
                 "an energy measurement", energy_reasons, log=True)


def draw_share(table: pd.DataFrame) -> plt.Figure:
    return _bars(table.assign(attention_percent=table["attention_share"] * 100), "attention_percent",
                 "attention share of the step (%)", "a timed attention share")


def draw_paired(table: pd.DataFrame) -> plt.Figure:
    data, why = rows_or_why(table, "paired_speed", "a paired comparison with the SDPA default", "paired_reason",
                            ROWS)
    if why:
        return nothing_to_draw(why + "\n(A cell pairs with the SDPA default under steps.paired_rounds.)")
    data = data.sort_values(["model", "phase", "seq_len", "batch", "backend"]).reset_index(drop=True)
    labels = data["backend"] + ", " + data["phase"] + "\n" + _label(data).str.replace("\n", " ", regex=False)
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(data) + 1.5), squeeze=False)
    speed, energy = axes[0]
    rows = range(len(data))
    speed.errorbar(data["paired_speed"], rows, fmt="o",
                   xerr=[data["paired_speed"] - data["paired_speed_min"], data["paired_speed_max"] - data["paired_speed"]])
    speed.set_xlabel("tokens per second against the SDPA default\n(same GPU, same process: median of rounds, range)")
    speed.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    speed.set_yticks(list(rows), labels)
    speed.invert_yaxis()
    title = "joules per token against the SDPA default"
    if data["paired_energy"].notna().any():
        energy.sharey(speed)
        energy.errorbar(data["paired_energy"], rows, fmt="o", xerr=[data["paired_energy"] - data["paired_energy_min"],
                                                                   data["paired_energy_max"] - data["paired_energy"]])
        energy.set_xlabel(title + "\n(same GPU, same process: median of rounds, range)")
        energy.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        energy.tick_params(labelleft=False)
    else:
        not_measured_panel(energy, title, no_values(data, "paired_energy", "a paired energy comparison",
                                                    energy_reasons, ROWS))
    fig.tight_layout()
    return fig


def draw_memory(table: pd.DataFrame) -> plt.Figure:
    train = table[table["phase"] == "train"]
    if train.empty:
        return nothing_to_draw("The suite's model table has no train cells (memory is drawn for training steps).")
    data, why = rows_or_why(train, "peak_allocated_bytes", "a peak memory measurement", rows=ROWS)
    if why:
        return nothing_to_draw(why)
    data["GiB"] = data["peak_allocated_bytes"] / 2**30
    data["recompute"] = data["recompute"].map(lambda share: recompute_words(share) or "no recompute")
    grid = sns.relplot(data=data, x="seq_len", y="GiB", hue="backend", style="recompute", col="model", kind="line",
                       marker="o", height=3.2, aspect=1.2, facet_kws={"sharey": False})
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
    grid.set_axis_labels("context length L", "peak memory of a train step (GiB)")
    return grid.figure


MODEL_FIGURES = registry(
    FigureSpec("model_throughput", "pdf", "Tokens per second of a model step, per attention backend",
               "Median of timed steps (CUDA events), warm-up and compile excluded; prefill keeps the last "
               "position's logits; train is forward, backward and a fused AdamW step.", draw_throughput, TABLE),
    FigureSpec("model_energy", "pdf", "Joules per token, per attention backend",
               "NVML energy counter over a window of whole steps run back to back, divided by the tokens in "
               "the window.", draw_energy, TABLE),
    FigureSpec("model_memory", "pdf", "Peak memory of a training step against the context",
               "torch.cuda.max_memory_allocated over the timed steps (weights, gradients, AdamW states and "
               "activations), with and without activation recompute (of every block or a share of them).",
               draw_memory, TABLE),
    FigureSpec("model_attention_share", "pdf", "How much of the step is attention",
               "CUDA events around every attention call, forward and backward, in marked steps of their own, "
               "over the marked step's time.", draw_share, TABLE),
    FigureSpec("model_paired", "pdf", "A backend beside the SDPA default on the same GPU",
               "Paired rounds (steps.paired_rounds): the cell's backend and the SDPA default on the same model "
               "in one process, alternating ABBA; each round's step-time ratio (CUDA events, median of the "
               "round's steps) and joules-per-token ratio (an NVML window of each); the point is the median "
               "over the rounds, the bar their range.", draw_paired, TABLE),
    *GOVERNED_FIGURES,
)
