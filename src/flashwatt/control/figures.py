"""The control suite's figures, from its three tables (flashwatt.control.summary):

- control_power: each run's power against time, with its budget (and the +3% band), the
  1 s window averages it is judged by, the exploration phase, the configuration switches
  and the start of a disturbance;
- control_pareto: throughput against power for every static configuration and duty of
  the oracle, its Pareto front (and the line time-sharing its points gives), and where each
  controlled run operated;
- control_energy: joules per token against the budget for the controller, the oracle's
  most frugal static configuration within that budget and the static default;
- control_scenarios: every budget run and generated scenario against the targets (windows
  within budget + 3%, settling after steps, throughput against the static front), with the
  pooled figures (flashwatt.control.pooled) in each row's title.

Only runs that finished `ok` are drawn; a figure with nothing to draw says why. Each is a
`FigureSpec` of flashwatt.figure_base, drawn from the three tables (`CONTROL_TABLES`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from flashwatt.control.metrics import TOLERANCE, window_power
from flashwatt.control.pooled import ALL_BUDGET_RUNS, pooled_table
from flashwatt.control.summary import least_energy_static, pareto_front, static_default, usable_static
from flashwatt.figure_base import FigureSpec, Source, nothing_to_draw, registry
from flashwatt.placeholder import Rows, no_cells_ok
from flashwatt.plotting import plt, sns

PANEL_COLUMNS = 3
# Switches labelled in a panel (after exploration); more would overprint one another.
MAX_SWITCH_LABELS = 6
RUNS = Rows("controlled run", "the suite's control table")


@dataclass
class ControlTables:
    runs: pd.DataFrame
    oracle: pd.DataFrame
    traces: pd.DataFrame

    @classmethod
    def read(cls, runs: str | Path, oracle: str | Path, traces: str | Path) -> "ControlTables":
        return cls(pd.read_parquet(runs), pd.read_parquet(oracle), pd.read_parquet(traces))

    def cells(self) -> pd.DataFrame:
        """One row per control cell (runs and oracles), for the line under each title."""
        columns = ["cell_id", "suite", "status", "device", "device_type"]
        oracle = self.oracle.drop_duplicates("cell_id")
        return pd.concat([self.runs.reindex(columns=columns), oracle.reindex(columns=columns)], ignore_index=True)

    def ok_runs(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] == "ok"]


# Every control figure is drawn from the runs, the oracle's static rows and the runs' traces
# (the pooled figures are the runs', pooled again where drawn).
CONTROL_TABLES = Source(("runs", "oracle", "traces"), ControlTables.read, ControlTables.cells)


def _panels(count: int, width: float = 5.0, height: float = 3.0, sharey: bool = False):
    cols = min(PANEL_COLUMNS, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharey=sharey)
    for ax in axes.flat[count:]:  # the grid's last row may be short: no empty panel is drawn
        ax.remove()
    return fig, list(axes.flat[:count])


def _switches(trace: pd.DataFrame) -> pd.DataFrame:
    config = trace["config"].ffill()
    changed = config.ne(config.shift()) & config.shift().notna()
    return trace.loc[changed, ["t", "config"]].assign(config=config[changed])


def draw_power(tables: ControlTables) -> plt.Figure:
    runs = tables.ok_runs()
    runs = runs[runs["cell_id"].isin(set(tables.traces["cell_id"]))]
    if runs.empty:
        ok = len(tables.ok_runs())
        return nothing_to_draw(no_cells_ok(tables.runs, RUNS)
                               or f"None of the {ok} controlled runs that finished ok recorded a power trace.")
    fig, axes = _panels(len(runs), sharey=True)
    for ax, run in zip(axes, runs.itertuples()):
        trace = tables.traces[tables.traces["cell_id"] == run.cell_id].sort_values("t")
        # a column that is empty in some runs (budget in energy mode) comes back as objects
        trace = trace.assign(**{c: pd.to_numeric(trace[c], errors="coerce") for c in ("t", "power_w", "budget_w")})
        explored = trace.loc[trace["phase"] == "explore", "t"]
        if len(explored):
            ax.axvspan(0, explored.max(), color="0.92", label="exploration", lw=0)
        ax.plot(trace["t"], trace["power_w"], lw=0.6, color="0.55", label="instant power (NVML)")
        if "observed_power_w" in trace and trace["observed_power_w"].notna().any():
            after = trace[trace["power_w"].isna()]
            ax.plot(after["t"], pd.to_numeric(after["observed_power_w"], errors="coerce"), lw=0.8, ls=":",
                    color="C4", label="power read independently while the controller's NVML failed")
        windows = window_power(trace).dropna(subset=["power_w"])
        if len(windows):
            ends = windows["start"].iloc[-1] + 1.0
            ax.step([*windows["start"], ends], [*windows["power_w"], windows["power_w"].iloc[-1]], where="post",
                    color="C0", lw=1.6, label=f"1 s windows ({windows['source'].iloc[0]})")
        if trace["budget_w"].notna().any():
            ax.step(trace["t"], trace["budget_w"], where="post", color="C3", ls="--", lw=1.2, label="budget")
            ax.fill_between(trace["t"], trace["budget_w"], trace["budget_w"] * (1 + TOLERANCE), step="post",
                            color="C3", alpha=0.15, lw=0, label=f"budget + {TOLERANCE:.0%}")
        switches = _switches(trace)
        after = switches[switches["t"] > (explored.max() if len(explored) else -1)]
        for s in switches.itertuples():
            ax.axvline(s.t, color="C2", lw=0.5, ls=":")
        for s in after.head(MAX_SWITCH_LABELS).itertuples():
            ax.text(s.t, 0.02, f" {s.config}", transform=ax.get_xaxis_transform(), rotation=90, fontsize=6,
                    va="bottom", color="C2")
        if isinstance(run.disturbance, str) and run.disturbance:
            ax.axvline(run.disturbance_at_s, color="k", lw=1.0, label=run.disturbance.replace("_", " "))
        _shade_spans(ax, run, trace)
        within = f"{run.windows_within_pct:.0f}% of windows within" if pd.notna(run.windows_within_pct) else ""
        ax.set_title(f"{run.group} · {run.scenario}\n{within}", fontsize=8)
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel("power (W)")
    handles, labels = {}, {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=4, fontsize=7,
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def _spans(value) -> list:
    try:
        return json.loads(value) if isinstance(value, str) else []
    except ValueError:
        return []


def _shade_spans(ax, run, trace: pd.DataFrame) -> None:
    """A run's co-located tenants (orange, with their power alone) and NVML failures (purple)."""
    end = float(trace["t"].max()) if len(trace) else 0.0
    for start, stop, alone in _spans(getattr(run, "tenant_spans", None)):
        ax.axvspan(start, min(stop, end), color="C1", alpha=0.12, lw=0, label="co-located tenant")
        if alone is not None:
            ax.hlines(alone, start, min(stop, end), color="C1", lw=0.8, ls="--", label="tenant alone (measured)")
    for start, stop in _spans(getattr(run, "failure_spans", None)):
        ax.axvspan(start, end if stop is None else min(stop, end), color="C4", alpha=0.10, lw=0,
                   label="controller's NVML failing")


def _usable_oracle(tables: ControlTables) -> pd.DataFrame:
    return usable_static(tables.oracle) if len(tables.oracle) else tables.oracle


def draw_pareto(tables: ControlTables) -> plt.Figure:
    oracle = _usable_oracle(tables)
    if oracle.empty:
        return nothing_to_draw("No oracle cell measured throughput and power: the oracle runs its static "
                               "configurations on a GPU with NVML."
                               if tables.oracle.empty or tables.oracle["avg_power_w"].isna().all()
                               else "No static configuration of the oracle passed its check.")
    groups = sorted(oracle["group"].unique())
    fig, axes = _panels(len(groups), width=6.0, height=4.2)
    configs = sorted(oracle["config"].unique())
    palette = dict(zip(configs, sns.color_palette("tab10", len(configs))))
    for ax, group in zip(axes, groups):
        rows = oracle[oracle["group"] == group]
        for config, sub in rows.groupby("config"):
            sub = sub.sort_values("duty")
            ax.plot(sub["avg_power_w"], sub["tokens_per_s"] / 1e6, marker="o", ms=3, lw=0.8,
                    color=palette[config], label=f"static {config}")
        front = pareto_front(rows)
        ax.step(front["avg_power_w"], front["tokens_per_s"] / 1e6, where="post", color="k", lw=1.2, ls="--",
                label="Pareto front of static runs")
        # Between two front points, time-sharing them gives the straight line: the bar that
        # `steady_vs_front` (flashwatt.control.summary.front_at) judges a run against.
        ax.plot(front["avg_power_w"], front["tokens_per_s"] / 1e6, color="k", lw=0.8, ls=":",
                label="time-sharing two static runs")
        runs = tables.ok_runs()
        runs = runs[runs["group"] == group]
        for run in runs.itertuples():
            power = run.steady_avg_power_w if pd.notna(run.steady_avg_power_w) else run.avg_power_w
            tokens = run.steady_tokens_per_s if pd.notna(run.steady_tokens_per_s) else run.tokens_per_s
            if pd.isna(power) or pd.isna(tokens):
                continue
            ax.plot(power, tokens / 1e6, marker="X", ms=8, color="C3", ls="none", label="controller (after exploration)")
            name = f"{run.budget_w:.0f} W" if pd.notna(run.budget_w) else run.mode
            if isinstance(run.disturbance, str) and run.disturbance:
                name += f" {run.disturbance.replace('_', ' ')}"
            elif isinstance(run.budget_schedule, str) and " " in run.budget_schedule:
                name += " steps"
            ax.annotate(name, (power, tokens / 1e6), textcoords="offset points", xytext=(4, -9), fontsize=6, color="C3")
        ax.set_title(group, fontsize=9)
        ax.set_xlabel("average power (W, energy counter)")
        ax.set_ylabel("throughput (M tokens/s)")
    handles = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.tight_layout()
    return fig


def draw_energy(tables: ControlTables) -> plt.Figure:
    why = no_cells_ok(tables.runs, RUNS)
    if why:
        return nothing_to_draw(why)
    runs = tables.ok_runs()
    # text columns empty in every run (no schedule, no disturbance) may come back as floats
    schedule, disturbance = (runs[c].astype("string").fillna("") for c in ("budget_schedule", "disturbance"))
    plain = runs[(runs["mode"] == "budget") & ~schedule.str.contains(" ") & (disturbance == "")
                 & runs["j_per_token"].notna()]
    if plain.empty:
        return nothing_to_draw("No controlled run held a single power budget without a disturbance and measured "
                               "its energy.")
    oracle = _usable_oracle(tables)
    groups = sorted(plain["group"].unique())
    fig, axes = _panels(len(groups), width=6.0, height=4.0)
    for ax, group in zip(axes, groups):
        mine = plain[plain["group"] == group].sort_values("budget_w")
        ax.plot(mine["budget_w"], mine["j_per_token"] * 1e6, marker="o", color="C3", label="controller (whole run)")
        steady = mine.dropna(subset=["steady_j_per_token"])
        if len(steady):
            ax.plot(steady["budget_w"], steady["steady_j_per_token"] * 1e6, marker="o", ls="--", color="C3",
                    mfc="white", label="controller (after exploration)")
        rows = oracle[oracle["group"] == group] if len(oracle) else oracle
        if len(rows):
            frugal = [(b, least_energy_static(rows, b)) for b in mine["budget_w"]]
            frugal = [(b, r) for b, r in frugal if r is not None]
            if frugal:
                ax.plot([b for b, _ in frugal], [r["j_per_token"] * 1e6 for _, r in frugal], marker="s", color="k",
                        label="oracle: least energy static within budget")
            default = static_default(rows)
            if default is not None:
                ax.axhline(default["j_per_token"] * 1e6, color="C0", ls=":",
                           label=f"static default (sdpa, no budget: {default['avg_power_w']:.0f} W)")
        energy = runs[(runs["mode"] == "energy") & (runs["group"] == group) & runs["j_per_token"].notna()]
        for run in energy.itertuples():
            ax.axhline(run.j_per_token * 1e6, color="C2", ls="-.", label=f"energy mode ({run.avg_power_w:.0f} W)")
        ax.set_title(group, fontsize=9)
        ax.set_xlabel("power budget (W)")
        ax.set_ylabel("energy per token (µJ)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _scenario_runs(tables: ControlTables) -> pd.DataFrame:
    runs = tables.ok_runs()
    return runs[runs["mode"].isin(["budget", "random"])]


def _pooled_title(tables: ControlTables, group: str) -> str:
    pooled = pooled_table(tables.runs)
    if pooled.empty:
        return group
    rows = pooled[(pooled["group"] == group) & (pooled["runs_set"] == ALL_BUDGET_RUNS)]
    if rows.empty:
        return group
    row = rows.iloc[0]

    def fmt(value, pattern):
        return "n/a" if value is None or pd.isna(value) else pattern.format(value)
    return (f"{group}: pooled {fmt(row['windows_within_pct'], '{:.1f}')}% windows within, settle p50/p95 "
            f"{fmt(row['step_settle_p50_s'], '{:.2f}')}/{fmt(row['step_settle_p95_s'], '{:.2f}')} s, "
            f"{fmt(row['vs_front'], '{:.3f}')} of the front\nnot met: {row['unmet'] or 'n/a'}")


def draw_scenarios(tables: ControlTables) -> plt.Figure:
    runs = _scenario_runs(tables)
    if runs.empty:
        return nothing_to_draw(no_cells_ok(tables.runs, RUNS) or "No budget run finished ok.")
    groups = sorted(runs["group"].unique())
    height = max(3.0, 0.22 * max(len(runs[runs["group"] == g]) for g in groups) + 1.5)
    fig, axes = plt.subplots(len(groups), 3, figsize=(15, height * len(groups)), squeeze=False, sharey="row")
    for row_axes, group in zip(axes, groups):
        mine = runs[runs["group"] == group].sort_values("scenario")
        y = range(len(mine))
        slowest = [max(map(float, [0.0, *[w for w in str(t).split() if w != "never"]])) if isinstance(t, str) else 0.0
                   for t in mine["step_settle_s"]]
        never = ["never" in str(t) for t in mine["step_settle_s"]]
        panels = [
            (pd.to_numeric(mine["windows_within_pct"], errors="coerce"), 95.0, "1 s windows within budget + 3% (%)"),
            (pd.Series(slowest), 1.0, "slowest settling after a step (s; x: never)"),
            (pd.to_numeric(mine["vs_front"], errors="coerce"), 0.90, "throughput / static front at the mean budget"),
        ]
        for ax, (values, target, label) in zip(row_axes, panels):
            ax.barh(list(y), values.fillna(0).to_numpy(), color="C0")
            ax.axvline(target, color="C3", ls="--", lw=1.0)
            ax.set_xlabel(label, fontsize=8)
        for i, missed in enumerate(never):
            if missed:
                row_axes[1].text(0, i, " x", va="center", color="C3")
        row_axes[0].set_yticks(list(y))
        row_axes[0].set_yticklabels([f"{s} ({c})" if isinstance(c, str) and c else s
                                     for s, c in zip(mine["scenario"], mine["scenario_classes"])], fontsize=6)
        row_axes[1].set_title(_pooled_title(tables, group), fontsize=8)
    fig.tight_layout()
    return fig


CONTROL_FIGURES = registry(
    FigureSpec("control_power", "pdf", "Power against time under the power-aware scheduler",
               "Each controlled run's GPU power (NVML instant readings at 10 Hz, and the 1 s window averages "
               "from the energy counter that the budget is judged by) with its budget and the +3% band. "
               "Grey: the exploration phase; green dotted lines: configuration switches, labelled after "
               "exploration; black: the start of a disturbance (another process's load, or NVML failing); "
               "orange: a co-located tenant (dashed: its power alone, measured before the run); purple: "
               "the controller's NVML failing.",
               draw_power, CONTROL_TABLES),
    FigureSpec("control_pareto", "pdf", "Throughput against power: static configurations and the controller",
               "Every static configuration of the oracle (each duty a point, measured side by side in the "
               "suite), the Pareto front of those static runs (dashed: the best single static run within a "
               "power; dotted: time-sharing two of them), and each controlled run's operating point after "
               "its exploration (red crosses, labelled by budget).", draw_pareto, CONTROL_TABLES),
    FigureSpec("control_energy", "pdf", "Energy per token against the power budget",
               "Joules per token of the controller at each budget (whole run, and after exploration), of "
               "the oracle's least-energy static configuration whose power stays within that budget, of "
               "the static default (sdpa with no backend forced, unbudgeted), and of the energy mode.",
               draw_energy, CONTROL_TABLES),
    FigureSpec("control_scenarios", "pdf", "Every budget run and generated scenario against the targets",
               "Per run (generated scenarios are named random-<seed>-<index>, with their classes: steps, ramps, "
               "co-located tenants, NVML failures, a mix change): the share of its 1 s windows within budget + 3% "
               "(infeasible windows, where a tenant alone drew more than the budget, left out; target 95%), the "
               "slowest settling of its sliding 1 s windows after a budget step (target 1 s), and its whole-run "
               "throughput over the static Pareto front at its time-averaged budget (target 0.90). The pooled "
               "figures are in each row's title.", draw_scenarios, CONTROL_TABLES),
)
