"""Snakemake entry point of rule `training_aggregate`: training records -> the suite's run,
setting and curve tables."""
from flashwatt.records import atomic_write
from flashwatt.training.summary import run_table, setting_table

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
runs, curves = run_table(list(snakemake.input.records))
settings = setting_table(runs)
atomic_write(snakemake.output.runs, lambda tmp: runs.to_parquet(tmp, index=False))
atomic_write(snakemake.output.curves, lambda tmp: curves.to_parquet(tmp, index=False))
atomic_write(snakemake.output.csv, lambda tmp: runs.to_csv(tmp, index=False, float_format="%.6g"))
atomic_write(snakemake.output.settings, lambda tmp: settings.to_csv(tmp, index=False, float_format="%.6g"))
with open(snakemake.log[0], "w") as log:
    log.write(runs["status"].value_counts().to_string() + "\n" if len(runs) else "no training cells\n")
