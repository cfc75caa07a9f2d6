# Model-level cells (flashwatt.models): one job per cell, a whole model's prefill or
# training step with one attention backend, on one GPU or several (one task per GPU:
# submitit starts them, the ranks meet through torch.distributed), then the suite's model
# table and figures.
from flashwatt.models.cell import LOG_PATTERN as MODEL_LOG_PATTERN
from flashwatt.models.cell import RECORD_PATTERN as MODEL_RECORD_PATTERN
from flashwatt.models.cell import TRACE_PATTERN as MODEL_TRACE_PATTERN
from flashwatt.models.cell import WILDCARD_CONSTRAINTS as MODEL_WILDCARDS


rule model_cell:
    output:
        record=MODEL_RECORD_PATTERN,
        trace=MODEL_TRACE_PATTERN,
    log:
        MODEL_LOG_PATTERN,
    params:
        spec=lambda wc: model_spec_of(model_cell_of(wc)),
        submitit_folder="results/logs/submitit",
    wildcard_constraints:
        **MODEL_WILDCARDS,
    resources:
        gpus=lambda wc: model_cell_of(wc).gpus,
        tasks=lambda wc: model_cell_of(wc).gpus,
        runtime=lambda wc: 30 if model_cell_of(wc).gpus == 1 else 60,
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/run_model_cell.py"


rule model_aggregate:
    input:
        records=lambda wc: [cell.path for cell in model_cells_of(wc.suite)],
    output:
        parquet="results/{suite}/models.parquet",
        csv=report(
            "results/{suite}/models.csv",
            caption="../report/models_table.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "models"},
        ),
    log:
        "results/logs/{suite}/models_aggregate.log",
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/models_aggregate.py"


rule model_figure:
    input:
        table="results/{suite}/models.parquet",
    output:
        report(
            "figures/{suite}/{model_figure}.pdf",
            caption="../report/models_figure.rst",
            category="Figures",
            labels={"suite": "{suite}", "figure": "{model_figure}"},
        ),
    log:
        "results/logs/{suite}/figure-{model_figure}.log",
    params:
        caption=lambda wc: MODEL_FIGURES[wc.model_figure].caption,
    wildcard_constraints:
        model_figure="|".join(MODEL_FIGURES),
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/models_figure.py"
