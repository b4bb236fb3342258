"""Shared fixtures: Ray kept on loopback, the real data beside the checkout, a small prepared slice
of it and its token cache. Plain helpers (paths, a free port, a subprocess environment, a fake clock)
are in tests/helpers.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import SHARED_DATA, SLICE_TRAIN_ARTICLES, SLICE_VALIDATION_ARTICLES, WIKI, prepare_slice


@pytest.fixture(autouse=True)
def loopback_ray(monkeypatch):
    """Every Ray a test starts, in process or in a child, binds 127.0.0.1 whatever the caller's
    environment says (search.run only sets this when it is unset)."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


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
def slice_cache(wiki_slice_dir, tmp_path_factory) -> Path:
    """A token cache holding the slice as the tiny space wants it (vocab 2048, sequences of 64): pass
    it as --cache-dir and a study, CLI run or confirmation reads it instead of preparing the slice
    again (about 4 s each)."""
    cache = tmp_path_factory.mktemp("slice-cache")
    prepare_slice(wiki_slice_dir, cache)
    return cache


@pytest.fixture(scope="session")
def wiki_slice(wiki_slice_dir, slice_cache):
    """The slice prepared for training: vocab 2048, sequences of 64 (read from `slice_cache`)."""
    return prepare_slice(wiki_slice_dir, slice_cache)
