"""The training suite's figures, from its tables (flashwatt.training.summary):

- training_curves: validation loss against tokens, wall seconds and kilojoules, a line
  per run, coloured by setting (the cell fields that vary in the suite), the target loss
  drawn across;
- training_to_target: seconds and kilojoules to the target loss per setting, the bar at
  the mean over seeds, each seed a dot (the spread);
- training_throughput: training tokens per second per attention backend and model, mean
  over the runs with each seed a dot.

Only runs that finished `ok` are drawn; a figure with nothing to draw says why.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from flashwatt.attention.figures import TableFigure, nothing_to_draw, ok_rows_or_why  # noqa: E402

# The fields a setting label is made of, when they vary in the suite (the seed never: the
# runs of one setting share a colour).
_LABELLED = ["model", "backend", "precision", "optimizer", "schedule", "lr", "dropout", "weight_decay", "batch",
             "context", "token_budget"]


def setting_labels(table: pd.DataFrame) -> pd.Series:
    """A short label per row: the fields that take more than one value in `table`."""
    varying = [c for c in _LABELLED if table[c].nunique() > 1] or ["optimizer", "schedule"]

    def label(row) -> str:
        parts = []
        for c in varying:
            value = row[c]
            parts.append(f"{c} {value:g}" if isinstance(value, float) else str(value))
        return " ".join(parts)

    return table.apply(label, axis=1)


def draw_curves(curves: pd.DataFrame) -> plt.Figure:
    """From the curves table (a row per evaluation, with its run's status)."""
    curves, why = ok_rows_or_why(curves, "val_loss", "training")
    if why:
        return nothing_to_draw(why)
    curves["setting"] = setting_labels(curves)
    curves["kJ"] = curves["energy_j"] / 1e3
    axes_of = [("tokens", "tokens trained"), ("wall_s", "wall seconds (evaluations included)")]
    if curves["kJ"].notna().any():
        axes_of.append(("kJ", "kilojoules (NVML counter)"))
    fig, axes = plt.subplots(1, len(axes_of), figsize=(5.2 * len(axes_of), 4.0), sharey=True, squeeze=False)
    target = curves["target_loss"].dropna()
    for ax, (x, xlabel) in zip(axes[0], axes_of):
        sns.lineplot(data=curves, x=x, y="val_loss", hue="setting", units="cell_id", estimator=None, ax=ax,
                     linewidth=1.0, alpha=0.8, legend=ax is axes[0][-1])
        if len(target):
            ax.axhline(float(target.iloc[0]), color="0.3", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats/token)")
    top = curves["val_loss"].quantile(0.98)
    axes[0][0].set_ylim(curves["val_loss"].min() - 0.1, top + 0.1)
    legend = axes[0][-1].get_legend()
    if legend is not None:
        sns.move_legend(axes[0][-1], "upper left", bbox_to_anchor=(1.02, 1), title="setting (one line per seed)")
    fig.tight_layout()
    return fig


def draw_to_target(runs: pd.DataFrame) -> plt.Figure:
    ok, why = ok_rows_or_why(runs, "wall_s_to_target", "training")
    if why:
        return nothing_to_draw(why + " (to-target figures need runs that reached the suite's target_loss)")
    ok["setting"] = setting_labels(ok)
    ok["kJ_to_target"] = ok["energy_j_to_target"] / 1e3
    panels = [("wall_s_to_target", "seconds to target")]
    if ok["kJ_to_target"].notna().any():
        panels.append(("kJ_to_target", "kilojoules to target"))
    height = max(2.5, 0.35 * ok["setting"].nunique() + 1.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), height), squeeze=False)
    order = sorted(ok["setting"].unique())
    for ax, (column, xlabel) in zip(axes[0], panels):
        sns.barplot(data=ok, y="setting", x=column, order=order, errorbar=None, ax=ax, color="0.8")
        sns.stripplot(data=ok, y="setting", x=column, order=order, ax=ax, color="C3", size=4)
        ax.set_xlabel(xlabel + f" (loss {float(ok['target_loss'].iloc[0]):g})")
        ax.set_ylabel("")
    fig.tight_layout()
    return fig


def draw_throughput(runs: pd.DataFrame) -> plt.Figure:
    ok, why = ok_rows_or_why(runs, "steady_tokens_per_s", "training")
    if why:
        return nothing_to_draw(why)
    ok["label"] = ok["model"] + " " + ok["precision"] + " B" + ok["batch"].astype(str) + " L" + ok["context"].astype(str)
    height = max(2.5, 0.3 * ok["label"].nunique() * ok["backend"].nunique() + 1.0)
    fig, ax = plt.subplots(figsize=(6.5, height))
    sns.barplot(data=ok, y="label", x="steady_tokens_per_s", hue="backend", errorbar=None, ax=ax)
    sns.stripplot(data=ok, y="label", x="steady_tokens_per_s", hue="backend", dodge=True, ax=ax, color="0.2", size=3,
                  legend=False)
    ax.set_xlabel("training tokens per second (steady: after the first evaluation; dots: each run)")
    ax.set_ylabel("")
    return fig


TRAINING_FIGURES: dict[str, TableFigure] = {
    f.name: f
    for f in [
        TableFigure("training_curves", "pdf", "Validation loss against tokens, time and energy",
                    "Mean cross-entropy over the suite's fixed validation windows at each evaluation; time and "
                    "NVML energy from the run's start, evaluations included.", draw_curves),
        TableFigure("training_to_target", "pdf", "Time and energy to the target validation loss",
                    "Measured at the first evaluation at or below the target (resolution: one evaluation "
                    "interval); bars at the mean over seeds, each seed a dot.", draw_to_target),
        TableFigure("training_throughput", "pdf", "Training throughput per attention backend",
                    "Tokens trained over seconds spent in training steps (evaluations excluded).", draw_throughput),
    ]
}


# The table each figure is drawn from: the curves (a row per evaluation) or the runs.
FROM_CURVES = {"training_curves"}


def draw(name: str, runs_path: str, curves_path: str, out: str) -> None:
    """Draw figure `name` from the suite's runs or curves table."""
    TRAINING_FIGURES[name].save(curves_path if name in FROM_CURVES else runs_path, out)
