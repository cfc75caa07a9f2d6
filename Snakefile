# flashwatt: attention kernels measured for speed, correctness and energy.
# One job per cell (results/cells/...), each kind's tables, figures and a report.
# `snakemake` runs the configured suite locally; `snakemake --profile slurm` on a cluster.
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/kinds.smk"
include: "workflow/rules/skipped_here.smk"
include: "workflow/rules/run_outcome.smk"


# The rules a kind needs besides its cells, tables and figures (the training data, say).
for kind in all_kinds():
    if kind.rules:

        include: str(Path("workflow/rules") / kind.rules)


rule all:
    input:
        default_target,
    default_target: True
