"""Snakemake entry point of every kind's `cell` rule: submit the cell, wait, write its record once."""
import sys

from flashwatt.cell_job import submit_and_record
from flashwatt.kinds import kind_named

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
kind = kind_named(snakemake.params.kind)
cell = kind.cell.from_wildcards(**{k: v for k, v in snakemake.wildcards.items()})
try:
    submit_and_record(kind, cell, snakemake.params.spec, snakemake)
except KeyboardInterrupt:
    # Interrupted (Ctrl-C): the job is cancelled already (flashwatt.submit.cancel) and the
    # cell's log says so; a traceback would say nothing more.
    sys.exit(128 + 2)
