"""The governed model cells' figure (flashwatt.models.governed_job): power against time for
each run under a budget, the job's total and each GPU's, with the budget (and the
temperature loop's power cap where a limit was held) across, from the controller's ticks
(the suite's `models_governed_traces.parquet`) and the model table."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from flashwatt.figure_base import FigureSpec, Source, nothing_to_draw
from flashwatt.plotting import plt

PANEL_COLUMNS = 2
MAX_PANELS = 8


@dataclass
class GovernedTables:
    table: pd.DataFrame
    traces: pd.DataFrame

    @classmethod
    def read(cls, table: str, traces: str) -> "GovernedTables":
        return cls(pd.read_parquet(table), pd.read_parquet(traces))

    @staticmethod
    def cells(data: "GovernedTables") -> pd.DataFrame:
        governed = data.table[data.table["governor"].fillna("").ne("") & data.table["governor"].ne("front")]
        return governed


def draw_power(data: GovernedTables) -> plt.Figure:
    traces = data.traces
    runs = list(dict.fromkeys(traces["cell_id"])) if len(traces) else []
    if not runs:
        return nothing_to_draw("No governed model run has a trace: the suite has no model cell with a budget (a "
                               "grid's `governors`), or none ran on a GPU with NVML.")
    runs = runs[:MAX_PANELS]
    cols = min(PANEL_COLUMNS, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.2 * rows), squeeze=False)
    for ax, cell_id in zip(axes.flat, runs):
        run = traces[traces["cell_id"] == cell_id].sort_values("t")
        per_gpu = sorted(c for c in run.columns if c.startswith("power_w_rank") and run[c].notna().any())
        for column in per_gpu:
            ax.plot(run["t"], run[column], linewidth=0.8, alpha=0.7, label=f"GPU {column.removeprefix('power_w_rank')}")
        ax.plot(run["t"], run["power_w"], color="black", linewidth=1.2, label="total" if per_gpu else "GPU")
        ax.step(run["t"], run["budget_w"], where="post", color="C3", linestyle="--", linewidth=1.0, label="budget")
        if "thermal_cap_w" in run and run["thermal_cap_w"].notna().any():
            ax.plot(run["t"], run["thermal_cap_w"], color="C1", linestyle=":", linewidth=1.0,
                    label="temperature loop's cap")
        first = run.iloc[0]
        ax.set_title(f"{first['model']} {first['phase']} {first['governor']}"
                     + (f", {int(first['gpus'])} GPUs" if first["gpus"] > 1 else ""), fontsize=9)
        ax.set_xlabel("seconds")
        ax.set_ylabel("power (W, NVML)")
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


GOVERNED_FIGURES = (
    FigureSpec("model_governed_power", "png", "Power of model steps under a budget, per GPU and in total",
               "The step-level controller's ticks (NVML instant power, about ten a second; on several GPUs each "
               "GPU's and the job's sum, which the budget holds); the budget dashed, the temperature loop's "
               "power cap dotted where a limit was held.",
               draw_power, Source(("table", "governed_traces"), GovernedTables.read, GovernedTables.cells)),
)
