"""The control kind: one run of the power-aware scheduler per cell, judged against the
oracle of static configurations in the same suite (flashwatt.kind says what a kind is)."""
from __future__ import annotations

from flashwatt.control import cell as control
from flashwatt.control.figures import CONTROL_FIGURES
from flashwatt.control.suite import control_runs
from flashwatt.kind import CompareMetric, Kind, TableFile


def fill_schema(section: dict) -> None:
    run = section["properties"]["runs"]["items"]["properties"]
    modes = [m for m in control.CONTROL_MODES if m not in ("oracle", "random")]
    for key, names in (("mode", modes), ("workload", control.WORKLOADS),
                       ("precision", control.CONTROL_PRECISIONS), ("disturbance", control.DISTURBANCES)):
        run[key] = {"enum": list(names)}
    generated = section["properties"]["random"]["properties"]
    generated["workloads"]["items"] = {"enum": list(control.WORKLOADS)}
    generated["precision"] = {"enum": list(control.CONTROL_PRECISIONS)}


def report_values(suite: str) -> dict:
    """The pooled figures in words (results/<suite>/control_pooled.parquet), for the report."""
    from pathlib import Path

    path = Path(f"results/{suite}/control_pooled.parquet")
    if not path.exists():
        return {"pooled": "The pooled figures are in control_pooled.csv once the suite's tables are made."}
    import pandas as pd

    from flashwatt.control.pooled import report_sentences

    return {"pooled": report_sentences(pd.read_parquet(path))}


KIND = Kind(
    name="control",
    section="control",
    cell=control.ControlCell,
    plan=control_runs,
    job="flashwatt.control.job:run_control_cell",
    tables=(
        TableFile("runs", "control.parquet"),
        TableFile("oracle", "control_oracle.parquet"),
        TableFile("traces", "control_traces.parquet"),
        TableFile("csv", "control.csv", "control_table.rst", "control runs",
                  about="controlled runs against their oracle"),
        TableFile("oracle_csv", "control_oracle.csv", "control_oracle.rst", "control oracle"),
        TableFile("pooled", "control_pooled.parquet"),
        TableFile("pooled_csv", "control_pooled.csv", about="controlled runs pooled, against the scheduler's targets"),
    ),
    write_tables="flashwatt.control.summary:write_tables",
    figures=CONTROL_FIGURES,
    schema="schema.yaml",
    fill_schema=fill_schema,
    report="report.rst",
    report_values="flashwatt.control.kind:report_values",
    rule_prefix="control_",
    figure_caption="control_figure.rst",
    compare_metrics=(
        CompareMetric("throughput", "tokens_per_s", "higher", "tokens per second"),
        CompareMetric("energy", "j_per_token", "lower", "energy per token (J)"),
        CompareMetric("power", "avg_power_w", "lower", "average power (W)", heat_map=False),
    ),
    refusal_without_cuda=lambda cell: control.NO_CUDA_REASON,
)
