"""Shared fixtures: the real data beside the checkout, and a small prepared slice of it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIKI = SHARED_DATA / "pretrain" / "wikipedia_en_2015"

requires_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}")

# A slice of the shared Wikipedia small enough to prepare in seconds: real text, tiny vocabulary.
SLICE_TRAIN_ARTICLES, SLICE_VALIDATION_ARTICLES = 400, 40
SLICE_VOCAB, SLICE_SEQ = 2048, 64


@pytest.fixture(scope="session")
def wiki_slice_dir(tmp_path_factory) -> Path:
    """DATA/pretrain/wiki_slice/{train,validation}.parquet holding the first articles of each split."""
    if not WIKI.is_dir():
        pytest.skip(f"no shared data at {SHARED_DATA}")
    root = tmp_path_factory.mktemp("data")
    corpus = root / "pretrain" / "wiki_slice"
    corpus.mkdir(parents=True)
    for split, rows in (("train", SLICE_TRAIN_ARTICLES), ("validation", SLICE_VALIDATION_ARTICLES)):
        frame = pd.read_parquet(WIKI / f"{split}.parquet", columns=["text"]).head(rows)
        frame.to_parquet(corpus / f"{split}.parquet")
    (root / "glue").symlink_to(SHARED_DATA / "glue")  # one DATA dir for pretraining and the GLUE probe
    return root


@pytest.fixture(scope="session")
def wiki_slice(wiki_slice_dir, tmp_path_factory):
    """The slice prepared for training: vocab 2048, sequences of 64 tokens."""
    from trainer.data import CorpusSource, prepare_data

    return prepare_data(CorpusSource.from_args(data_dir=str(wiki_slice_dir)), vocab_size=SLICE_VOCAB,
                        seq_len=SLICE_SEQ, cache_dir=tmp_path_factory.mktemp("cache"))
