"""Tests of the pretraining data pipeline (trainer/corpus.py, tokenizer.py, packing.py, data.py,
masking.py, unigram.py).

Most tests run on a small synthetic corpus written into tmp_path; one reads the first articles of
the shared Wikipedia and is skipped only when ../shared/data is absent.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import trainer.corpus as corpus_module
import trainer.data_cli as data_cli
import trainer.packing as packing_module
import trainer.tokenizer as tokenizer_module
from trainer.corpus import CorpusSource, DataError
from trainer.data import PretrainData, prepare_data
from trainer.masking import mask_tokens
from trainer.packing import pack_sequences
from trainer.tokenizer import build_normalizer
from trainer.unigram import unigram_floor

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
VOCAB = 512


def toy_documents(count: int, seed: int) -> list[str]:
    """Paragraphs of made-up words: enough variety to train a few hundred WordPiece tokens."""
    rng = random.Random(seed)
    syllables = [
        "ka",
        "lo",
        "mi",
        "ne",
        "ru",
        "sa",
        "to",
        "vi",
        "qu",
        "ex",
        "an",
        "or",
        "el",
        "is",
        "ba",
        "de",
    ]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(400)]
    documents = []
    for _ in range(count):
        sentences = [
            " ".join(rng.choices(words, k=rng.randint(4, 14))).capitalize() + "."
            for _ in range(rng.randint(2, 8))
        ]
        documents.append(" ".join(sentences))
    return documents


def write_parquet(path: Path, texts: list[str], column: str = "text") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: texts, "id": list(range(len(texts)))}), path)


@pytest.fixture(scope="module")
def toy_data_dir(tmp_path_factory) -> Path:
    """DATA/pretrain/toy/{train,validation}.parquet, the layout of ../shared/data."""
    root = tmp_path_factory.mktemp("DATA")
    write_parquet(root / "pretrain" / "toy" / "train.parquet", toy_documents(300, seed=1))
    write_parquet(root / "pretrain" / "toy" / "validation.parquet", toy_documents(40, seed=2))
    return root


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def toy_data(toy_data_dir, toy_cache) -> PretrainData:
    return prepare_data(
        CorpusSource.from_args(data_dir=toy_data_dir), vocab_size=VOCAB, seq_len=32, cache_dir=toy_cache
    )


def token_stream(data: PretrainData, texts: list[str]) -> np.ndarray:
    """What the pipeline should pack: each document's tokens, [SEP] between documents."""
    pieces = []
    for encoding in data.tokenizer.encode_batch(texts, add_special_tokens=False):
        if pieces:
            pieces.append([data.special_ids["sep"]])
        pieces.append(encoding.ids)
    return np.concatenate(pieces)


# --- masking -------------------------------------------------------------------------------------


def random_batch(rows: int, length: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Rows [CLS] tokens... [SEP] [PAD]...: every row ends in some padding."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randint(len(SPECIAL_IDS), vocab_size, (rows, length), generator=generator)
    batch[:, 0] = SPECIAL_IDS["cls"]
    for row, end in enumerate(torch.randint(length // 2, length - 1, (rows,), generator=generator).tolist()):
        batch[row, end] = SPECIAL_IDS["sep"]
        batch[row, end + 1 :] = SPECIAL_IDS["pad"]
    return batch


def test_mask_tokens_rate_split_and_labels():
    vocab_size = 1000
    batch = random_batch(2000, 128, vocab_size)
    original = batch.clone()
    masked, labels = mask_tokens(
        batch,
        0.25,
        special_ids=SPECIAL_IDS,
        vocab_size=vocab_size,
        generator=torch.Generator().manual_seed(1),
    )
    assert torch.equal(batch, original), "the input must not be modified"

    special = torch.isin(batch, torch.tensor(list(SPECIAL_IDS.values())))
    selected = labels != -100
    assert not (selected & special).any(), "special tokens are never selected"
    assert torch.equal(masked[special], batch[special])
    assert torch.equal(labels[selected], batch[selected]), "labels hold the original tokens"
    assert torch.equal(masked[~selected], batch[~selected]), "unselected positions stay as they are"

    rate = selected.sum().item() / (~special).sum().item()
    assert abs(rate - 0.25) < 0.005
    n = selected.sum().item()
    to_mask = (masked == SPECIAL_IDS["mask"]) & selected
    unchanged = (masked == batch) & selected
    to_random = selected & ~to_mask & ~unchanged
    assert abs(to_mask.sum().item() / n - 0.8) < 0.01
    assert abs(to_random.sum().item() / n - 0.1) < 0.01
    assert abs(unchanged.sum().item() / n - 0.1) < 0.01
    random_tokens = masked[to_random]
    assert random_tokens.min() >= len(SPECIAL_IDS) and random_tokens.max() < vocab_size


def test_mask_tokens_is_deterministic_for_a_generator_seed():
    batch = random_batch(8, 64, 300)

    def run(seed):
        return mask_tokens(
            batch, special_ids=SPECIAL_IDS, vocab_size=300, generator=torch.Generator().manual_seed(seed)
        )

    assert all(torch.equal(a, b) for a, b in zip(run(3), run(3), strict=True))
    assert not torch.equal(run(3)[1], run(4)[1])


# --- unigram floor -------------------------------------------------------------------------------


def test_unigram_floor_by_hand():
    # Vocabulary 8: ids 0-4 special, 5, 6, 7 ordinary (V = 3). Train holds 5 twice and 6 once
    # (N_train = 3), so with add-one p(5) = 3/6, p(6) = 2/6 and the unseen p(7) = 1/6. The validation
    # tokens 5, 6, 7 ([UNK] and [CLS]/[SEP] are not predicted) give -(ln 1/2 + ln 1/3 + ln 1/6) / 3.
    train = np.array([[2, 5, 5, 3], [2, 6, 4, 0]], dtype=np.uint16)
    validation = np.array([[2, 5, 6, 3], [2, 7, 1, 3]], dtype=np.uint16)
    expected = (math.log(2) + math.log(3) + math.log(6)) / 3  # = ln(36) / 3 = 1.1945 nats
    assert unigram_floor(train, validation, SPECIAL_IDS.values(), vocab_size=8) == pytest.approx(expected)


def test_unigram_floor_counts_a_long_array_in_chunks(monkeypatch):
    rng = np.random.default_rng(0)
    train, validation = rng.integers(0, 40, size=(50, 16)), rng.integers(0, 40, size=(7, 16))
    whole = unigram_floor(train, validation, SPECIAL_IDS.values(), vocab_size=40)
    monkeypatch.setattr("trainer.unigram.COUNT_ROWS", 3)
    assert unigram_floor(train, validation, SPECIAL_IDS.values(), vocab_size=40) == whole


def test_prepared_data_carries_its_floor_and_an_old_cache_gains_it(toy_data, toy_data_dir, tmp_path):
    # The floor recomputed here the slow way, from token counts in Python.
    special = set(SPECIAL_IDS.values())
    train_counts = Counter(int(t) for t in np.asarray(toy_data.train).ravel() if t not in special)
    validation_tokens = [int(t) for t in toy_data.validation.ravel() if t not in special]
    total = sum(train_counts.values()) + VOCAB - len(special)
    by_hand = -sum(math.log((train_counts[t] + 1) / total) for t in validation_tokens) / len(validation_tokens)
    floor = toy_data.unigram_floor
    assert floor == toy_data.manifest["unigram_floor"] == pytest.approx(by_hand)
    old = tmp_path / "data" / toy_data.fingerprint
    shutil.copytree(toy_data.tokenizer_path.parent, old)
    shutil.copytree(toy_data.tokenizer_path.parents[2] / "tokenizers", tmp_path / "tokenizers")
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["unigram_floor"]  # as written before the floor existed
    (old / "manifest.json").write_text(json.dumps(manifest))

    again = prepare_data(
        CorpusSource.from_args(data_dir=toy_data_dir), vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path
    )
    assert again.from_cache and again.unigram_floor == pytest.approx(floor)
    assert json.loads((old / "manifest.json").read_text())["unigram_floor"] == pytest.approx(floor)


def test_data_cli_prints_the_floor(toy_data, toy_data_dir, toy_cache, capsys):
    data_cli.main(["--data", str(toy_data_dir), "--vocab-size", str(VOCAB), "--seq-len", "32",
                      "--cache-dir", str(toy_cache)])
    printed = capsys.readouterr().out
    assert f"fingerprint  {toy_data.fingerprint}  (cache hit)" in printed
    assert f"unigram      floor {toy_data.unigram_floor:.4f} nats" in printed


# --- packing -------------------------------------------------------------------------------------


def test_pack_sequences_loses_only_the_tail_and_keeps_order():
    rng = np.random.default_rng(0)
    chunks = [rng.integers(5, 100, size=n) for n in [0, 7, 300, 1, 0, 55, 123, 2, 999]]
    stream = np.concatenate(chunks)
    seq_len, cls_id, sep_id = 16, 2, 3
    rows = np.concatenate(list(pack_sequences(iter(chunks), seq_len, cls_id, sep_id)))

    body = seq_len - 2
    assert rows.shape == (len(stream) // body, seq_len)
    assert (rows[:, 0] == cls_id).all() and (rows[:, -1] == sep_id).all()
    np.testing.assert_array_equal(rows[:, 1:-1].ravel(), stream[: len(rows) * body])
    assert len(stream) - len(rows) * body < body


def test_prepared_rows_are_the_document_stream(toy_data, toy_data_dir):
    texts = pq.read_table(toy_data_dir / "pretrain" / "toy" / "train.parquet").column("text").to_pylist()
    stream = token_stream(toy_data, texts)
    rows = np.asarray(toy_data.train, dtype=np.int64)
    body = toy_data.seq_len - 2

    assert toy_data.train.dtype == np.uint16 and rows.shape[1] == toy_data.seq_len
    assert (rows[:, 0] == toy_data.special_ids["cls"]).all() and (
        rows[:, -1] == toy_data.special_ids["sep"]
    ).all()
    np.testing.assert_array_equal(rows[:, 1:-1].ravel(), stream[: len(rows) * body])
    tail = len(stream) - len(rows) * body
    assert 0 <= tail < body
    assert toy_data.manifest["train"]["dropped_tail_tokens"] == tail
    assert toy_data.manifest["train"]["documents"] == len(texts)


# --- cache ---------------------------------------------------------------------------------------


def test_a_copy_of_the_same_files_is_the_same_data_and_an_edit_is_not(toy_data, toy_data_dir, toy_cache, tmp_path,
                                                                       monkeypatch):
    copy = tmp_path / "elsewhere"
    shutil.copytree(toy_data_dir, copy)  # another path and mtime, the same bytes: a fresh checkout's data
    monkeypatch.setattr(tokenizer_module, "train_wordpiece", lambda *args, **kwargs: pytest.fail("retrained"))
    again = prepare_data(CorpusSource.from_args(data_dir=copy), vocab_size=VOCAB, seq_len=32, cache_dir=toy_cache)
    assert again.from_cache and again.fingerprint == toy_data.fingerprint
    write_parquet(copy / "pretrain" / "toy" / "validation.parquet", toy_documents(40, seed=3))
    assert CorpusSource.from_args(data_dir=copy).identity() != CorpusSource.from_args(data_dir=toy_data_dir).identity()


def test_second_call_is_a_cache_hit_without_any_work(toy_data, toy_data_dir, toy_cache, monkeypatch):
    train_file = toy_data.tokenizer_path.parent / "train.bin"
    tokenizer_files = list((toy_cache / "tokenizers").iterdir())
    before = {path: path.stat().st_mtime_ns for path in [train_file, *tokenizer_files]}

    def must_not_run(*args, **kwargs):
        raise AssertionError("a cache hit must not load, train or tokenise")

    monkeypatch.setattr(corpus_module.datasets, "load_dataset", must_not_run)
    monkeypatch.setattr(tokenizer_module, "train_wordpiece", must_not_run)
    monkeypatch.setattr(packing_module, "pack_sequences", must_not_run)
    again = prepare_data(
        CorpusSource.from_args(data_dir=toy_data_dir), vocab_size=VOCAB, seq_len=32, cache_dir=toy_cache
    )

    assert again.from_cache and not toy_data.from_cache
    assert again.fingerprint == toy_data.fingerprint
    assert {path: path.stat().st_mtime_ns for path in before} == before
    np.testing.assert_array_equal(again.train, toy_data.train)
    np.testing.assert_array_equal(again.validation, toy_data.validation)


def test_seq_len_and_vocab_size_change_the_fingerprint(toy_data, toy_data_dir, toy_cache):
    source = CorpusSource.from_args(data_dir=toy_data_dir)
    shorter = prepare_data(source, vocab_size=VOCAB, seq_len=16, cache_dir=toy_cache)
    smaller = prepare_data(source, vocab_size=VOCAB - 100, seq_len=32, cache_dir=toy_cache)
    assert len({toy_data.fingerprint, shorter.fingerprint, smaller.fingerprint}) == 3
    assert shorter.train.shape[1] == 16 and smaller.tokenizer.get_vocab_size() == VOCAB - 100


def test_cache_root_comes_from_the_environment(toy_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CRAMNAS_CACHE", str(tmp_path / "from-env"))
    data = prepare_data(CorpusSource.from_args(data_dir=toy_data_dir), vocab_size=VOCAB, seq_len=32)
    assert data.tokenizer_path.is_relative_to(tmp_path / "from-env")


def test_interrupted_preparation_leaves_no_valid_looking_cache(toy_data_dir, tmp_path, monkeypatch):
    source = CorpusSource.from_args(data_dir=toy_data_dir)
    real_pack = packing_module.pack_sequences

    def killed_midway(*args, **kwargs):
        yield next(real_pack(*args, **kwargs))
        raise KeyboardInterrupt

    monkeypatch.setattr(packing_module, "pack_sequences", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(source, vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path)
    assert list((tmp_path / "data").iterdir()) == []

    monkeypatch.setattr(packing_module, "pack_sequences", real_pack)
    assert not prepare_data(source, vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path).from_cache


# --- validation set ------------------------------------------------------------------------------


def test_validation_set_is_fixed_capped_and_from_the_validation_split(
    toy_data, toy_data_dir, toy_cache, tmp_path
):
    # Packed anew into an empty data cache, with the same (cached) tokenizer.
    shutil.copytree(toy_cache / "tokenizers", tmp_path / "tokenizers")
    source = CorpusSource.from_args(data_dir=toy_data_dir)
    fresh = prepare_data(source, vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path)
    capped = prepare_data(
        source, vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path, max_validation_sequences=5
    )

    assert not fresh.from_cache and fresh.fingerprint == toy_data.fingerprint
    np.testing.assert_array_equal(fresh.validation, toy_data.validation)
    np.testing.assert_array_equal(capped.validation, toy_data.validation[:5])
    texts = pq.read_table(toy_data_dir / "pretrain" / "toy" / "validation.parquet").column("text").to_pylist()
    stream = token_stream(toy_data, texts)
    body = toy_data.seq_len - 2
    np.testing.assert_array_equal(
        toy_data.validation[:, 1:-1].ravel(), stream[: len(toy_data.validation) * body]
    )
    assert toy_data.manifest["validation"]["origin"] == "validation split"


def test_without_a_validation_split_the_last_documents_are_held_out(tmp_path):
    texts = toy_documents(250, seed=3)
    write_parquet(tmp_path / "corpus" / "train.parquet", texts)
    data = prepare_data(
        CorpusSource.from_args(data_dir=tmp_path / "corpus"), vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path
    )

    held_out = 3  # ceil(1% of 250)
    assert data.manifest["train"]["documents"] == 250 - held_out
    assert data.manifest["validation"]["documents"] == held_out
    body = data.seq_len - 2
    np.testing.assert_array_equal(
        np.asarray(data.train)[:, 1:-1].ravel()[:100], token_stream(data, texts[:-held_out])[:100]
    )
    np.testing.assert_array_equal(
        data.validation[:, 1:-1].ravel(), token_stream(data, texts[-held_out:])[: len(data.validation) * body]
    )
    train_rows = {row.tobytes() for row in np.asarray(data.train)}
    assert not any(row.tobytes() in train_rows for row in data.validation)


# --- batches -------------------------------------------------------------------------------------


def test_batches_are_seeded_and_cover_every_row_each_epoch(toy_data):
    rows = np.repeat(np.arange(10, dtype=np.uint16)[:, None], 8, axis=1)
    data = PretrainData(**{**vars(toy_data), "train": rows})

    first = [batch[:, 0].tolist() for batch in islice(data.batches(4, seed=7), 5)]
    again = [batch[:, 0].tolist() for batch in islice(data.batches(4, seed=7), 5)]
    other = [batch[:, 0].tolist() for batch in islice(data.batches(4, seed=8), 5)]
    drawn = sum(first, [])
    assert first == again and first != other
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:20]) == list(range(10))
    batch = next(data.batches(4))
    assert batch.dtype == torch.long and batch.shape == (4, 8)
    assert sum(len(b) for b in toy_data.validation_batches(7)) == len(toy_data.validation)


# --- tokenizer and normalisation -----------------------------------------------------------------


def test_cramming_normalisation_lowercases_strips_accents_and_drops_non_ascii():
    normalizer = build_normalizer("cramming")
    assert (
        normalizer.normalize_str("Héllo WÖRLD, Ça va? naïve ﬁne 日本 Ελλάδα x")
        == "hello world, ca va? naive fine   x"
    )
    assert build_normalizer("none") is None


def test_prepared_tokenizer_normalises_and_has_the_special_ids(toy_data):
    assert toy_data.special_ids == SPECIAL_IDS
    assert toy_data.tokenizer.get_vocab_size() == VOCAB == toy_data.vocab_size
    ids = toy_data.tokenizer.encode("Kálo MÏNE 東京", add_special_tokens=False).ids
    assert toy_data.tokenizer.decode(ids) == "kalo mine"


def test_small_corpus_vocabulary_is_padded_to_the_requested_size(toy_data_dir, tmp_path):
    data = prepare_data(
        CorpusSource.from_args(data_dir=toy_data_dir), vocab_size=5000, seq_len=32, cache_dir=tmp_path
    )
    assert data.tokenizer.get_vocab_size() == 5000
    assert data.tokenizer.id_to_token(4999).startswith("[unused")


def test_tokenizer_file_is_used_as_given(toy_data, toy_data_dir, tmp_path):
    data = prepare_data(
        CorpusSource.from_args(data_dir=toy_data_dir),
        vocab_size=VOCAB,
        seq_len=32,
        cache_dir=tmp_path,
        tokenizer_file=toy_data.tokenizer_path,
    )
    assert data.manifest["normalization"] == "from tokenizer file"
    np.testing.assert_array_equal(data.train, toy_data.train)


# --- other sources -------------------------------------------------------------------------------


def test_txt_source_has_one_document_per_blank_line_separated_block(tmp_path):
    documents = toy_documents(120, seed=4)
    # Each document spread over two lines: only the blank line separates documents.
    (tmp_path / "corpus.txt").write_text("\n\n".join(doc.replace(". ", ".\n", 1) for doc in documents) + "\n")
    data = prepare_data(
        CorpusSource.from_args(data_dir=tmp_path / "corpus.txt"),
        vocab_size=VOCAB,
        seq_len=32,
        cache_dir=tmp_path,
    )
    assert data.manifest["train"]["documents"] + data.manifest["validation"]["documents"] == 120
    assert data.manifest["validation"]["origin"].startswith("last 2 of 120")


def test_jsonl_directory_source_with_validation_file(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, documents in [
        ("train.jsonl", toy_documents(100, 5)),
        ("validation.jsonl", toy_documents(10, 6)),
        ("test.jsonl", ["never used"]),
    ]:
        (corpus / name).write_text(
            "".join(json.dumps({"text": doc, "id": i}) + "\n" for i, doc in enumerate(documents))
        )
    source = CorpusSource.from_args(data_dir=corpus)
    assert [file.name for file in source.train_files] == ["train.jsonl"]
    data = prepare_data(source, vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path)
    assert data.manifest["train"]["documents"] == 100
    validation = data.manifest["validation"]
    assert validation["origin"] == "validation split" and validation["documents"] == 10


def test_text_column_can_be_chosen(tmp_path):
    write_parquet(tmp_path / "c" / "train.parquet", toy_documents(100, 7), column="body")
    source = CorpusSource.from_args(data_dir=tmp_path / "c", text_column="body")
    data = prepare_data(source, vocab_size=VOCAB, seq_len=32, cache_dir=tmp_path)
    assert data.manifest["train"]["documents"] == 99  # one of the 100 held out for validation


def test_default_source_is_wikitext_103_from_the_hub():
    source = CorpusSource.from_args()
    assert source.description == "hub dataset Salesforce/wikitext (wikitext-103-raw-v1)"
    assert source.text_column == "text"


@pytest.mark.slow
@pytest.mark.subprocess
def test_hub_source_offline_fails_with_one_line(tmp_path, monkeypatch):
    # The hub libraries read these flags when imported, hence a fresh interpreter. With them the
    # load fails at once instead of retrying (docs/stack.md); how fast is not asserted here.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    command = [sys.executable, "-m", "trainer.data", "--corpus", "Salesforce/wikitext"]
    command += ["--corpus-config", "wikitext-103-raw-v1", "--cache-dir", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: cannot load hub dataset Salesforce/wikitext (wikitext-103-raw-v1)")
    assert "HF_HUB_OFFLINE" in last_line


# --- bad input -----------------------------------------------------------------------------------


def bad_tokenizer_file(tmp_path: Path) -> Path:
    (tmp_path / "broken.json").write_text("{not json")
    return tmp_path / "broken.json"


@pytest.mark.parametrize(
    "problem, call, expected",
    [
        ("missing dir", lambda d, t: CorpusSource.from_args(data_dir=t / "nope"), "does not exist"),
        ("no corpus", lambda d, t: CorpusSource.from_args(data_dir=t), "no recognisable corpus"),
        ("unknown name", lambda d, t: CorpusSource.from_args(data_dir=d, name="books"), "available: toy"),
        ("both sources", lambda d, t: CorpusSource.from_args(data_dir=d, corpus="x/y"), "not both"),
        (
            "normalisation",
            lambda d, t: prepare_data(CorpusSource.from_args(data_dir=d), normalization="nfc", cache_dir=t),
            "normalization='nfc'",
        ),
        (
            "vocab",
            lambda d, t: prepare_data(CorpusSource.from_args(data_dir=d), vocab_size=5, cache_dir=t),
            "vocab_size=5",
        ),
        (
            "seq_len",
            lambda d, t: prepare_data(CorpusSource.from_args(data_dir=d), seq_len=7, cache_dir=t),
            "seq_len=7",
        ),
        (
            "text column",
            lambda d, t: prepare_data(CorpusSource.from_args(data_dir=d, text_column="body"), cache_dir=t),
            "columns: text, id",
        ),
        (
            "tokenizer file",
            lambda d, t: prepare_data(
                CorpusSource.from_args(data_dir=d), tokenizer_file=bad_tokenizer_file(t), cache_dir=t
            ),
            "cannot read tokenizer file",
        ),
        (
            "alphabet",
            lambda d, t: prepare_data(CorpusSource.from_args(data_dir=d), vocab_size=20, cache_dir=t),
            "vocab_size >= ",
        ),
    ],
)
def test_bad_input_gives_one_clear_line(problem, call, expected, toy_data_dir, tmp_path):
    with pytest.raises(DataError) as error:
        call(toy_data_dir, tmp_path)
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


def test_several_corpora_need_a_name(toy_data_dir, tmp_path):
    for name in ("books", "news"):
        write_parquet(tmp_path / "pretrain" / name / "train.parquet", ["text"])
    with pytest.raises(DataError, match=r"several corpora \(books, news\); choose one with name="):
        CorpusSource.from_args(data_dir=tmp_path)
    assert CorpusSource.from_args(data_dir=tmp_path, name="news").train_files[0].parent.name == "news"


def test_empty_corpus_is_rejected(tmp_path):
    write_parquet(tmp_path / "blank" / "train.parquet", ["", "  \n ", ""])
    with pytest.raises(DataError, match="has no text: all 3 train rows are empty"):
        prepare_data(CorpusSource.from_args(data_dir=tmp_path / "blank"), cache_dir=tmp_path)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="has no text: its train files are empty"):
        CorpusSource.from_args(data_dir=tmp_path / "empty.txt")


def test_tokenizer_file_with_another_vocab_size_is_rejected(toy_data, toy_data_dir, tmp_path):
    with pytest.raises(DataError, match=f"has {VOCAB} tokens, not vocab_size=1000; pass vocab_size={VOCAB}"):
        prepare_data(
            CorpusSource.from_args(data_dir=toy_data_dir),
            vocab_size=1000,
            tokenizer_file=toy_data.tokenizer_path,
            cache_dir=tmp_path,
        )


# --- the real corpus -----------------------------------------------------------------------------


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
@pytest.mark.slow
def test_shared_wikipedia_layout_and_first_articles(tmp_path):
    source = CorpusSource.from_args(data_dir=SHARED_DATA)
    assert [file.name for file in source.train_files] == ["train.parquet"]
    assert [file.name for file in source.validation_files] == ["validation.parquet"]
    assert source.train_files[0].parent.name == "wikipedia_en_2015"

    wiki = SHARED_DATA / "pretrain" / "wikipedia_en_2015"
    write_parquet(
        tmp_path / "wiki" / "train.parquet",
        pq.read_table(wiki / "train.parquet").column("text").to_pylist()[:200],
    )
    write_parquet(
        tmp_path / "wiki" / "validation.parquet",
        pq.read_table(wiki / "validation.parquet").column("text").to_pylist()[:20],
    )
    data = prepare_data(
        CorpusSource.from_args(data_dir=tmp_path / "wiki"), vocab_size=4096, cache_dir=tmp_path
    )
    assert data.train.shape[0] > 5000 and data.train.shape[1] == 128
    assert 0 < len(data.validation) <= 512 and data.manifest["validation"]["origin"] == "validation split"
    assert data.manifest["train"]["documents"] == 200
    text = data.tokenizer.decode(data.train[0, 1:-1].tolist())
    assert text.isascii() and text == text.lower()
