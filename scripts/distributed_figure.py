"""Snakemake entry point of rule `distributed_figure`: draw one figure from the suite's distributed table."""
from flashwatt.distributed.figures import draw

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
draw(snakemake.wildcards.distributed_figure, snakemake.input.table, snakemake.output[0])
