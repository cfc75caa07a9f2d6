"""Snakemake entry point of rule `cell`: submit the cell, wait, write its record once."""
from flashwatt.attention.cell import Cell
from flashwatt.cell_job import submit_and_record
from flashwatt.attention.job import base_record, run_cell

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
cell = Cell.from_wildcards(**dict(snakemake.wildcards.items()))
submit_and_record(cell, run_cell, snakemake.params.settings, base_record, snakemake)
