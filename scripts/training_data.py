"""Snakemake entry point of rule `training_data`: the suite's corpus, tokenizer and token shards."""
import json
import traceback

from flashwatt.training.data import prepare_data

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w") as log:
    try:
        manifest = prepare_data(snakemake.params.section, snakemake.wildcards.suite, snakemake.output[0])
    except Exception:
        log.write(traceback.format_exc())
        raise
    log.write(json.dumps(manifest, indent=1) + "\n")
