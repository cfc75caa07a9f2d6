"""Snakemake entry point of every kind's `aggregate` rule: the suite's records -> the kind's tables."""
from pathlib import Path

from flashwatt.kind import resolve
from flashwatt.kinds import kind_named

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
kind = kind_named(snakemake.params.kind)
# This run's records (inputs) and every other record of the suite already on disk.
records = list(dict.fromkeys([*snakemake.input.records, *(p for p in snakemake.params.suite_records if Path(p).exists())]))
counts = resolve(kind.write_tables)(records, dict(snakemake.output.items()))
with open(snakemake.log[0], "w") as log:
    log.write(counts + "\n")
