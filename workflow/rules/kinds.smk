# Three rules per kind of cell (flashwatt.kinds), written once for all of them:
#   <prefix>cell       one job per cell: the cell handed to a submitit executor (local
#                      subprocess, Slurm job, or in-process), its record written once
#                      (flashwatt.cell_job, which also says why the executor is not a param)
#   <prefix>aggregate  every record of the suite into the kind's tables
#   <prefix>figure     one figure per job, registered in the report with its caption
# Attention's prefix is empty (rules cell, aggregate, figure), so `--set-resources cell:...`
# and `--forcerun aggregate` read as they always did.
import os


def report_file(name):
    """A caption file: workflow/report/<name>, or a kind's own file given by its absolute path."""
    return name if os.path.isabs(name) else f"../report/{name}"


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
                f"{kind.rule_prefix}figure"
            input:
                **kind.figure_tables("{suite}"),
            output:
                report(
                    "figures/{suite}/{figure}.{ext}",
                    caption=report_file(kind.figure_caption),
                    category="Figures",
                    labels={"suite": "{suite}", "figure": "{figure}"},
                ),
            log:
                "results/logs/{suite}/figure-{figure}-{ext}.log",
            params:
                kind=kind.name,
                caption=lambda wc, kind=kind: kind.figures[wc.figure].caption,
                options={"trace_filter": config.get("trace_filter", "")},
            wildcard_constraints:
                figure="|".join(kind.figures),
                ext="|".join(sorted({f.ext for f in kind.figures.values()})),
            localrule: True
            conda:
                "../../envs/plot.yaml"
            script:
                "../../scripts/figure.py"
