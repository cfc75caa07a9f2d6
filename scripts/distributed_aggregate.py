"""Snakemake entry point of rule `distributed_aggregate`: distributed records -> the suite's distributed table."""
from flashwatt.distributed.summary import distributed_table
from flashwatt.records import atomic_write

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
table = distributed_table(list(snakemake.input.records))
atomic_write(snakemake.output.parquet, lambda tmp: table.to_parquet(tmp, index=False))
atomic_write(snakemake.output.csv, lambda tmp: table.to_csv(tmp, index=False, float_format="%.6g"))
with open(snakemake.log[0], "w") as log:
    log.write(table["status"].value_counts().to_string() + "\n" if len(table) else "no distributed cells\n")
