# The cells this host cannot run (flashwatt.host_skips: cells needing CUDA where none is
# visible, cells asking for more GPUs than the host shows), where the cells run on this
# host: recorded `skipped` in one job, each with the reason its own job would give, instead
# of a job per cell that starts only to skip. Never under the Slurm executor, whose cells
# run on GPU nodes. Only cells without a record, or with a failed one being retried: a
# record already there (measured on another machine, say) is never replaced by a skip.
import os

SKIPPED_HERE = {cell: refused for cell, refused in REFUSED_HERE.items()
                if cell in RETRIES or not os.path.exists(cell.path)}

if SKIPPED_HERE:

    rule skipped_here:
        output:
            [path for cell in SKIPPED_HERE for path in (cell.path, cell.trace_path)],
        log:
            f"results/logs/{SUITE}/skipped_here.log",
        params:
            skips=[(kind.name, cell.path, spec, reason) for cell, (kind, spec, reason) in SKIPPED_HERE.items()],
        localrule: True
        conda:
            "../../envs/flashwatt.yaml"
        script:
            "../../scripts/record_skips.py"

    # These records are this rule's, not the cell rules' (which match every record's path).
    for kind in all_kinds():
        workflow.ruleorder("skipped_here", f"{kind.rule_prefix}cell")
