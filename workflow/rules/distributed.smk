# Sequence-parallel attention over several GPUs (flashwatt.distributed): one job per cell,
# with one task per GPU (submitit starts them; the ranks meet through torch.distributed),
# then the suite's distributed table and figures.
from flashwatt.distributed.cell import LOG_PATTERN as DISTRIBUTED_LOG_PATTERN
from flashwatt.distributed.cell import RECORD_PATTERN as DISTRIBUTED_RECORD_PATTERN
from flashwatt.distributed.cell import TRACE_PATTERN as DISTRIBUTED_TRACE_PATTERN
from flashwatt.distributed.cell import WILDCARD_CONSTRAINTS as DISTRIBUTED_WILDCARDS


rule distributed_cell:
    output:
        record=DISTRIBUTED_RECORD_PATTERN,
        trace=DISTRIBUTED_TRACE_PATTERN,
    log:
        DISTRIBUTED_LOG_PATTERN,
    params:
        spec=lambda wc: distributed_spec(distributed_cell_of(wc)),
        submitit_folder="results/logs/submitit",
    wildcard_constraints:
        **DISTRIBUTED_WILDCARDS,
    resources:
        gpus=lambda wc: distributed_cell_of(wc).gpus,
        tasks=lambda wc: distributed_cell_of(wc).gpus,
        runtime=60,
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/run_distributed_cell.py"


rule distributed_aggregate:
    input:
        records=lambda wc: [cell.path for cell in distributed_cells_of(wc.suite)],
    output:
        parquet="results/{suite}/distributed.parquet",
        csv=report(
            "results/{suite}/distributed.csv",
            caption="../report/distributed_table.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "distributed"},
        ),
    log:
        "results/logs/{suite}/distributed_aggregate.log",
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/distributed_aggregate.py"


rule distributed_figure:
    input:
        table="results/{suite}/distributed.parquet",
    output:
        report(
            "figures/{suite}/{distributed_figure}.pdf",
            caption="../report/distributed_figure.rst",
            category="Figures",
            labels={"suite": "{suite}", "figure": "{distributed_figure}"},
        ),
    log:
        "results/logs/{suite}/figure-{distributed_figure}.log",
    params:
        caption=lambda wc: DISTRIBUTED_FIGURES[wc.distributed_figure].caption,
    wildcard_constraints:
        distributed_figure="|".join(DISTRIBUTED_FIGURES),
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/distributed_figure.py"
