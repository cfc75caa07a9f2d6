"""A training suite's data, prepared once before its runs: the corpus read, its tokenizer
trained (or GPT-2's loaded), both splits tokenised into shards (flashwatt.training.shards),
and a manifest written that the runs open instead of the corpus:

    results/<suite>/training-data.json   {"shards": <folder>, "corpus": ..., "tokenizer": ..., "tokens": ...}

So a hundred runs read the corpus zero times, and a corpus or tokenizer that cannot be
used fails here, once, naming its config key, before any GPU job starts.
"""
from __future__ import annotations

import json
from pathlib import Path

from flashwatt.records import atomic_write


def prepare_data(section: dict, suite: str, manifest_path: str | Path) -> dict:
    from flashwatt.training.corpus import load_corpus
    from flashwatt.training.shards import prepare_shards
    from flashwatt.training.tokenizer import DEFAULT_VOCAB_SIZE, load_tokenizer

    where = f"suites.{suite}.training.data"
    data = section["data"]
    corpus = load_corpus(data["corpus"], key=f"{where}.corpus",
                         validation_fraction=data.get("validation_fraction"), seed=int(data.get("seed", 0)))
    tokenizer_cfg = data.get("tokenizer", {})
    tokenizer = load_tokenizer(corpus, cache_dir=section["cache"], key=f"{where}.tokenizer",
                               gpt2_dir=tokenizer_cfg.get("gpt2_dir"),
                               vocab_size=int(tokenizer_cfg.get("vocab_size", DEFAULT_VOCAB_SIZE)))
    shards = prepare_shards(corpus, tokenizer, section["cache"])
    manifest = {"shards": str(shards.directory), **shards.meta}
    text = json.dumps(manifest, indent=1)
    atomic_write(manifest_path, lambda tmp: Path(tmp).write_text(text + "\n"))
    return manifest
