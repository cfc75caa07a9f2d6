"""Snakemake entry point of rule `control_aggregate`: control records -> the suite's control tables."""
from flashwatt.control.summary import runs_table, traces_table
from flashwatt.records import atomic_write

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
records = list(snakemake.input.records)
runs, oracle = runs_table(records)
traces = traces_table(records)
out = snakemake.output
atomic_write(out.runs, lambda tmp: runs.to_parquet(tmp, index=False))
atomic_write(out.oracle, lambda tmp: oracle.to_parquet(tmp, index=False))
atomic_write(out.traces, lambda tmp: traces.to_parquet(tmp, index=False))
atomic_write(out.csv, lambda tmp: runs.to_csv(tmp, index=False, float_format="%.6g"))
atomic_write(out.oracle_csv, lambda tmp: oracle.to_csv(tmp, index=False, float_format="%.6g"))
with open(snakemake.log[0], "w") as log:
    log.write(runs["status"].value_counts().to_string() + "\n" if len(runs) else "no controlled runs\n")
