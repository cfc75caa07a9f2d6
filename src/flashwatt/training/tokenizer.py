"""Text to token ids: GPT-2's tokenizer from a local folder, or a byte-level BPE trained
on the corpus.

- `gpt2_dir` named: GPT-2's files in that folder, `tokenizer.json` or `vocab.json` with
  `merges.txt`, loaded with `tokenizers`. A folder without them is an error, not a quiet
  fall-back to a trained tokenizer: a study that asked for GPT-2's vocabulary and got
  another would not compare with the runs that had it.
- otherwise: a byte-level BPE (GPT-2's scheme: bytes as the base alphabet, so every text
  encodes and nothing is unknown) trained with `tokenizers` on the corpus's training
  split, never on validation. It is trained once per (corpus fingerprint, vocab size) and
  kept as `tokenizer.json` in the cache folder; later runs, and the jobs that wait for
  the first, load it. The corpus fingerprint covers the split's seed and fraction, so a
  different split trains its own tokenizer; training itself draws nothing at random.

Both know `<|endoftext|>` (GPT-2's own id 50256; id 0 in a trained one), which
separates documents in the token stream. `TextTokenizer.fingerprint` (sha256 of the
tokenizer's full JSON) keys the token shards.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from flashwatt.config_error import ConfigError
from flashwatt.records import atomic_write
from flashwatt.training.corpus import Corpus

EOS = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 8192
# 256 byte tokens and the separator: a smaller vocabulary cannot encode every text.
MIN_VOCAB_SIZE = 257
MAX_VOCAB_SIZE = 2**32  # token ids are stored as uint32 at most (flashwatt.training.shards)
_LOCK_TIMEOUT_S = 3 * 3600.0  # BPE on all of WikiText-103 takes minutes; never hours


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer: what it is, where it came from, its separator and fingerprint."""

    backend: Tokenizer = field(repr=False, compare=False)
    kind: str  # "gpt2" or "bpe"
    path: str  # the file it was loaded from (vocab.json for GPT-2's pair of files)
    eos_id: int
    fingerprint: str

    @classmethod
    def of(cls, backend: Tokenizer, kind: str, path: Path) -> "TextTokenizer":
        eos_id = backend.token_to_id(EOS)
        if eos_id is None:
            raise ValueError(f"{path}: the tokenizer has no {EOS} token to separate documents")
        return cls(backend, kind, str(path), eos_id, hashlib.sha256(backend.to_str().encode()).hexdigest())

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to vocab_size - 1: the model's embedding size."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def encode_documents(self, documents: list[str]) -> list[list[int]]:
        """The ids of each document (in parallel, in the tokenizers library's threads)."""
        return [e.ids for e in self.backend.encode_batch(documents)]

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=False)

    def summary(self) -> dict:
        return {"kind": self.kind, "path": self.path, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "fingerprint": self.fingerprint}


def load_tokenizer(corpus: Corpus, *, cache_dir: str | Path, key: str, gpt2_dir: str | Path | None = None,
                   vocab_size: int = DEFAULT_VOCAB_SIZE) -> TextTokenizer:
    """GPT-2's tokenizer from `gpt2_dir` when one is named, else the corpus's own BPE of
    `vocab_size` (trained into `cache_dir` the first time). `key` is the config key of
    the tokenizer section, named in every error."""
    if gpt2_dir is not None:
        return load_gpt2_tokenizer(gpt2_dir, key=key)
    return trained_tokenizer(corpus, cache_dir=cache_dir, vocab_size=vocab_size, key=key)


def load_gpt2_tokenizer(folder: str | Path, *, key: str) -> TextTokenizer:
    """GPT-2's tokenizer from the files the Hugging Face `gpt2` repository ships:
    `tokenizer.json`, or `vocab.json` and `merges.txt`."""
    folder = Path(folder)
    whole, vocab, merges = folder / "tokenizer.json", folder / "vocab.json", folder / "merges.txt"
    try:
        if whole.is_file():
            return TextTokenizer.of(Tokenizer.from_file(str(whole)), "gpt2", whole)
        if vocab.is_file() and merges.is_file():
            backend = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
            # What GPT-2's own tokenizer.json declares: byte-level, no space added in front.
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            # In GPT-2's vocabulary (id 50256); declared special so that it is matched whole
            # in text rather than split into bytes. Never added: a vocabulary without it is
            # not GPT-2's.
            if backend.token_to_id(EOS) is None:
                raise ValueError(f"{vocab}: the vocabulary has no {EOS} token to separate documents")
            backend.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
            return TextTokenizer.of(backend, "gpt2", vocab)
    except Exception as err:  # a corrupt or foreign file: say which and why
        raise ConfigError(f"config key {key}: cannot load GPT-2's tokenizer from {str(folder)!r}: "
                          f"{type(err).__name__}: {err}") from err
    raise ConfigError(f"config key {key}: {str(folder)!r} holds neither tokenizer.json nor vocab.json with "
                      f"merges.txt (GPT-2's tokenizer files); copy them there, or leave gpt2_dir out to "
                      f"train a BPE tokenizer on the corpus")


def new_bpe(corpus: Corpus, vocab_size: int) -> Tokenizer:
    """A byte-level BPE of at most `vocab_size` ids trained on the corpus's training
    split (fewer when the text has not that many pairs worth merging)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus.documents("train"), trainer=trainer)
    return backend


def trained_tokenizer(corpus: Corpus, *, cache_dir: str | Path, vocab_size: int, key: str) -> TextTokenizer:
    """The corpus's BPE tokenizer, from the cache or trained into it. Jobs that ask at the
    same time train once: the first holds a file lock while it trains and renames the
    finished file into place; the others wait on the lock and load that file."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or \
            not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ConfigError(f"config key {key}: vocab_size {vocab_size!r} must be an integer from "
                          f"{MIN_VOCAB_SIZE} (256 bytes and {EOS}) to {MAX_VOCAB_SIZE}")
    folder = Path(cache_dir) / "tokenizers" / f"bpe{vocab_size}-{corpus.fingerprint[:20]}"
    path = folder / "tokenizer.json"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock", timeout=_LOCK_TIMEOUT_S):
            if not path.is_file():  # another job may have trained it while this one waited
                backend = new_bpe(corpus, vocab_size)
                note = json.dumps({"corpus": corpus.summary(), "vocab_size_asked": vocab_size}, indent=1)
                atomic_write(folder / "corpus.json", lambda tmp: Path(tmp).write_text(note + "\n"))
                atomic_write(path, lambda tmp: backend.save(tmp))
    return TextTokenizer.of(Tokenizer.from_file(str(path)), "bpe", path)
