# The training study (flashwatt.training): the suite's data prepared once, one job per
# training run, then the suite's run and setting tables and figures.
from flashwatt.training.cell import LOG_PATTERN as TRAIN_LOG_PATTERN
from flashwatt.training.cell import RECORD_PATTERN as TRAIN_RECORD_PATTERN
from flashwatt.training.cell import TRACE_PATTERN as TRAIN_TRACE_PATTERN
from flashwatt.training.cell import WILDCARD_CONSTRAINTS as TRAIN_WILDCARDS
from flashwatt.training.suite import DATA_MANIFEST


# Reads the corpus, trains or loads the tokenizer and tokenises both splits (cached by
# corpus and tokenizer): CPU work, done where Snakemake runs, once per suite.
rule training_data:
    output:
        DATA_MANIFEST,
    log:
        "results/logs/{suite}/training_data.log",
    params:
        section=lambda wc: training_section_of(wc.suite),
    localrule: True
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/training_data.py"


rule train_cell:
    input:
        data=DATA_MANIFEST,
    output:
        record=TRAIN_RECORD_PATTERN,
        trace=TRAIN_TRACE_PATTERN,
    log:
        TRAIN_LOG_PATTERN,
    params:
        spec=lambda wc: train_spec_of(train_cell_of(wc)),
        submitit_folder="results/logs/submitit",
    wildcard_constraints:
        **TRAIN_WILDCARDS,
    resources:
        gpus=1,
        runtime=60,
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/run_train_cell.py"


rule training_aggregate:
    input:
        records=lambda wc: [cell.path for cell in train_cells_of(wc.suite)],
    output:
        runs="results/{suite}/training.parquet",
        curves="results/{suite}/training_curves.parquet",
        csv=report(
            "results/{suite}/training.csv",
            caption="../report/training_table.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "training runs"},
        ),
        settings=report(
            "results/{suite}/training_settings.csv",
            caption="../report/training_settings.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "training settings"},
        ),
    log:
        "results/logs/{suite}/training_aggregate.log",
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/training_aggregate.py"


rule training_figure:
    input:
        runs="results/{suite}/training.parquet",
        curves="results/{suite}/training_curves.parquet",
    output:
        report(
            "figures/{suite}/{training_figure}.pdf",
            caption="../report/training_figure.rst",
            category="Figures",
            labels={"suite": "{suite}", "figure": "{training_figure}"},
        ),
    log:
        "results/logs/{suite}/figure-{training_figure}.log",
    params:
        caption=lambda wc: TRAINING_FIGURES[wc.training_figure].caption,
    wildcard_constraints:
        training_figure="|".join(TRAINING_FIGURES),
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/training_figure.py"
