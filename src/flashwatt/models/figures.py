"""The models suite's figures, from its table (flashwatt.models.summary):

- model_throughput: tokens per second per backend, for each model, phase and context;
- model_energy: joules per token per backend, the same cells;
- model_memory: peak memory of a training step against the context, with and without
  activation recompute;
- model_attention_share: the attention's share of the step per backend;
- model_paired: each paired cell's speed and joules per token against the SDPA default
  in the same process on the same GPU (flashwatt.models.paired), with the rounds' range.

Only cells that finished `ok` are drawn; a figure with nothing to draw says why.
"""
from __future__ import annotations


import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from flashwatt.plot_axes import plain_log_x  # noqa: E402
from flashwatt.attention.figures import TableFigure, nothing_to_draw, ok_rows_or_why  # noqa: E402


def _label(data: pd.DataFrame) -> pd.Series:
    options = data["recompute"].map({True: " recompute", False: ""}) + data["compiled"].map({True: " compiled",
                                                                                              False: ""})
    if "gpus" in data:
        options = options + [f" {g} GPUs {s}" if g > 1 else "" for g, s in zip(data["gpus"], data["strategy"])]
    return (data["model"] + "\nL=" + data["seq_len"].astype(str) + " B=" + data["batch"].astype(str) + " "
            + data["precision"] + options)


def _bars(table: pd.DataFrame, column: str, xlabel: str, log: bool = False) -> plt.Figure:
    """Horizontal bars per cell and backend, a panel per phase. `log`: a log x axis over
    each panel's own range, for a quantity that spans decades between models (GPT-2's
    tokens per second and Llama-3-8B's are 30x apart: on a linear axis the 8B's bars
    would be slivers)."""
    data, why = ok_rows_or_why(table, column, "model")
    if why:
        return nothing_to_draw(why)
    data["cell"] = _label(data)
    bars = data["cell"].nunique() * data["backend"].nunique()
    height = max(3.0, 0.22 * bars + 1.0)  # a bar a quarter inch high; panels 6 inches wide
    grid = sns.catplot(data=data, y="cell", x=column, hue="backend", col="phase", kind="bar", height=height,
                       aspect=6.0 / height, sharex=False, sharey=False, orient="h")
    grid.set_axis_labels(xlabel, "")
    if log:
        for phase, ax in grid.axes_dict.items():
            values = data.loc[data["phase"] == phase, column]
            ax.set_xscale("log")
            ax.set_xlim(values.min() / 1.5, values.max() * 1.3)  # bars start at the left edge
            plain_log_x(ax)
    return grid.figure


def draw_throughput(table: pd.DataFrame) -> plt.Figure:
    return _bars(table, "tokens_per_s", "tokens per second (log scale)", log=True)


def draw_energy(table: pd.DataFrame) -> plt.Figure:
    return _bars(table, "j_per_token", "joules per token (NVML counter over whole steps; log scale)", log=True)


def draw_share(table: pd.DataFrame) -> plt.Figure:
    return _bars(table.assign(attention_percent=table["attention_share"] * 100), "attention_percent",
                 "attention share of the step (%)")


def draw_paired(table: pd.DataFrame) -> plt.Figure:
    data, why = ok_rows_or_why(table, "paired_speed", "model")
    if why:
        return nothing_to_draw(why + " (a cell pairs with the SDPA default under steps.paired_rounds)")
    data = data.sort_values(["model", "phase", "seq_len", "batch", "backend"]).reset_index(drop=True)
    labels = data["backend"] + ", " + data["phase"] + "\n" + _label(data).str.replace("\n", " ", regex=False)
    energy = data["paired_energy"].notna().any()
    fig, axes = plt.subplots(1, 2 if energy else 1, figsize=(11 if energy else 6, 0.5 * len(data) + 1.5),
                             sharey=True, squeeze=False)
    rows = range(len(data))
    speed = axes[0][0]
    speed.errorbar(data["paired_speed"], rows, fmt="o",
                   xerr=[data["paired_speed"] - data["paired_speed_min"], data["paired_speed_max"] - data["paired_speed"]])
    speed.set_xlabel("tokens per second against the SDPA default\n(same GPU, same process: median of rounds, range)")
    if energy:
        axes[0][1].errorbar(data["paired_energy"], rows, fmt="o", xerr=[data["paired_energy"] - data["paired_energy_min"],
                                                                    data["paired_energy_max"] - data["paired_energy"]])
        axes[0][1].set_xlabel("joules per token against the SDPA default\n(same GPU, same process: median of rounds, range)")
    for ax in axes[0]:
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    speed.set_yticks(list(rows), labels)
    speed.invert_yaxis()
    fig.tight_layout()
    return fig


def draw_memory(table: pd.DataFrame) -> plt.Figure:
    train = table[table["phase"] == "train"]
    if train.empty:
        return nothing_to_draw("the suite has no train cells in its summary (memory is drawn for training steps)")
    data, why = ok_rows_or_why(train, "peak_allocated_bytes", "model")
    if why:
        return nothing_to_draw(why)
    data["GiB"] = data["peak_allocated_bytes"] / 2**30
    data["recompute"] = data["recompute"].map({True: "recompute", False: "no recompute"})
    grid = sns.relplot(data=data, x="seq_len", y="GiB", hue="backend", style="recompute", col="model", kind="line",
                       marker="o", height=3.2, aspect=1.2, facet_kws={"sharey": False})
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
    grid.set_axis_labels("context length L", "peak memory of a train step (GiB)")
    return grid.figure


MODEL_FIGURES: dict[str, TableFigure] = {
    f.name: f
    for f in [
        TableFigure("model_throughput", "pdf", "Tokens per second of a model step, per attention backend",
                    "Median of timed steps (CUDA events), warm-up and compile excluded; prefill keeps the last "
                    "position's logits; train is forward, backward and a fused AdamW step.", draw_throughput),
        TableFigure("model_energy", "pdf", "Joules per token, per attention backend",
                    "NVML energy counter over a window of whole steps run back to back, divided by the tokens in "
                    "the window.", draw_energy),
        TableFigure("model_memory", "pdf", "Peak memory of a training step against the context",
                    "torch.cuda.max_memory_allocated over the timed steps (weights, gradients, AdamW states and "
                    "activations), with and without activation recompute.", draw_memory),
        TableFigure("model_attention_share", "pdf", "How much of the step is attention",
                    "CUDA events around every attention call, forward and backward, in marked steps of their own, "
                    "over the marked step's time.", draw_share),
        TableFigure("model_paired", "pdf", "A backend beside the SDPA default on the same GPU",
                    "Paired rounds (steps.paired_rounds): the cell's backend and the SDPA default on the same model "
                    "in one process, alternating ABBA; each round's step-time ratio (CUDA events, median of the "
                    "round's steps) and joules-per-token ratio (an NVML window of each); the point is the median "
                    "over the rounds, the bar their range.", draw_paired),
    ]
}


def draw(name: str, table_path: str, out: str) -> None:
    MODEL_FIGURES[name].save(table_path, out)
