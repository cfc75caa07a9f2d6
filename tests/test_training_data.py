"""flashwatt.training's data: corpus, tokenizer, token shards, batches; on synthetic text
written into tmp_path (no data files in the repository, no network)."""
from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from filelock import FileLock
from tokenizers import Tokenizer

from flashwatt.config import ConfigError
from flashwatt.training.corpus import load_corpus, paragraphs, text_files, wikitext_articles
from flashwatt.training.shards import (BatchSampler, prepare_shards, steps_for_budget, token_dtype,
                                       validation_windows)
from flashwatt.training.tokenizer import EOS, load_gpt2_tokenizer, load_tokenizer, new_bpe

KEY = "suites.training.train.corpus"
TOKENIZER_KEY = "suites.training.train.tokenizer"

# --- a synthetic corpus ---------------------------------------------------------------

_NOUNS = ("kernel", "tile", "warp", "register", "budget", "counter", "window", "matrix", "queue", "river",
          "lantern", "harbour", "orchard", "compiler", "thermostat", "ledger", "café", "naïveté", "東京")
_VERBS = ("measures", "spills", "waits for", "rounds", "throttles", "copies", "reorders", "feeds", "repairs")
_ADJECTIVES = ("idle", "fused", "causal", "narrow", "patient", "noisy", "warm", "exact", "sparse", "quiet")


def sentence(rng: random.Random) -> str:
    words = [rng.choice(("The", "A", "Every", "No")), rng.choice(_ADJECTIVES), rng.choice(_NOUNS),
             rng.choice(_VERBS), rng.choice(("the", "a", "each")), rng.choice(_NOUNS)]
    if rng.random() < 0.3:
        words += ["after", str(rng.randint(2, 4096)), rng.choice(("steps", "joules", "ms"))]
    return " ".join(words) + rng.choice((".", ".", "!", "?", "; then it rests."))


def paragraph(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(2, 8)))


def write_corpus(root: Path, kilobytes: int = 300, seed: int = 0) -> Path:
    """Seeded, grammatical-looking text of about `kilobytes` KB in nested files of the
    kinds a corpus reads (*.txt, no extension) and kinds it must skip."""
    rng = random.Random(seed)
    readable = ["story.txt", "notes/a.txt", "notes/deep/README", "zeta.txt"]
    per_file = kilobytes * 1024 // len(readable)
    for name in readable:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        parts, size = [], 0
        while size < per_file:
            parts.append(paragraph(rng))
            size += len(parts[-1]) + 2
        path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    (root / "skip.md").write_text("# not read: markdown\n")
    (root / ".hidden.txt").write_text("not read: hidden\n")
    (root / ".git").mkdir(exist_ok=True)
    (root / ".git" / "HEAD").write_text("not read: under a hidden folder\n")
    (root / "table.dat").write_bytes(bytes(range(256)))
    (root / "zz-link").symlink_to(root / "story.txt")  # the same text again: read once
    return root


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def corpus(corpus_dir):
    return load_corpus(corpus_dir, key=KEY)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tokenizer(corpus, cache):
    return load_tokenizer(corpus, cache_dir=cache, vocab_size=1024, key=TOKENIZER_KEY)


# --- corpus ---------------------------------------------------------------------------


def test_a_directory_reads_txt_and_extensionless_files_in_sorted_order(corpus_dir, corpus):
    assert corpus.files == ("notes/a.txt", "notes/deep/README", "story.txt", "zeta.txt")
    assert [p.relative_to(corpus_dir).as_posix() for p in text_files(corpus_dir)] == list(corpus.files)
    everything = "\n".join(corpus.documents("train")) + "\n".join(corpus.documents("validation"))
    assert "not read" not in everything and "\ufffd" not in everything
    assert corpus.characters_per_split["train"] > 250_000  # the few hundred KB that were written
    one_file = load_corpus(corpus_dir / "zeta.txt", key=KEY)
    assert one_file.files == ("zeta.txt",)
    assert sum(one_file.documents_per_split.values()) == len(paragraphs((corpus_dir / "zeta.txt").read_text()))


def test_documents_are_the_paragraphs_between_blank_lines():
    text = "first line\nstill first\n\nsecond\r\n\r\nthird\n \t\n\n\nfourth  \n  \nfifth\n"
    assert paragraphs(text) == ["first line\nstill first", "second", "third", "fourth", "fifth"]


def test_undecodable_bytes_are_replaced(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n\nsecond paragraph\n\nthird one".encode("latin-1"))
    corpus = load_corpus(tmp_path, key=KEY, validation_fraction=0.3)
    documents = list(corpus.documents("train")) + list(corpus.documents("validation"))
    assert "caf\ufffd au lait" in documents


def test_validation_is_a_seeded_fraction_of_the_documents(corpus):
    train, validation = list(corpus.documents("train")), list(corpus.documents("validation"))
    total = len(train) + len(validation)
    assert total > 200
    assert len(validation) == round(0.05 * total) == corpus.documents_per_split["validation"]
    assert list(corpus.documents("validation")) == validation  # every call a fresh iterator
    again = load_corpus(corpus.source, key=KEY, seed=0)
    assert list(again.documents("validation")) == validation
    other = load_corpus(corpus.source, key=KEY, seed=1)
    assert list(other.documents("validation")) != validation
    assert sorted(list(other.documents("train")) + list(other.documents("validation"))) == sorted(train + validation)
    everything = [d for f in corpus.files for d in paragraphs((Path(corpus.source) / f).read_text())]
    assert [d for d in everything if d in set(validation)] == validation  # in corpus order
    assert [d for d in everything if d in set(train)] == train
    tenth = load_corpus(corpus.source, key=KEY, validation_fraction=0.1)
    assert tenth.documents_per_split["validation"] == round(0.1 * total)


def test_a_tiny_corpus_still_validates_on_one_document(tmp_path):
    (tmp_path / "t.txt").write_text("one\n\ntwo\n\nthree\n")
    corpus = load_corpus(tmp_path, key=KEY)  # 5% of 3 rounds to 0: one all the same
    assert corpus.documents_per_split == {"train": 2, "validation": 1}


def test_the_split_does_not_depend_on_the_order_files_were_written_or_listed(tmp_path, corpus_dir):
    files = {p.relative_to(corpus_dir): p.read_bytes() for p in text_files(corpus_dir)}
    forward, backward = tmp_path / "forward", tmp_path / "backward"
    for root, order in ((forward, sorted(files)), (backward, sorted(files, reverse=True))):
        for name in order:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(files[name])
    a, b = load_corpus(forward, key=KEY), load_corpus(backward, key=KEY)
    assert a.fingerprint == b.fingerprint
    assert list(a.documents("validation")) == list(b.documents("validation"))
    assert list(a.documents("train")) == list(b.documents("train"))


def test_the_fingerprint_follows_contents_names_and_split(tmp_path, corpus_dir, corpus):
    copy = tmp_path / "copy"
    for name in corpus.files:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((corpus_dir / name).read_bytes())
    assert load_corpus(copy, key=KEY).fingerprint == corpus.fingerprint  # the place does not matter
    story = copy / "story.txt"
    story.write_bytes(story.read_bytes().replace(b"The", b"Teh", 1))
    changed = load_corpus(copy, key=KEY)
    assert changed.content_fingerprint != corpus.content_fingerprint
    story.write_bytes((corpus_dir / "story.txt").read_bytes())
    story.rename(copy / "story2.txt")
    renamed = load_corpus(copy, key=KEY)
    assert renamed.content_fingerprint != corpus.content_fingerprint
    reseeded = load_corpus(corpus_dir, key=KEY, seed=3)
    assert reseeded.content_fingerprint == corpus.content_fingerprint
    assert reseeded.fingerprint != corpus.fingerprint  # another split: another tokenizer and shards
    assert load_corpus(corpus_dir, key=KEY, validation_fraction=0.1).fingerprint != corpus.fingerprint


def _empty_dir(tmp_path):
    (tmp_path / "notes.md").write_text("markdown only")
    return tmp_path


def _blank_files(tmp_path):
    (tmp_path / "a.txt").write_text("\n \n\t\n")
    (tmp_path / "b").write_text("")
    return tmp_path


def _one_paragraph(tmp_path):
    (tmp_path / "a.txt").write_text("a single paragraph\nover two lines\n")
    return tmp_path


@pytest.mark.parametrize("make, options, message", [
    (lambda p: p / "nowhere", {}, "does not exist"),
    (_empty_dir, {}, "holds no text file"),
    (_blank_files, {}, "is empty"),
    (_one_paragraph, {}, "leaves none to train on"),
    (lambda p: write_corpus(p, kilobytes=4), {"validation_fraction": 1.0}, "strictly between 0 and 1"),
    (lambda p: write_corpus(p, kilobytes=4), {"validation_fraction": 0.0}, "strictly between 0 and 1"),
    (lambda p: "wikitext103", {"validation_fraction": 0.1}, "its own validation split"),
])
def test_bad_corpora_are_refused_naming_the_key(tmp_path, make, options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_corpus(make(tmp_path), key=KEY, **options)
    assert str(caught.value).startswith(f"config key {KEY}: ")


def test_wikitext_without_datasets_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # what `import datasets` meets when it is absent
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[wikitext\]'") as caught:
        load_corpus("wikitext103", key=KEY)
    assert KEY in str(caught.value)


def test_wikitext_rows_group_into_articles():
    rows = ["", " = Valkyria Chronicles = \n", "", " Senjō no Valkyria is a game . \n", "",
            " = = Gameplay = = \n", "", " Players move units . \n", "", " = Tower Building = \n", "",
            " It is a building . \n"]
    articles = list(wikitext_articles(rows))
    assert len(articles) == 2
    assert articles[0].startswith("= Valkyria Chronicles =") and "= = Gameplay = =" in articles[0]
    assert articles[0].endswith("Players move units .")
    assert articles[1] == "= Tower Building = \n It is a building ."


# --- tokenizer ------------------------------------------------------------------------


def test_a_trained_bpe_encodes_any_text_and_separates_documents(corpus, tokenizer):
    assert tokenizer.kind == "bpe" and tokenizer.eos_id == 0 and tokenizer.vocab_size == 1024
    text = next(corpus.documents("validation"))
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # it learnt merges, not bytes
    unseen = "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich 🙂"
    assert tokenizer.decode(tokenizer.encode(unseen)) == unseen  # byte-level: nothing is unknown
    assert tokenizer.encode(f"warp{EOS}tile").count(tokenizer.eos_id) == 1


def test_the_bpe_learns_from_the_training_split_only(tmp_path, cache):
    # Every paragraph has its own word, repeated: a word from training becomes one token,
    # a word only validation has stays in pieces.
    text = "\n\n".join(" ".join([f"qz{chr(97 + i % 26)}{chr(97 + i // 26)}x"] * 40) for i in range(60))
    (tmp_path / "words.txt").write_text(text)
    corpus = load_corpus(tmp_path, key=KEY, validation_fraction=0.1)
    tokenizer = load_tokenizer(corpus, cache_dir=cache, vocab_size=400, key=TOKENIZER_KEY)

    def pieces(document):
        return len(tokenizer.encode(" " + document.split()[0]))

    assert all(pieces(d) == 1 for d in corpus.documents("train"))
    assert all(pieces(d) > 1 for d in corpus.documents("validation"))


def test_bpe_training_draws_nothing_at_random(corpus, tokenizer):
    # Why the tokenizer cache needs no seed of its own: training again gives the same file.
    assert new_bpe(corpus, 1024).to_str() == tokenizer.backend.to_str()


def test_the_bpe_is_trained_once_and_loaded_from_the_cache(corpus, cache, tokenizer):
    path = Path(tokenizer.path)
    assert path.name == "tokenizer.json" and path.is_relative_to(cache)
    written = path.stat().st_mtime_ns
    again = load_tokenizer(corpus, cache_dir=cache, vocab_size=1024, key=TOKENIZER_KEY)
    assert again.path == tokenizer.path and path.stat().st_mtime_ns == written
    assert again.fingerprint == tokenizer.fingerprint
    note = json.loads((path.parent / "corpus.json").read_text())
    assert note["corpus"]["fingerprint"] == corpus.fingerprint and note["vocab_size_asked"] == 1024
    smaller = load_tokenizer(corpus, cache_dir=cache, vocab_size=512, key=TOKENIZER_KEY)
    assert smaller.path != tokenizer.path and smaller.vocab_size == 512
    reseeded = load_corpus(corpus.source, key=KEY, seed=7)
    assert load_tokenizer(reseeded, cache_dir=cache, vocab_size=1024, key=TOKENIZER_KEY).path != tokenizer.path


def test_a_job_waiting_on_the_lock_loads_what_the_first_one_trained(tmp_path, corpus, tokenizer):
    # The first job (here: this test) holds the lock; the second must wait, then load the
    # finished file, not train its own.
    folder = tmp_path / "tokenizers" / f"bpe1024-{corpus.fingerprint[:20]}"
    folder.mkdir(parents=True)
    results = []
    with FileLock(str(folder) + ".lock"):
        second = threading.Thread(target=lambda: results.append(
            load_tokenizer(corpus, cache_dir=tmp_path, vocab_size=1024, key=TOKENIZER_KEY)))
        second.start()
        time.sleep(0.5)
        assert second.is_alive() and not results  # waiting on the lock
        # What the first job finishes with: a tokenizer that a fresh training would not give.
        finished = Tokenizer.from_str(tokenizer.backend.to_str())
        finished.add_special_tokens(["<|marker|>"])
        finished.save(str(folder / "tokenizer.json"))
    second.join(timeout=600)  # loading is quick; the bound only guards against a deadlock
    assert results and results[0].backend.token_to_id("<|marker|>") is not None


def test_gpt2_files_load_as_gpt2s_tokenizer(tmp_path, corpus, tokenizer):
    # GPT-2's files cannot be downloaded here; a byte-level BPE saved in the same formats
    # (vocab.json + merges.txt, as GPT-2's repository has them, and tokenizer.json) can.
    pair, whole = tmp_path / "pair", tmp_path / "whole"
    pair.mkdir(), whole.mkdir()
    tokenizer.backend.model.save(str(pair))
    tokenizer.backend.save(str(whole / "tokenizer.json"))
    text = f"The fused kernel waits for the warp.{EOS}Every quiet ledger rounds 東京."
    for folder in (pair, whole):
        loaded = load_tokenizer(corpus, cache_dir=tmp_path, gpt2_dir=folder, key=TOKENIZER_KEY)
        assert loaded.kind == "gpt2"
        assert loaded.encode(text) == tokenizer.encode(text)
        assert loaded.eos_id == tokenizer.eos_id and loaded.decode(loaded.encode(text)) == text


def test_a_gpt2_folder_without_its_files_is_an_error_not_a_fallback(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")  # merges.txt missing
    with pytest.raises(ConfigError, match=f"config key {TOKENIZER_KEY}: .*neither tokenizer.json nor vocab.json"):
        load_gpt2_tokenizer(tmp_path, key=TOKENIZER_KEY)
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ConfigError, match=f"config key {TOKENIZER_KEY}: .*cannot load.*{EOS}"):
        load_gpt2_tokenizer(tmp_path, key=TOKENIZER_KEY)  # readable, but no separator


@pytest.mark.parametrize("vocab_size", [256, 0, 2**32 + 1, 1000.5])
def test_an_impossible_vocab_size_is_refused(corpus, tmp_path, vocab_size):
    with pytest.raises(ConfigError, match=f"config key {TOKENIZER_KEY}: vocab_size"):
        load_tokenizer(corpus, cache_dir=tmp_path, vocab_size=vocab_size, key=TOKENIZER_KEY)


# --- token shards ---------------------------------------------------------------------


def test_shards_hold_each_split_once_with_separators(corpus, tokenizer, cache):
    shards = prepare_shards(corpus, tokenizer, cache)
    for split in ("train", "validation"):
        tokens = shards.tokens(split)
        assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and not tokens.flags.writeable
        documents = list(corpus.documents(split))
        expected = [i for d in documents for i in tokenizer.encode(d) + [tokenizer.eos_id]]
        assert tokens.tolist() == expected
        assert shards.meta["tokens"][split] == len(expected) and shards.meta["documents"][split] == len(documents)
    first = shards.tokens("train")[: list(shards.tokens("train")).index(tokenizer.eos_id)]
    assert tokenizer.decode(first.tolist()) == next(corpus.documents("train"))
    assert shards.meta["corpus"]["fingerprint"] == corpus.fingerprint
    assert shards.meta["tokenizer"]["fingerprint"] == tokenizer.fingerprint


def test_shards_are_written_once_and_rebuilt_only_when_unfinished(corpus, tokenizer, tmp_path):
    shards = prepare_shards(corpus, tokenizer, tmp_path)
    written = {p.name: p.stat().st_mtime_ns for p in shards.directory.iterdir()}
    assert sorted(written) == ["meta.json", "train.npy", "validation.npy"]  # no temporary file left
    assert prepare_shards(corpus, tokenizer, tmp_path).directory == shards.directory
    assert {p.name: p.stat().st_mtime_ns for p in shards.directory.iterdir()} == written
    # A job killed before meta.json: its shards do not count, the next job writes them anew.
    expected = np.array(shards.tokens("train"))
    (shards.directory / "meta.json").unlink()
    np.save(shards.directory / "train.npy", np.zeros(3, dtype=np.uint16))
    assert np.array_equal(prepare_shards(corpus, tokenizer, tmp_path).tokens("train"), expected)


def test_token_files_are_uint16_while_the_vocabulary_fits():
    assert token_dtype(50257) == np.uint16 and token_dtype(2**16) == np.uint16
    assert token_dtype(2**16 + 1) == np.uint32
    with pytest.raises(ValueError):
        token_dtype(2**32 + 1)


# --- batches --------------------------------------------------------------------------


def test_a_batch_is_windows_of_the_tokens_and_their_next_tokens():
    tokens = np.arange(5000, dtype=np.uint16)  # a token's value is its position
    inputs, targets = BatchSampler(tokens, batch=8, context=64, seed=0, key="k").batch(0)
    assert inputs.shape == targets.shape == (8, 64) and inputs.dtype == targets.dtype == torch.int64
    starts = inputs[:, :1]
    assert torch.equal(inputs, starts + torch.arange(64))  # contiguous windows
    assert torch.equal(targets, inputs + 1)  # shifted by one
    assert len(set(starts.flatten().tolist())) > 1  # random offsets


def test_a_resumed_run_draws_the_batches_an_unbroken_run_draws():
    tokens = np.random.default_rng(0).integers(0, 1000, 20_000).astype(np.uint16)
    unbroken = BatchSampler(tokens, batch=4, context=32, seed=11, key="k")
    run = [batch for _, batch in zip(range(10), unbroken.batches())]
    resumed = BatchSampler(tokens, batch=4, context=32, seed=11, key="k")  # a new process, say
    rest = [batch for _, batch in zip(range(5), resumed.batches(start_step=5))]
    for (x, y), (rx, ry) in zip(run[5:], rest):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert not torch.equal(run[0][0], run[1][0])  # steps differ
    other_seed = BatchSampler(tokens, batch=4, context=32, seed=12, key="k").batch(0)[0]
    assert not torch.equal(run[0][0], other_seed)


def test_offsets_reach_the_last_window_and_never_past_it():
    context = 16
    tokens = np.arange(context + 3, dtype=np.uint16)  # three windows: starts 0, 1, 2
    sampler = BatchSampler(tokens, batch=4, context=context, seed=0, key="k")
    starts = {int(s) for step in range(50) for s in sampler.batch(step)[0][:, 0]}
    assert starts == {0, 1, 2}


def test_a_split_shorter_than_one_window_is_refused_naming_the_key():
    tokens = np.arange(65, dtype=np.uint16)
    BatchSampler(tokens, batch=2, context=64, seed=0, key="k")  # 64 + 1 tokens: one window
    with pytest.raises(ConfigError, match=r"config key suites.t.context: the train split has 65 tokens, fewer "
                                          r"than context \+ 1 = 66"):
        BatchSampler(tokens, batch=2, context=65, seed=0, key="suites.t.context")
    with pytest.raises(ConfigError, match="config key suites.t.context: the validation split"):
        validation_windows(tokens, context=65, count=1, key="suites.t.context")


def test_the_budget_buys_whole_steps_and_at_least_one():
    assert steps_for_budget(10_000, batch=4, context=256, key="k") == 9  # 1024 tokens a step
    assert steps_for_budget(1024, batch=4, context=256, key="k") == 1
    with pytest.raises(ConfigError, match=r"config key suites.t.token_budget: a budget of 1023 tokens is less "
                                          r"than one step \(batch 4 x context 256 = 1024 tokens\)"):
        steps_for_budget(1023, batch=4, context=256, key="suites.t.token_budget")


def test_the_validation_set_is_the_first_windows_of_the_split():
    tokens = np.arange(1000, dtype=np.uint16)
    inputs, targets = validation_windows(tokens, context=100, count=3, key="k")
    assert inputs[:, 0].tolist() == [0, 100, 200] and torch.equal(targets, inputs + 1)
    assert torch.equal(validation_windows(tokens, context=100, count=3, key="k")[0], inputs)  # fixed
    every, _ = validation_windows(tokens, context=100, count=None, key="k")
    assert len(every) == 9  # the 10th window would need token 1000
    with pytest.raises(ConfigError, match="config key suites.t.validation_windows: 10 validation windows asked; "
                                          "the validation split .1000 tokens. holds 9"):
        validation_windows(tokens, context=100, count=10, key="suites.t.validation_windows")


def test_batches_come_from_real_shards(corpus, tokenizer, cache):
    shards = prepare_shards(corpus, tokenizer, cache)
    inputs, targets = BatchSampler(shards.tokens("train"), batch=4, context=128, seed=0, key="k").batch(3)
    assert int(inputs.max()) < tokenizer.vocab_size and torch.equal(inputs[:, 1:], targets[:, :-1])
    assert len(tokenizer.decode(inputs[0].tolist())) > 128  # text, in merged tokens
