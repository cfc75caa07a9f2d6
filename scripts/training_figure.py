"""Snakemake entry point of rule `training_figure`: one figure of the suite's training tables."""
from flashwatt.figure_base import write_rule_figure
from flashwatt.training.figures import TRAINING_FIGURES

write_rule_figure(TRAINING_FIGURES, globals()["snakemake"])  # `snakemake`: injected by the script directive
