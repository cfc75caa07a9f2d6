"""Snakemake entry point of rule `train_cell`: submit the run, wait, write its record once."""
from flashwatt.cell_job import submit_and_record
from flashwatt.training.cell import TrainCell
from flashwatt.training.job import base_record, run_train_cell

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
w = snakemake.wildcards
cell = TrainCell.from_wildcards(w.suite, w.tmodel, w.tbackend, w.tprecision, w.tname)
submit_and_record(cell, run_train_cell, snakemake.params.spec, base_record, snakemake)
