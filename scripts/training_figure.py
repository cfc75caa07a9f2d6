"""Snakemake entry point of rule `training_figure`: draw one figure from the suite's training tables."""
from flashwatt.training.figures import draw

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
draw(snakemake.wildcards.training_figure, snakemake.input.runs, snakemake.input.curves, snakemake.output[0])
