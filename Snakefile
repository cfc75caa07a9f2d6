# flashwatt: attention kernels measured for speed, correctness and energy.
# One job per cell (results/cells/...), an aggregate, figures and a report.
# `snakemake` runs the configured suite locally; `snakemake --profile slurm` on a cluster.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/plots.smk"
include: "workflow/rules/control.smk"
include: "workflow/rules/distributed.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/training.smk"


rule all:
    input:
        suite_outputs(SUITE),
    default_target: True
