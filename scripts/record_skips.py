"""Snakemake entry point of rule skipped_here: the records of the cells this host cannot run."""
from flashwatt.host_skips import write_skips

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
written = write_skips(snakemake.params.skips, snakemake.config["executor"])
with open(snakemake.log[0], "w") as log:
    for kind, path, _spec, reason in snakemake.params.skips:
        log.write(f"{path}: skipped ({reason})\n")
    log.write(f"[flashwatt] {written} cell(s) recorded as skipped without a job\n")
