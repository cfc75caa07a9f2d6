"""Snakemake entry point of every kind's `figures` rule: the kind's figures of a suite, drawn
from its tables in one process."""
from flashwatt.figure_base import write_rule_figures
from flashwatt.kinds import kind_named

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
write_rule_figures(kind_named(snakemake.params.kind).figures, snakemake)
