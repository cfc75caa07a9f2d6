"""The control kind: one run of the power-aware scheduler per cell, judged against the
oracle of static configurations in the same suite (flashwatt.kind says what a kind is)."""
from __future__ import annotations

from flashwatt.control import cell as control
from flashwatt.control.figures import CONTROL_FIGURES
from flashwatt.control.suite import control_runs
from flashwatt.kind import Kind, TableFile


def fill_schema(section: dict) -> None:
    run = section["properties"]["runs"]["items"]["properties"]
    for key, names in (("mode", [m for m in control.CONTROL_MODES if m != "oracle"]), ("workload", control.WORKLOADS),
                       ("precision", control.CONTROL_PRECISIONS), ("disturbance", control.DISTURBANCES)):
        run[key] = {"enum": list(names)}



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
    ),
    write_tables="flashwatt.control.summary:write_tables",
    figures=CONTROL_FIGURES,
    schema="schema.yaml",
    fill_schema=fill_schema,
    report="report.rst",
    rule_prefix="control_",
    figure_caption="control_figure.rst",
)
