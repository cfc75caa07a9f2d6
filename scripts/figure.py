"""Snakemake entry point of rule `figure`: one figure of the attention suite, from its summary."""
from flashwatt.attention.figures import FIGURES
from flashwatt.figure_base import write_rule_figure

write_rule_figure(FIGURES, globals()["snakemake"])  # `snakemake`: injected by the script directive
