"""Snakemake entry point of rule `control_figure`: draw one control figure from the suite's control tables."""
from flashwatt.control.figures import draw

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
draw(snakemake.wildcards.control_figure, snakemake.input.runs, snakemake.input.oracle, snakemake.input.traces,
     snakemake.output[0])
