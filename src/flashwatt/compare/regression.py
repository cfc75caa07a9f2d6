"""The regression check: `--fail-if latency:+5% energy:+3%`.

A rule `NAME:+X%` fails a cell whose metric NAME rose by more than X% beyond its noise: the
whole interval of its ratio (other over baseline) lies above 1 + X/100. `NAME:-X%` fails a
fall: the whole interval below 1 - X/100. Without a sign the rule takes the metric's worse
direction (up for latency and energy, down for TFLOP/s and throughput); a sign that points
the better way is refused, since it would fail improvements. A cell with one value per side
has no interval and is judged on its ratio alone (the report says so; `flashwatt run
--repeat N` gives it one).

A cell that was ok on the baseline and ended error, incorrect, diverged or job_failed on
the other side fails any check too: a kernel that stopped working has regressed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from flashwatt.config_error import ConfigError
from flashwatt.job_frame import EXPECTED_STATUSES
from flashwatt.kinds import all_kinds

_RULE = re.compile(r"^(?P<name>[a-z_]+):(?P<sign>[+-]?)(?P<pct>\d+(?:\.\d+)?)%?$")


@dataclass(frozen=True)
class Rule:
    metric: str
    worse: str         # "up" or "down"
    threshold: float   # a fraction: 0.05 for 5%

    def __str__(self) -> str:
        return f"{self.metric}:{'+' if self.worse == 'up' else '-'}{self.threshold * 100:g}%"


def _metric_directions() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for kind in all_kinds():
        for metric in kind.compare_metrics:
            out.setdefault(metric.name, set()).add("up" if metric.better == "lower" else "down")
    return out


def parse_rule(text: str) -> Rule:
    """A rule from its text, or ConfigError saying what is wrong with it."""
    match = _RULE.match(text.strip())
    directions = _metric_directions()
    if match is None:
        raise ConfigError(f"--fail-if {text!r}: write METRIC:+PCT% (e.g. latency:+5%) or METRIC:-PCT% "
                          f"(e.g. tflops:-5%); metrics: {', '.join(sorted(directions))}")
    name, sign, pct = match["name"], match["sign"], float(match["pct"])
    if name not in directions:
        raise ConfigError(f"--fail-if {text!r}: no kind compares a metric {name!r}; "
                          f"metrics: {', '.join(sorted(directions))}")
    worse = directions[name].pop() if len(directions[name]) == 1 else "up"
    wanted = {"+": "up", "-": "down"}.get(sign, worse)
    if wanted != worse:
        better = "lower" if worse == "up" else "higher"
        raise ConfigError(f"--fail-if {text!r}: {name} is better {better}, so a regression is a "
                          f"{'rise' if worse == 'up' else 'fall'}: write {name}:{'+' if worse == 'up' else '-'}{pct:g}%")
    return Rule(name, worse, pct / 100)


def _beyond(row: pd.Series, rule: Rule) -> bool:
    ratio, low, high = row[f"{rule.metric}_ratio"], row[f"{rule.metric}_low"], row[f"{rule.metric}_high"]
    if pd.isna(ratio):
        return False
    if rule.worse == "up":
        return (low if pd.notna(low) else ratio) > 1 + rule.threshold
    return (high if pd.notna(high) else ratio) < 1 - rule.threshold


def _status_broke(row: pd.Series) -> bool:
    before = set(str(row["status_base"] or "").split(","))
    after = set(str(row["status_other"] or "").split(",")) - {""}
    return "ok" in before and bool(after - EXPECTED_STATUSES)


def regressions(frame: pd.DataFrame, rules: list[Rule]) -> pd.DataFrame:
    """The cells that fail the rules, one row per (cell, rule), with why."""
    rows = []
    if frame.empty or not rules:
        return pd.DataFrame(columns=["other", "kind", "cell", "rule", "why"])
    for _, row in frame.iterrows():
        if _status_broke(row):
            rows.append({"other": row["other"], "kind": row["kind"], "cell": row["cell"], "rule": "status",
                         "why": f"ok on the baseline, {row['status_other']} on {row['other']}"})
        for rule in rules:
            if f"{rule.metric}_ratio" in row and _beyond(row, rule):
                rows.append({"other": row["other"], "kind": row["kind"], "cell": row["cell"], "rule": str(rule),
                             "why": why(row, rule)})
    return pd.DataFrame(rows, columns=["other", "kind", "cell", "rule", "why"])


def why(row: pd.Series, rule: Rule) -> str:
    m = rule.metric
    base, other, ratio = row[f"{m}_base"], row[f"{m}_other"], row[f"{m}_ratio"]
    if pd.notna(row[f"{m}_low"]):
        noise = f"interval {row[f'{m}_low']:.3f}-{row[f'{m}_high']:.3f} ({row[f'{m}_from']})"
    else:
        noise = "no interval: one value per side"
    return f"{m} {base:.4g} -> {other:.4g}, ratio {ratio:.3f}, {noise}; limit {str(rule)}"


def unchecked(frame: pd.DataFrame, rules: list[Rule]) -> list[str]:
    """Rules no cell could be judged by (no cell has the metric on both sides)."""
    out = []
    for rule in rules:
        column = f"{rule.metric}_ratio"
        if frame.empty or column not in frame or frame[column].isna().all():
            out.append(str(rule))
    return out
