"""Snakemake entry point of rule `figure`: draw one figure from the summary."""
from flashwatt.attention.figures import draw

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
draw(snakemake.wildcards.figure, snakemake.input.summary, snakemake.output[0], snakemake.params.options)
