"""The training study's data and optimisation: corpus, tokenizer, token shards and
batches, optimizers and learning-rate schedules.

    corpus = load_corpus("/usr/share/doc/python3.11/html/_sources", key="suites.training.train.corpus")
    tokenizer = load_tokenizer(corpus, cache_dir="results/training-cache", key="suites.training.train.tokenizer")
    shards = prepare_shards(corpus, tokenizer, "results/training-cache")
    sampler = BatchSampler(shards.tokens("train"), batch=16, context=1024, seed=0, key="suites.training.train.context")
    inputs, targets = sampler.batch(step)
    optimizer = make_optimizer("adamw", model.parameters(), lr=3e-4, weight_decay=0.1)
    scheduler = make_schedule("cosine", optimizer, total_steps, warmup_steps)

docs/training_data.md has the choices and where to find a corpus offline.
"""
import importlib

__all__ = ["BatchSampler", "Corpus", "OPTIMIZERS", "SCHEDULES", "TextTokenizer", "TokenShards", "load_corpus",
           "load_tokenizer", "lr_multiplier", "make_optimizer", "make_schedule", "open_shards", "prepare_shards",
           "steps_for_budget", "validation_windows"]
# Loaded on first use: the workflow reads names (OPTIMIZERS, SCHEDULES) while it plans, where
# torch and tokenizers are not needed.
_PUBLIC = {"Corpus": "corpus", "load_corpus": "corpus", "TextTokenizer": "tokenizer", "load_tokenizer": "tokenizer",
           "BatchSampler": "shards", "TokenShards": "shards", "prepare_shards": "shards", "open_shards": "shards",
           "steps_for_budget": "shards", "validation_windows": "shards", "OPTIMIZERS": "optimizers",
           "make_optimizer": "optimizers", "SCHEDULES": "schedules", "lr_multiplier": "schedules",
           "make_schedule": "schedules"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"flashwatt.training.{_PUBLIC[name]}"), name)
    raise AttributeError(name)
