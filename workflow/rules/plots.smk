# One figure per job, each registered in the report with its caption.


rule figure:
    input:
        summary="results/{suite}/summary.parquet",
    output:
        report(
            "figures/{suite}/{figure}.{ext}",
            caption="../report/figure.rst",
            category="Figures",
            labels={"suite": "{suite}", "figure": "{figure}"},
        ),
    log:
        "results/logs/{suite}/figure-{figure}-{ext}.log",
    params:
        caption=lambda wc: FIGURES[wc.figure].caption,
        options={"trace_filter": config.get("trace_filter", "")},
    wildcard_constraints:
        ext="png|pdf",
    localrule: True
    conda:
        "../../envs/plot.yaml"
    script:
        "../../scripts/figure.py"
