"""Snakemake entry point of every kind's `figure` rule: one figure, drawn from the kind's tables."""
from flashwatt.figure_base import write_rule_figure
from flashwatt.kinds import kind_named

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
write_rule_figure(kind_named(snakemake.params.kind).figures, snakemake)
