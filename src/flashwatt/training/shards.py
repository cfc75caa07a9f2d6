"""Token shards on disk, and the batches a training run reads from them.

Each split is tokenised once per (corpus fingerprint, tokenizer fingerprint) into one
NumPy file of token ids, documents joined by the tokenizer's `<|endoftext|>`:
`<cache>/tokens/<corpus>-<tokenizer>/{train,validation}.npy`, uint16 when every id fits
(vocabularies up to 65,536, GPT-2's included), else uint32. The files are loaded
memory-mapped, so jobs on one node share the page cache and a run never holds its corpus
in its own memory. Writing is guarded like the CUDA build (flashwatt.build): a file lock
so that two jobs of a cluster do not both tokenise, and each file written to a temporary
name and renamed into place, `meta.json` last, so a half-written shard is never read.

Training batches are random windows: `BatchSampler.batch(step)` draws its offsets from a
torch.Generator seeded by (seed, step) alone, so a run resumed at step s reads exactly
the batches an unbroken run reads at s, with no sampler state to checkpoint. The
validation set is fixed: the first N consecutive windows of the validation split.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from filelock import FileLock

from flashwatt.config_error import ConfigError
from flashwatt.records import atomic_write
from flashwatt.training.corpus import SPLITS, Corpus
from flashwatt.training.tokenizer import TextTokenizer

_LOCK_TIMEOUT_S = 3 * 3600.0  # tokenising WikiText-103 takes minutes; never hours
_DOCUMENTS_PER_BATCH = 1024  # documents handed to the tokenizer at once (its threads share them)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned integer that holds every id of the vocabulary."""
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32:
        return np.dtype(np.uint32)
    raise ValueError(f"a vocabulary of {vocab_size} ids does not fit uint32 token files")


@dataclass(frozen=True)
class TokenShards:
    """The token ids of each split, memory-mapped, and where they live."""

    directory: Path
    splits: dict[str, np.ndarray]  # read-only memory maps
    meta: dict

    def tokens(self, split: str) -> np.ndarray:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(self.splits)}")
        return self.splits[split]


def tokenize_documents(documents: Iterator[str], tokenizer: TextTokenizer, dtype: np.dtype) -> tuple[np.ndarray, int]:
    """One split as a single array of ids, each document followed by the separator; and
    the number of documents."""
    pieces: list[np.ndarray] = []
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    count = 0
    batch: list[str] = []

    def flush():
        for ids in tokenizer.encode_documents(batch):
            pieces.append(np.asarray(ids, dtype=dtype))
            pieces.append(eos)
        batch.clear()

    for document in documents:
        batch.append(document)
        count += 1
        if len(batch) == _DOCUMENTS_PER_BATCH:
            flush()
    flush()
    return (np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)), count


def _save_array(array: np.ndarray):
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save would append .npy to a path
            np.save(f, array)
    return write


def prepare_shards(corpus: Corpus, tokenizer: TextTokenizer, cache_dir: str | Path) -> TokenShards:
    """The corpus's token shards under `cache_dir`, tokenised now if no job has yet."""
    directory = Path(cache_dir) / "tokens" / f"{corpus.fingerprint[:20]}-{tokenizer.fingerprint[:20]}"
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        with FileLock(str(directory) + ".lock", timeout=_LOCK_TIMEOUT_S):
            if not meta_path.is_file():  # another job may have written them while this one waited
                dtype = token_dtype(tokenizer.vocab_size)
                meta = {"corpus": corpus.summary(), "tokenizer": tokenizer.summary(), "dtype": dtype.name,
                        "tokens": {}, "documents": {}}
                for split in SPLITS:
                    ids, documents = tokenize_documents(corpus.documents(split), tokenizer, dtype)
                    atomic_write(directory / f"{split}.npy", _save_array(ids))
                    meta["tokens"][split], meta["documents"][split] = int(ids.size), documents
                text = json.dumps(meta, indent=1)
                atomic_write(meta_path, lambda tmp: Path(tmp).write_text(text + "\n"))
    return open_shards(directory)


def open_shards(directory: str | Path) -> TokenShards:
    """Shards prepare_shards wrote, memory-mapped (a training job opens the suite's shards
    without reading the corpus)."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{directory} holds no finished token shards (no meta.json)")
    meta = json.loads(meta_path.read_text())
    splits = {split: np.load(directory / f"{split}.npy", mmap_mode="r") for split in SPLITS}
    return TokenShards(directory, splits, meta)


def steps_for_budget(token_budget: int, *, batch: int, context: int, key: str) -> int:
    """Optimizer steps that a budget of training tokens buys, at batch x context tokens a
    step (whole steps: the remainder is not trained on). `key` names the budget."""
    per_step = batch * context
    if token_budget < per_step:
        raise ConfigError(f"config key {key}: a budget of {token_budget} tokens is less than one step "
                          f"(batch {batch} x context {context} = {per_step} tokens)")
    return token_budget // per_step


def _check_split(tokens: np.ndarray, context: int, split: str, key: str) -> None:
    if context < 1:
        raise ConfigError(f"config key {key}: context {context} must be at least 1")
    if len(tokens) < context + 1:
        raise ConfigError(f"config key {key}: the {split} split has {len(tokens)} tokens, fewer than context + 1 "
                          f"= {context + 1} (a window and its next-token target); use a shorter context or more text")


def _windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.asarray(tokens[starts[:, None] + np.arange(context + 1)], dtype=np.int64)
    window = torch.from_numpy(rows)
    return window[:, :-1], window[:, 1:]


def step_seed(seed: int, step: int) -> int:
    """The generator seed of one step: (seed, step) mixed by NumPy's SeedSequence, so
    neighbouring steps and seeds get unrelated streams."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1, dtype=np.uint64)[0])


class BatchSampler:
    """Random training windows of one split: batch(step) -> (inputs, targets), each int64
    of shape (batch, context); targets are the inputs shifted by one token."""

    def __init__(self, tokens: np.ndarray, *, batch: int, context: int, seed: int, key: str,
                 split: str = "train"):
        _check_split(tokens, context, split, key)
        if batch < 1:
            raise ConfigError(f"config key {key}: batch {batch} must be at least 1")
        self.tokens, self.batch_size, self.context, self.seed = tokens, batch, context, seed

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(step_seed(self.seed, step))
        # Any window of context + 1 tokens: starts 0 .. len - context - 1.
        starts = torch.randint(0, len(self.tokens) - self.context, (self.batch_size,), generator=generator)
        return _windows(self.tokens, starts.numpy(), self.context)

    def batches(self, start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """batch(start_step), batch(start_step + 1), ...: a resumed run passes its next step."""
        step = start_step
        while True:
            yield self.batch(step)
            step += 1


def validation_windows(tokens: np.ndarray, *, context: int, count: int | None, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed validation set: the first `count` consecutive windows of the validation
    tokens (window i covers tokens i*context .. (i+1)*context, its targets one further),
    every window when `count` is None. Inputs and targets, int64, (count, context)."""
    _check_split(tokens, context, "validation", key)
    fit = (len(tokens) - 1) // context
    if count is None:
        count = fit
    elif count < 1 or count > fit:
        raise ConfigError(f"config key {key}: {count} validation windows asked; the validation split "
                          f"({len(tokens)} tokens) holds {fit} windows of context {context}")
    return _windows(tokens, np.arange(count) * context, context)
