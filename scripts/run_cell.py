"""Snakemake entry point of rule `cell`: submit the cell, wait, write its record once."""
from flashwatt.cell import Cell
from flashwatt.records import write_record, write_trace
from flashwatt.runner import CellOutcome, failed_job_record, run_cell
from flashwatt.submit.jobs import JobFailed, run_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
cell = Cell.from_wildcards(**dict(snakemake.wildcards.items()))
settings = snakemake.params.settings
log = snakemake.log[0]
try:
    outcome = run_job(
        run_cell, cell, settings,
        job_name=cell.job_name,
        folder=snakemake.params.submitit_folder,
        executor=snakemake.config["executor"],
        resources=dict(snakemake.resources.items()),
        log_path=log,
    )
except JobFailed as failure:
    # The job died before returning (killed, out of host memory, node failure): the
    # failure is this cell's outcome, recorded so that the rest of the run goes on.
    outcome = CellOutcome(failed_job_record(cell, settings, str(failure), failure.job_id))
write_trace(snakemake.output.trace, outcome.trace)
write_record(snakemake.output.record, outcome.record)
with open(log, "a") as stream:
    record = outcome.record
    stream.write(f"[flashwatt] {cell.id}: {record['status']}" + (f" ({record['reason']})" if record.get("reason") else "") + "\n")
    if record.get("traceback"):
        stream.write(record["traceback"])
