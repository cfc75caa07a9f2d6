"""The training suite's figures, from its tables (flashwatt.training.summary):

- training_curves: validation loss against tokens, wall seconds and kilojoules, a line
  per run, coloured by setting (the cell fields that vary in the suite), the target loss
  drawn across;
- training_to_target: seconds and kilojoules to the target loss per setting, the bar at
  the mean over seeds, each seed a dot (the spread);
- training_throughput: training tokens per second per attention backend and model, mean
  over the runs with each seed a dot;
- training_budgets: validation loss against kilojoules and seconds for the runs under a
  power budget (flashwatt.training.governed), a line per run coloured by its budget.

Only runs that finished `ok` are drawn; a figure with nothing to draw says why. Energy is
drawn where the runs measured it (NVML, on an NVIDIA GPU): elsewhere the titles leave it
out and a panel in its place says why. Each figure is a `FigureSpec` of
flashwatt.figure_base, drawn from the runs table or the curves table.
"""
from __future__ import annotations

import pandas as pd

from flashwatt.figure_base import (FigureSpec, Source, not_measured_panel, nothing_to_draw, parquet_table, registry,
                                   spoken_list)
from flashwatt.placeholder import Rows, energy_reasons, missing_bar, no_cells_ok, no_values, rows_or_why
from flashwatt.plot_axes import bar_slots, mark_missing_bars
from flashwatt.plotting import plt, sns

ROWS = Rows("training run", "the suite's training table")
# The fields a setting label is made of, when they vary in the suite (the seed never: the
# runs of one setting share a colour).
_LABELLED = ["model", "backend", "precision", "optimizer", "schedule", "lr", "dropout", "weight_decay", "batch",
             "context", "token_budget", "governor"]


def _runs_of(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run of the curves table (a row per evaluation, each with its run's status)."""
    return curves.drop_duplicates("cell_id")


RUNS = parquet_table("runs")
CURVES = Source(("curves",), pd.read_parquet, _runs_of)


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


def _ok_curves(curves: pd.DataFrame) -> pd.DataFrame:
    return curves[(curves["status"] == "ok") & curves["val_loss"].notna()].copy()


def _measured(rows: pd.DataFrame, column: str) -> bool:
    return bool(rows[column].notna().any())


def curves_title(curves: pd.DataFrame) -> str:
    """'Validation loss against tokens, time and energy', energy only where it was measured."""
    energy = ["energy"] if _measured(_ok_curves(curves), "energy_j") else []
    return f"Validation loss against {spoken_list(['tokens', 'time', *energy])}"


def draw_curves(curves: pd.DataFrame) -> plt.Figure:
    """From the curves table (a row per evaluation, with its run's status): loss against
    tokens, wall seconds and, where measured, kilojoules; in energy's place otherwise, why."""
    data = _ok_curves(curves)
    if data.empty:
        return nothing_to_draw(no_values(_runs_of(curves), "val_loss", "a validation loss", rows=ROWS))
    data["setting"] = setting_labels(data)
    data["kJ"] = data["energy_j"] / 1e3
    energy = _measured(data, "energy_j")
    axes_of = [("tokens", "tokens trained"), ("wall_s", "wall seconds (evaluations included)")]
    if energy:
        axes_of.append(("kJ", "kilojoules (NVML counter)"))
    fig, axes = plt.subplots(1, 3, figsize=(5.2 * 3, 4.0), squeeze=False)
    drawn = list(axes[0][:len(axes_of)])
    target = data["target_loss"].dropna()
    for ax, (x, xlabel) in zip(drawn, axes_of):
        sns.lineplot(data=data, x=x, y="val_loss", hue="setting", units="cell_id", estimator=None, ax=ax,
                     linewidth=1.0, alpha=0.8, legend=ax is drawn[-1])
        if len(target):
            ax.axhline(float(target.iloc[0]), color="0.3", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats/token)")
    for ax in drawn[1:]:
        ax.sharey(drawn[0])
    top = data["val_loss"].quantile(0.98)
    drawn[0].set_ylim(data["val_loss"].min() - 0.1, top + 0.1)
    if not energy:
        not_measured_panel(axes[0][2], "energy", no_values(_runs_of(curves), "energy_j", "an energy measurement",
                                                           energy_reasons, ROWS))
    if drawn[-1].get_legend() is not None:
        sns.move_legend(drawn[-1], "upper left", bbox_to_anchor=(1.02, 1), title="setting (one line per seed)")
    fig.tight_layout()
    return fig


def _reached(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[(runs["status"] == "ok") & runs["wall_s_to_target"].notna()]


def to_target_title(runs: pd.DataFrame) -> str:
    """'Time and energy to the target validation loss', energy only where it was measured."""
    energy = ["energy"] if _measured(_reached(runs), "energy_j_to_target") else []
    return f"{spoken_list(['Time', *energy])} to the target validation loss"


def draw_to_target(runs: pd.DataFrame) -> plt.Figure:
    ok, why = rows_or_why(runs, "wall_s_to_target", "a time to the target loss", rows=ROWS)
    if why:
        return nothing_to_draw(why + "\nA run has one when it reaches the suite's target_loss.")
    ok["setting"] = setting_labels(ok)
    ok["kJ_to_target"] = ok["energy_j_to_target"] / 1e3
    panels = [("wall_s_to_target", "seconds to target")]
    if _measured(ok, "energy_j_to_target"):
        panels.append(("kJ_to_target", "kilojoules to target"))
    height = max(2.5, 0.35 * ok["setting"].nunique() + 1.0)
    fig, axes = plt.subplots(1, 2, figsize=(5.5 * 2, height), squeeze=False)
    order = sorted(ok["setting"].unique())
    for ax, (column, xlabel) in zip(axes[0], panels):
        sns.barplot(data=ok, y="setting", x=column, order=order, errorbar=None, ax=ax, color="0.8")
        sns.stripplot(data=ok, y="setting", x=column, order=order, ax=ax, color="C3", size=4)
        ax.set_xlabel(xlabel + f" (loss {float(ok['target_loss'].iloc[0]):g})")
        ax.set_ylabel("")
    if len(panels) == 1:
        not_measured_panel(axes[0][1], "energy to target", no_values(ok, "energy_j_to_target",
                                                                     "an energy measurement", energy_reasons, ROWS))
    fig.tight_layout()
    return fig


def _shape_label(runs: pd.DataFrame) -> pd.Series:
    return runs["model"] + " " + runs["precision"] + " B" + runs["batch"].astype(str) + " L" + runs["context"].astype(str)


def draw_throughput(runs: pd.DataFrame) -> plt.Figure:
    """Tokens per second per backend, a bar group per model and shape; a backend's missing
    bar is marked with its runs' outcome."""
    ok, why = rows_or_why(runs, "steady_tokens_per_s", "a timed training step", rows=ROWS)
    if why:
        return nothing_to_draw(why)
    labelled = runs.assign(label=_shape_label(runs))  # every outcome, for the missing bars' marks
    ok = ok.assign(label=_shape_label(ok))
    finished = labelled[labelled["status"] == "ok"]
    order, backends = sorted(finished["label"].unique()), sorted(finished["backend"].unique())
    height = max(2.5, 0.3 * len(order) * len(backends) + 1.0)
    fig, ax = plt.subplots(figsize=(6.5, height))
    sns.barplot(data=ok, y="label", x="steady_tokens_per_s", hue="backend", order=order, hue_order=backends,
                errorbar=None, ax=ax)
    sns.stripplot(data=ok, y="label", x="steady_tokens_per_s", hue="backend", order=order, hue_order=backends,
                  dodge=True, ax=ax, palette={backend: "0.2" for backend in backends}, size=3, legend=False)
    present = set(zip(ok["label"], ok["backend"]))
    mark_missing_bars(ax, {position: missing_bar(labelled[(labelled["label"] == label)
                                                          & (labelled["backend"] == backend)],
                                                 "steady_tokens_per_s", subject=backend)
                           for (label, backend), position in bar_slots(order, backends).items()
                           if (label, backend) not in present}, horizontal=True)
    ax.set_xlabel("training tokens per second (steady: after the first evaluation; dots: each run)")
    ax.set_ylabel("")
    return fig


def draw_budgets(curves: pd.DataFrame) -> plt.Figure:
    """Validation loss against kilojoules and wall seconds for the runs under a budget (and the
    runs of the same settings without one), a line per run coloured by its governor."""
    nothing_ok = no_cells_ok(_runs_of(curves), ROWS)
    if nothing_ok:
        return nothing_to_draw(nothing_ok)
    data = _ok_curves(curves)
    governed = data[data["governor"].fillna("").ne("")] if "governor" in data else data.iloc[:0]
    if governed.empty:
        return nothing_to_draw("No training run under a budget finished: the suite has no training grid with "
                               "`governors`, or none of those runs finished ok.")
    if not _measured(governed, "energy_j"):
        return nothing_to_draw(no_values(_runs_of(curves), "energy_j", "an energy measurement", energy_reasons, ROWS))
    data = data.assign(kJ=data["energy_j"] / 1e3,
                       budget=data["governor"].fillna("").replace("", "no controller"))
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0), squeeze=False)
    for ax, (x, xlabel) in zip(axes[0], [("kJ", "kilojoules (NVML counter, evaluations included)"),
                                         ("wall_s", "wall seconds")]):
        sns.lineplot(data=data, x=x, y="val_loss", hue="budget", units="cell_id", estimator=None, ax=ax,
                     linewidth=1.0, legend=ax is axes[0][1])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats/token)")
    if axes[0][1].get_legend() is not None:
        sns.move_legend(axes[0][1], "upper left", bbox_to_anchor=(1.02, 1), title="governor (one line per run)")
    fig.tight_layout()
    return fig


TRAINING_FIGURES = registry(
    FigureSpec("training_curves", "pdf", curves_title,
               "Mean cross-entropy over the suite's fixed validation windows at each evaluation; time and "
               "NVML energy from the run's start, evaluations included. Without NVML (no NVIDIA GPU) energy "
               "is not drawn, and its panel says why.", draw_curves, CURVES),
    FigureSpec("training_to_target", "pdf", to_target_title,
               "Measured at the first evaluation at or below the target (resolution: one evaluation "
               "interval); bars at the mean over seeds, each seed a dot. Without NVML energy is not drawn, "
               "and its panel says why.", draw_to_target, RUNS),
    FigureSpec("training_throughput", "pdf", "Training throughput per attention backend",
               "Tokens trained over seconds spent in training steps (evaluations excluded); a backend's "
               "missing bar is marked with its runs' outcome.", draw_throughput, RUNS),
    FigureSpec("training_budgets", "pdf", "Validation loss against energy and time under power budgets",
               "Runs under the step-level controller (a grid's governors: a budget, a schedule or energy mode; "
               "flashwatt.training.governed) beside the runs of the suite without one; energy from the NVML counter "
               "from the run's start, evaluations included.", draw_budgets, CURVES),
)
