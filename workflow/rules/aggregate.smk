# Every cell record of a suite into one tidy table (one row per cell, every outcome).


rule aggregate:
    input:
        records=lambda wc: [cell.path for cell in cells_of(wc.suite)],
        traces=lambda wc: [cell.trace_path for cell in cells_of(wc.suite)],
    output:
        parquet="results/{suite}/summary.parquet",
        csv=report(
            "results/{suite}/summary.csv",
            caption="../report/summary.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "summary"},
        ),
        flagged=report(
            "results/{suite}/flagged.csv",
            caption="../report/flagged.rst",
            category="Tables",
            labels={"suite": "{suite}", "table": "flagged"},
        ),
    log:
        "results/logs/{suite}/aggregate.log",
    params:
        suite_records=lambda wc: recorded_cells_of(wc.suite),
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/aggregate.py"
