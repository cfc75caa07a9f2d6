"""Snakemake entry point of rule `control_cell`: submit the control run, wait, write its record once."""
from flashwatt.cell_job import submit_and_record
from flashwatt.control.cell import ControlCell
from flashwatt.control.job import base_record, run_control_cell

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
cell = ControlCell.from_wildcards(**dict(snakemake.wildcards.items()))
submit_and_record(cell, run_control_cell, snakemake.params.spec, base_record, snakemake)
