"""Streamed corpora, preparation stopped at a token count, and tokenisation across threads.

The hub is out of reach in tests, so the streaming path runs on local files loaded with
`streaming=True`: the code a hub corpus goes through (trainer/corpus.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import trainer.corpus as corpus_module
import trainer.data as data_module
import trainer.data_cli as data_cli
from trainer.budget import Budget
from trainer.corpus import GPU_HUB_CONFIG, GPU_HUB_CORPUS, CorpusSource
from trainer.data import prepare_data, tokens_to_prepare

ROOT = Path(__file__).resolve().parents[1]
VOCAB, SEQ = 256, 16
WORDS = ("the cat sat on a mat while dogs ran past green hills under grey skies and birds sang "
         "of rivers stones trees rain wind light night morning evening").split()


def write_jsonl(path: Path, documents: int, seed: int) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as out:
        for _ in range(documents):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
            out.write(json.dumps({"text": text, "id": rng.random()}) + "\n")
    return path


@pytest.fixture
def corpus_dir(tmp_path) -> Path:
    """A jsonl corpus with a validation file: 600 train and 40 validation documents."""
    directory = tmp_path / "corpus"
    directory.mkdir()
    write_jsonl(directory / "train.jsonl", 600, seed=1)
    write_jsonl(directory / "validation.jsonl", 40, seed=2)
    return directory


def prepare(source: CorpusSource, cache: Path, **options):
    return prepare_data(source, vocab_size=VOCAB, seq_len=SEQ, cache_dir=cache, **options)


def test_a_streamed_corpus_packs_the_same_rows_as_a_loaded_one(corpus_dir, tmp_path):
    loaded = prepare(CorpusSource.from_args(data_dir=corpus_dir), tmp_path / "loaded")
    streamed_source = CorpusSource.from_args(data_dir=corpus_dir, streaming=True)
    assert streamed_source.streaming and not CorpusSource.from_args(data_dir=corpus_dir).streaming
    # The loaded run's tokenizer: a WordPiece trained twice may break frequency ties differently.
    streamed = prepare(streamed_source, tmp_path / "streamed", max_tokens=10**9, tokenizer_file=loaded.tokenizer_path)
    assert streamed.fingerprint != loaded.fingerprint  # streaming and the cap are part of it
    np.testing.assert_array_equal(np.asarray(streamed.train), np.asarray(loaded.train))
    np.testing.assert_array_equal(streamed.validation, loaded.validation)
    assert streamed.manifest["train"]["documents"] == 600


def test_a_stream_without_validation_split_holds_out_its_first_documents(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "STREAM_HELD_OUT_DOCUMENTS", 30)
    path = write_jsonl(tmp_path / "all.jsonl", 300, seed=3)
    data = prepare(CorpusSource.from_args(data_dir=path, streaming=True), tmp_path / "cache", max_tokens=10**9)
    assert data.manifest["validation"]["origin"] == "first 30 train documents (held out of training)"
    assert data.manifest["train"]["documents"] == 270
    assert data.manifest["validation"]["documents"] == 30


@pytest.mark.parametrize("streaming", [False, True])
def test_preparation_stops_at_the_requested_token_count(corpus_dir, tmp_path, streaming):
    source = CorpusSource.from_args(data_dir=corpus_dir, streaming=streaming)
    whole = prepare(source, tmp_path / "cache", max_tokens=10**9)  # one cache: one tokenizer
    max_tokens = 1000  # not a multiple of SEQ: the fewest rows that hold it
    capped = prepare(source, tmp_path / "cache", max_tokens=max_tokens)
    rows = math.ceil(max_tokens / SEQ)
    assert len(whole.train) > rows
    assert capped.train.shape == (rows, SEQ)
    assert (tmp_path / "cache" / "data" / capped.fingerprint / "train.bin").stat().st_size == rows * SEQ * 2
    np.testing.assert_array_equal(np.asarray(capped.train), np.asarray(whole.train)[:rows])  # a prefix
    assert capped.manifest["max_tokens"] == max_tokens and capped.fingerprint != whole.fingerprint
    assert capped.manifest["train"]["documents"] < whole.manifest["train"]["documents"]  # stopped reading
    assert "dropped_tail_tokens" not in capped.manifest["train"]


def test_a_stream_without_max_tokens_prepares_the_stream_default(corpus_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "STREAM_DEFAULT_TOKENS", 320)
    data = prepare(CorpusSource.from_args(data_dir=corpus_dir, streaming=True), tmp_path / "cache")
    assert len(data.train) == 320 // SEQ and data.manifest["max_tokens"] == 320
    loaded = prepare(CorpusSource.from_args(data_dir=corpus_dir), tmp_path / "cache")
    assert "max_tokens" not in loaded.manifest and len(loaded.train) > 20  # a loaded corpus: whole


def test_max_tokens_must_be_positive(corpus_dir, tmp_path):
    with pytest.raises(data_module.DataError, match="max_tokens=0 must be positive"):
        prepare(CorpusSource.from_args(data_dir=corpus_dir), tmp_path / "cache", max_tokens=0)


def test_tokens_to_prepare_follows_token_and_flop_budgets_of_streams_only(corpus_dir):
    streamed = CorpusSource.from_args(data_dir=corpus_dir, streaming=True)
    loaded = CorpusSource.from_args(data_dir=corpus_dir)
    assert tokens_to_prepare(streamed, Budget.parse("2.5e7tokens")) == 25_000_000
    assert tokens_to_prepare(streamed, Budget.parse("1e15flops"), flops_per_token=3e6) == math.ceil(1e15 / 3e6)
    assert tokens_to_prepare(streamed, Budget.parse("1e15flops")) is None  # no model: the stream default
    assert tokens_to_prepare(streamed, Budget.parse("10m")) is None
    assert tokens_to_prepare(loaded, Budget.parse("2.5e7tokens")) is None  # a loaded corpus is packed whole


def test_the_gpu_default_is_fineweb_edu_streamed():
    gpu = CorpusSource.from_args(gpu=True)
    assert (gpu.hub_id, gpu.hub_config, gpu.streaming) == (GPU_HUB_CORPUS, GPU_HUB_CONFIG, True)
    assert gpu.identity()["streaming"] is True
    cpu = CorpusSource.from_args()
    assert cpu.hub_id == "Salesforce/wikitext" and cpu.streaming
    # Named alone, a known corpus gets its config (how a search trial re-creates the driver's source).
    assert CorpusSource.from_args(corpus=GPU_HUB_CORPUS) == gpu
    assert CorpusSource.from_args(corpus=GPU_HUB_CORPUS, corpus_config="sample-10BT").hub_config == "sample-10BT"


def _train_digest(corpus_dir: Path, tokenizer: Path, cache: Path, threads: str) -> str:
    """The packed train rows of `tokenizer`, prepared in a fresh interpreter with `threads` threads."""
    script = (
        "import hashlib, sys; from trainer.corpus import CorpusSource; from trainer.data import prepare_data; "
        f"d = prepare_data(CorpusSource.from_args(data_dir=sys.argv[1], streaming=True), vocab_size={VOCAB}, "
        f"seq_len={SEQ}, tokenizer_file=sys.argv[2], cache_dir=sys.argv[3], max_tokens=10**9); "
        "print(hashlib.sha256(bytes(d.train)).hexdigest())"
    )
    env = {**os.environ, "RAYON_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false" if threads == "1" else "true"}
    done = subprocess.run([sys.executable, "-c", script, str(corpus_dir), str(tokenizer), str(cache)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_parallel_tokenisation_gives_the_ids_of_serial(corpus_dir, tmp_path):
    # One tokenizer for all: the encoding alone differs in thread count, and each run packs its own rows.
    here = prepare(CorpusSource.from_args(data_dir=corpus_dir, streaming=True), tmp_path / "here", max_tokens=10**9)
    serial = _train_digest(corpus_dir, here.tokenizer_path, tmp_path / "serial", "1")
    parallel = _train_digest(corpus_dir, here.tokenizer_path, tmp_path / "parallel", "4")
    assert serial == parallel == hashlib.sha256(bytes(here.train)).hexdigest()


def test_data_cli_max_tokens(corpus_dir, tmp_path, capsys):
    argv = ["--data", str(corpus_dir), "--vocab-size", str(VOCAB), "--seq-len", str(SEQ),
            "--cache-dir", str(tmp_path / "cache")]
    data_cli.main([*argv, "--max-tokens", "3.2e2"])
    out = capsys.readouterr().out
    assert "20 sequences x 16 tokens" in out and "stopped at max_tokens=320" in out
    for bad in ("0", "1.5", "lots"):
        with pytest.raises(SystemExit) as exit_info:
            data_cli.main([*argv, "--max-tokens", bad])
        assert exit_info.value.code == 2
        assert "--max-tokens" in capsys.readouterr().err
