"""Snakemake entry point of rule `model_cell`: submit the cell, wait, write its record once."""
from flashwatt.cell_job import submit_and_record
from flashwatt.models.cell import ModelCell
from flashwatt.models.job import base_record, run_model_cell

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
w = snakemake.wildcards
cell = ModelCell.from_wildcards(w.suite, w.mmodel, w.mbackend, w.mprecision, w.mname)
submit_and_record(cell, run_model_cell, snakemake.params.spec, base_record, snakemake)
