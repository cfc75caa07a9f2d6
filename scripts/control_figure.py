"""Snakemake entry point of rule `control_figure`: one figure of the suite's control tables."""
from flashwatt.control.figures import CONTROL_FIGURES
from flashwatt.figure_base import write_rule_figure

write_rule_figure(CONTROL_FIGURES, globals()["snakemake"])  # `snakemake`: injected by the script directive
