# One job per cell. The rule hands the cell to a submitit executor (local subprocess,
# Slurm job, or in-process) and waits; the record is written once, atomically
# (flashwatt.cell_job, which also says why the executor is not a param).
from flashwatt.attention.cell import LOG_PATTERN, RECORD_PATTERN, TRACE_PATTERN


rule cell:
    output:
        record=RECORD_PATTERN,
        trace=TRACE_PATTERN,
    log:
        LOG_PATTERN,
    params:
        settings=lambda wc: measure_settings(config, wc.suite),
        submitit_folder="results/logs/submitit",
    resources:
        gpus=1,
        runtime=30,
    conda:
        "../../envs/flashwatt.yaml"
    script:
        "../../scripts/run_cell.py"
