"""The text a training run learns from: its documents, split into train and validation.

A corpus is named by one config value:

- `wikitext103`: WikiText-103 (raw) from the Hugging Face hub (`Salesforce/wikitext`,
  `wikitext-103-raw-v1`) through the optional `datasets` package, for machines with a
  network. Its own train and validation splits are used; a document is an article.
- a path: a plain-text file, or a directory whose every `*.txt` file and file without
  an extension (recursively, hidden names left out, linked files once, in sorted order)
  is read as UTF-8, undecodable bytes replaced. A document is a paragraph: text between blank lines. A
  seeded permutation sends a fixed fraction of the documents (at least one) to
  validation, so the split is the same on every machine and does not depend on the
  order in which the filesystem lists the files.

`Corpus.fingerprint` (sha256 over the relative paths and contents, and over how the split
was made) keys every cache built from the corpus: the trained tokenizer and the token
shards. A bad value is refused with a ConfigError naming the config key it came from.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from flashwatt.config_error import ConfigError

WIKITEXT103 = "wikitext103"
SPLITS = ("train", "validation")
DEFAULT_VALIDATION_FRACTION = 0.05

_WIKITEXT_DATASET = ("Salesforce/wikitext", "wikitext-103-raw-v1")
_BLANK_LINE = re.compile(r"\n[ \t\f\v]*\n")


@dataclass(frozen=True)
class Corpus:
    """Documents of a train and a validation split, and the fingerprint of both."""

    source: str  # "wikitext103" or the absolute path read
    content_fingerprint: str  # sha256 over relative paths and contents (rows, for WikiText)
    split_rule: str  # how the validation split was made, in words
    documents_per_split: dict[str, int]
    characters_per_split: dict[str, int]
    files: tuple[str, ...] = ()  # the files read, relative to the source (local corpora)
    _stream: Callable[[str], Iterable[str]] = field(default=None, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        """The key of every cache built from this corpus: contents and split together, so
        a different seed or validation fraction never reuses a tokenizer trained on
        another training split."""
        return hashlib.sha256(f"corpus v1\0{self.content_fingerprint}\0{self.split_rule}".encode()).hexdigest()

    def documents(self, split: str) -> Iterator[str]:
        """The documents of `split` ("train" or "validation"), in corpus order; a fresh
        iterator on every call."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        return iter(self._stream(split))

    def summary(self) -> dict:
        """What a record keeps about the corpus."""
        return {"source": self.source, "fingerprint": self.fingerprint, "split": self.split_rule,
                "documents": dict(self.documents_per_split), "characters": dict(self.characters_per_split),
                "files": len(self.files)}


def load_corpus(source: str | os.PathLike, *, key: str, validation_fraction: float | None = None,
                seed: int = 0) -> Corpus:
    """The corpus a config names under `key` (e.g. `suites.training.train.corpus`).

    `validation_fraction` (default 0.05) and `seed` choose the validation documents of a
    local corpus; WikiText-103 has its own validation split, so a fraction given with it
    is refused rather than ignored.
    """
    if str(source) == WIKITEXT103:
        if validation_fraction is not None:
            raise ConfigError(f"config key {key}: {WIKITEXT103} has its own validation split; "
                              f"validation_fraction {validation_fraction} would be ignored, remove it")
        return _load_wikitext103(key)
    fraction = DEFAULT_VALIDATION_FRACTION if validation_fraction is None else float(validation_fraction)
    if not 0 < fraction < 1:
        raise ConfigError(f"config key {key}: validation_fraction {fraction} must lie strictly between 0 and 1")
    return _load_text(Path(source), key=key, fraction=fraction, seed=int(seed))


# --- local plain text ---------------------------------------------------------------


def text_files(root: Path) -> list[Path]:
    """Every *.txt file and file without an extension under `root`, in sorted order of
    relative path. Hidden names (and all below a hidden directory) are left out: they are
    version-control internals and editor files, not text anyone meant to train on. A file
    reached twice (through a symbolic link) is read once, under its first name: a copy in
    each split would put validation text into training."""
    if root.is_file():
        return [root]
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = Path(folder, name)
            if not name.startswith(".") and path.suffix in ("", ".txt") and path.is_file():
                found.append(path)
    seen, files = set(), []
    for path in sorted(found, key=lambda p: p.relative_to(root).as_posix()):
        if path.resolve() not in seen:
            seen.add(path.resolve())
            files.append(path)
    return files


def paragraphs(text: str) -> list[str]:
    """The documents of one file: its paragraphs (blank-line separated), stripped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return [p.strip() for p in _BLANK_LINE.split(text) if p.strip()]


def validation_indices(count: int, fraction: float, seed: int) -> np.ndarray:
    """Which of `count` documents go to validation: round(fraction * count), at least one,
    the first of a permutation drawn from `seed`."""
    chosen = max(1, round(fraction * count))
    return np.random.default_rng(seed).permutation(count)[:chosen]


def _load_text(path: Path, *, key: str, fraction: float, seed: int) -> Corpus:
    if not path.exists():
        raise ConfigError(f"config key {key}: {str(path)!r} does not exist; name a plain-text file or a "
                          f"directory of them, or {WIKITEXT103}")
    root = path.resolve()
    files = text_files(root)
    if not files:
        raise ConfigError(f"config key {key}: {str(path)!r} holds no text file (*.txt or a file without an "
                          f"extension)")
    digest = hashlib.sha256()
    documents: list[str] = []
    names = []
    for file in files:
        raw = file.read_bytes()
        name = file.name if root.is_file() else file.relative_to(root).as_posix()
        names.append(name)
        # Lengths delimit every field: no two different corpora hash the same byte stream.
        digest.update(f"{len(name.encode())}:{name}\0{len(raw)}:".encode())
        digest.update(raw)
        documents.extend(paragraphs(raw.decode("utf-8", errors="replace")))
    if not documents:
        raise ConfigError(f"config key {key}: {str(path)!r} is empty: {len(files)} file(s) and no text in them")
    held_out = validation_indices(len(documents), fraction, seed)
    if len(held_out) >= len(documents):
        raise ConfigError(f"config key {key}: {len(documents)} document(s) (paragraphs) in {str(path)!r}; "
                          f"validation takes {len(held_out)} of them (validation_fraction {fraction}, at least "
                          f"one) and leaves none to train on; give more text")
    # Both splits keep corpus order: validation reads as the text it was cut from.
    is_validation = np.zeros(len(documents), dtype=bool)
    is_validation[held_out] = True
    splits = {"train": [d for d, v in zip(documents, is_validation) if not v],
              "validation": [d for d, v in zip(documents, is_validation) if v]}
    return Corpus(source=str(root), content_fingerprint=digest.hexdigest(),
                  split_rule=f"paragraphs; validation_fraction {fraction!r}, seed {seed}",
                  documents_per_split={s: len(d) for s, d in splits.items()},
                  characters_per_split={s: sum(map(len, d)) for s, d in splits.items()},
                  files=tuple(names), _stream=splits.__getitem__)


# --- WikiText-103 ---------------------------------------------------------------------


def wikitext_articles(rows: Iterable[str]) -> Iterator[str]:
    """WikiText rows (one line each, "" between paragraphs) grouped into articles. An
    article starts at a top-level heading row, ` = Title = `; section headings are
    ` = = Section = = ` and stay inside their article."""
    article: list[str] = []
    for row in rows:
        line = row.strip()
        if line.startswith("= ") and line.endswith(" =") and not line.startswith("= ="):
            text = "".join(article).strip()
            if text:
                yield text
            article = []
        article.append(row)
    text = "".join(article).strip()
    if text:
        yield text


def _wikitext_rows(dataset, batch_size: int = 10_000) -> Iterator[str]:
    for batch in dataset.iter(batch_size=batch_size):
        yield from batch["text"]


def _load_wikitext103(key: str) -> Corpus:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"config key {key}: {WIKITEXT103} is read with Hugging Face datasets, which is not "
                          f"installed; pip install -e '.[wikitext]' (and a network, or a filled "
                          f"HF_DATASETS_CACHE), or name a local plain-text corpus") from None
    try:
        loaded = datasets.load_dataset(*_WIKITEXT_DATASET)
    except Exception as err:  # the hub unreachable, an offline cache without it, ...
        raise ConfigError(f"config key {key}: could not load {'/'.join(_WIKITEXT_DATASET)} with datasets: "
                          f"{type(err).__name__}: {err}") from err
    # One pass over the rows (memory-mapped Arrow) for the fingerprint and the counts;
    # the documents themselves are streamed again when a cache needs building.
    digest = hashlib.sha256()
    counts, characters = {}, {}
    for split in SPLITS:
        digest.update(f"{split}\0".encode())
        counts[split] = characters[split] = 0
        for article in wikitext_articles(_wikitext_rows(loaded[split])):
            raw = article.encode()
            digest.update(f"{len(raw)}:".encode())
            digest.update(raw)
            counts[split] += 1
            characters[split] += len(article)
    return Corpus(source=WIKITEXT103, content_fingerprint=digest.hexdigest(),
                  split_rule=f"articles; the dataset's own validation split ({'/'.join(_WIKITEXT_DATASET)})",
                  documents_per_split=counts, characters_per_split=characters,
                  _stream=lambda split: wikitext_articles(_wikitext_rows(loaded[split])))
