"""Snakemake entry point of every kind's `figure` rule: draw one figure from the kind's tables."""
from flashwatt.kind import resolve
from flashwatt.kinds import kind_named

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
kind = kind_named(snakemake.params.kind)
resolve(kind.draw)(snakemake.wildcards.figure, dict(snakemake.input.items()), snakemake.output[0], snakemake.params.options)
