"""Snakemake entry point of rule `model_figure`: draw one figure from the suite's model table."""
from flashwatt.models.figures import draw

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
draw(snakemake.wildcards.model_figure, snakemake.input.table, snakemake.output[0])
