"""Snakemake entry point of rule `distributed_figure`: one figure of the suite's distributed table."""
from flashwatt.distributed.figures import DISTRIBUTED_FIGURES
from flashwatt.figure_base import write_rule_figure

write_rule_figure(DISTRIBUTED_FIGURES, globals()["snakemake"])  # `snakemake`: injected by the script directive
