"""Snakemake entry point of rule `model_figure`: one figure of the suite's model table."""
from flashwatt.figure_base import write_rule_figure
from flashwatt.models.figures import MODEL_FIGURES

write_rule_figure(MODEL_FIGURES, globals()["snakemake"])  # `snakemake`: injected by the script directive
