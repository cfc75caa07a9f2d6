"""Snakemake entry point of every kind's `cell` rule: submit the cell, wait, write its record once."""
from flashwatt.cell_job import submit_and_record
from flashwatt.kinds import kind_named

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
kind = kind_named(snakemake.params.kind)
cell = kind.cell.from_wildcards(**{k: v for k, v in snakemake.wildcards.items()})
submit_and_record(kind, cell, snakemake.params.spec, snakemake)
