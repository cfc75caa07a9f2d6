"""Snakemake entry point of rule `aggregate`: records -> summary.parquet/.csv + flagged.csv."""
from flashwatt.attention.summary import flagged, summarize, write_summary
from flashwatt.records import atomic_write

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
from pathlib import Path

# This run's records (inputs) and every other record of the suite already on disk.
records = list(dict.fromkeys([*snakemake.input.records, *(p for p in snakemake.params.suite_records if Path(p).exists())]))
frame = summarize(records)
write_summary(frame, snakemake.output.parquet, snakemake.output.csv)
atomic_write(snakemake.output.flagged, lambda tmp: flagged(frame).to_csv(tmp, index=False, float_format="%.6g"))
with open(snakemake.log[0], "w") as log:
    log.write(frame["status"].value_counts().to_string() + "\n")
