# The power-aware scheduler's runs (flashwatt.control): one job per control cell, then the
# suite's control tables and figures. A control cell's name says what it runs; its spec
# (lengths, the co-located load, the oracle's configurations) comes from the suite's
# `control` section and is recorded with it.
from flashwatt.control.cell import LOG_PATTERN as CONTROL_LOG_PATTERN
from flashwatt.control.cell import RECORD_PATTERN as CONTROL_RECORD_PATTERN
from flashwatt.control.cell import TRACE_PATTERN as CONTROL_TRACE_PATTERN
from flashwatt.control.cell import WILDCARD_CONSTRAINTS as CONTROL_WILDCARDS
from flashwatt.control.cell import ControlCell


rule control_cell:
    output:
        record=CONTROL_RECORD_PATTERN,
        trace=CONTROL_TRACE_PATTERN,
    log:
        CONTROL_LOG_PATTERN,
    params:
        spec=lambda wc: control_spec(ControlCell.from_wildcards(wc.suite, wc.group, wc.scenario)),
        submitit_folder="results/logs/submitit",
    wildcard_constraints:
        **CONTROL_WILDCARDS,
    resources:
        gpus=1,
        runtime=30,
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/run_control_cell.py"


rule control_aggregate:
    input:
        records=lambda wc: [cell.path for cell in control_cells_of(wc.suite)],
        traces=lambda wc: [cell.trace_path for cell in control_cells_of(wc.suite)],
    output:
        runs="results/{suite}/control.parquet",
        oracle="results/{suite}/control_oracle.parquet",
        traces="results/{suite}/control_traces.parquet",
        csv=report(
            "results/{suite}/control.csv",
            caption="../report/control_table.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "control runs"},
        ),
        oracle_csv=report(
            "results/{suite}/control_oracle.csv",
            caption="../report/control_oracle.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "control oracle"},
        ),
    log:
        "results/logs/{suite}/control_aggregate.log",
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/control_aggregate.py"


rule control_figure:
    input:
        runs="results/{suite}/control.parquet",
        oracle="results/{suite}/control_oracle.parquet",
        traces="results/{suite}/control_traces.parquet",
    output:
        report(
            "figures/{suite}/{control_figure}.pdf",
            caption="../report/control_figure.rst",
            category="Figures",
            labels={"suite": "{suite}", "figure": "{control_figure}"},
        ),
    log:
        "results/logs/{suite}/figure-{control_figure}.log",
    params:
        caption=lambda wc: CONTROL_FIGURES[wc.control_figure].caption,
    wildcard_constraints:
        control_figure="|".join(CONTROL_FIGURES),
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/control_figure.py"
