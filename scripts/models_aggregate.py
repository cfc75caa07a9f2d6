"""Snakemake entry point of rule `model_aggregate`: model records -> the suite's model table."""
from flashwatt.models.summary import model_table
from flashwatt.records import atomic_write

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
table = model_table(list(snakemake.input.records))
atomic_write(snakemake.output.parquet, lambda tmp: table.to_parquet(tmp, index=False))
atomic_write(snakemake.output.csv, lambda tmp: table.to_csv(tmp, index=False, float_format="%.6g"))
with open(snakemake.log[0], "w") as log:
    log.write(table["status"].value_counts().to_string() + "\n" if len(table) else "no model cells\n")
