"""Snakemake entry point of rule `distributed_cell`: submit the cell (one task per GPU), wait, write its record once."""
from flashwatt.cell_job import submit_and_record
from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.cell_run import base_record, run_distributed_cell

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
w = snakemake.wildcards
cell = DistributedCell.from_wildcards(w.suite, w.method, w.dprecision, w.dname)
submit_and_record(cell, run_distributed_cell, snakemake.params.spec, base_record, snakemake)
