# Three rules per kind of cell (flashwatt.kinds), written once for all of them:
#   <prefix>cell       one job per cell: the cell handed to a submitit executor (local
#                      subprocess, Slurm job, or in-process), its record written once
#                      (flashwatt.cell_job, which also says why the executor is not a param)
#   <prefix>aggregate  every record of the suite into the kind's tables
#   <prefix>figures    the kind's figures of the suite in one job (one Python process
#                      importing pyplot and seaborn, not one per figure), each file
#                      registered in the report with its own caption
# Attention's prefix is empty (rules cell, aggregate, figure), so `--set-resources cell:...`
# and `--forcerun aggregate` read as they always did.
import os
from pathlib import Path


def report_file(name):
    """A caption file: workflow/report/<name>, or a kind's own file given by its absolute path."""
    return name if os.path.isabs(name) else f"../report/{name}"


def figure_caption(kind, name):
    """The caption file of one figure in the report: its kind's caption template, whose
    `{{ caption }}` is that figure's own text (FigureSpec.caption, the job's params.captions).
    Snakemake renders a caption with the job's parameters only, and one job writes all of a
    kind's figures, so each figure gets a file naming its caption, written here from the
    template (under .snakemake/, like Snakemake's own state)."""
    template = kind.figure_caption if os.path.isabs(kind.figure_caption) else os.path.join(
        workflow.basedir, "workflow", "report", kind.figure_caption)
    with open(template) as source:
        text = source.read()
    folder = os.path.abspath(os.path.join(".snakemake", "flashwatt", "captions", kind.name))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.rst")
    body = f"{{% set caption = snakemake.params.captions[{name!r}] %}}\n{text}"
    if not os.path.exists(path) or Path(path).read_text() != body:
        Path(path).write_text(body)
    return path


for kind in all_kinds():

    rule:
        name:
            f"{kind.rule_prefix}cell"
        input:
            **kind.cell_inputs,
        output:
            record=kind.cell.RECORD_PATTERN,
            trace=kind.cell.TRACE_PATTERN,
        log:
            kind.cell.LOG_PATTERN,
        params:
            kind=kind.name,
            spec=lambda wc, kind=kind: spec_of(kind, wc),
            submitit_folder="results/logs/submitit",
        wildcard_constraints:
            **kind.cell.WILDCARD_CONSTRAINTS,
        resources:
            gpus=lambda wc, kind=kind: kind.resources(cell_of(kind, wc))["gpus"],
            tasks=lambda wc, kind=kind: kind.resources(cell_of(kind, wc)).get("tasks", 1),
            nodes=lambda wc, kind=kind: kind.resources(cell_of(kind, wc)).get("nodes", 1),
            runtime=lambda wc, kind=kind: kind.resources(cell_of(kind, wc))["runtime"],
        conda:
            "../../envs/flashwatt.yaml"
        script:
            "../../scripts/run_cell.py"

    rule:
        name:
            f"{kind.rule_prefix}aggregate"
        input:
            records=lambda wc, kind=kind: [cell.path for cell in planned(wc.suite, kind)],
        output:
            **{
                table.key: (
                    report(
                        f"results/{{suite}}/{table.name}",
                        caption=report_file(table.caption),
                        category="Tables",
                        labels={"suite": "{suite}", "table": table.label},
                    )
                    if table.caption
                    else f"results/{{suite}}/{table.name}"
                )
                for table in kind.tables
            },
        log:
            f"results/logs/{{suite}}/{kind.rule_prefix}aggregate.log",
        params:
            kind=kind.name,
            # Every record of the suite on disk, filter or not: a filtered run adds to
            # the suite's tables, figures and report instead of replacing them with the slice.
            suite_records=lambda wc, kind=kind: [cell.path for cell in planned(wc.suite, kind, filtered=False)],
        localrule: True
        conda:
            "../../envs/plot.yaml"
        script:
            "../../scripts/aggregate.py"

    if kind.figures:

        rule:
            name:
                f"{kind.rule_prefix}figures"
            input:
                **kind.figure_tables("{suite}"),
            output:
                **{
                    name: report(
                        f"figures/{{suite}}/{name}.{spec.ext}",
                        caption=figure_caption(kind, name),
                        category="Figures",
                        labels={"suite": "{suite}", "figure": name},
                    )
                    for name, spec in kind.figures.items()
                },
            log:
                f"results/logs/{{suite}}/{kind.rule_prefix}figures.log",
            params:
                kind=kind.name,
                captions={name: spec.caption for name, spec in kind.figures.items()},
                options={"trace_filter": config.get("trace_filter", "")},
            localrule: True
            conda:
                "../../envs/plot.yaml"
            script:
                "../../scripts/figure.py"
