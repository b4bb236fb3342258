"""Shared fixtures and helpers: the real data beside the checkout, a small prepared slice of it and
its token cache, Ray kept on loopback, and what tests that start processes or servers need (a free
port, a subprocess environment, a fake clock)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
WIKI = SHARED_DATA / "pretrain" / "wikipedia_en_2015"

requires_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}")

# A slice of the shared Wikipedia small enough to prepare in seconds: real text, tiny vocabulary.
SLICE_TRAIN_ARTICLES, SLICE_VALIDATION_ARTICLES = 400, 40
SLICE_VOCAB, SLICE_SEQ = 2048, 64


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


def _prepare_slice(data_dir: Path, cache: Path):
    from trainer.data import CorpusSource, prepare_data

    return prepare_data(CorpusSource.from_args(data_dir=str(data_dir)), vocab_size=SLICE_VOCAB, seq_len=SLICE_SEQ,
                        cache_dir=cache)


@pytest.fixture(scope="session")
def slice_cache(wiki_slice_dir, tmp_path_factory) -> Path:
    """A token cache holding the slice as the tiny space wants it (vocab 2048, sequences of 64): pass
    it as --cache-dir and a study, CLI run or confirmation reads it instead of preparing the slice
    again (about 4 s each)."""
    cache = tmp_path_factory.mktemp("slice-cache")
    _prepare_slice(wiki_slice_dir, cache)
    return cache


@pytest.fixture(scope="session")
def wiki_slice(wiki_slice_dir, slice_cache):
    """The slice prepared for training: vocab 2048, sequences of 64 (read from `slice_cache`)."""
    return _prepare_slice(wiki_slice_dir, slice_cache)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a cramnas command (or `ray start`) run in a subprocess: this checkout
    importable, the hub offline, Ray on loopback without auth, and no store or fault setting of the
    caller's environment leaking in; `extra` adds or overrides variables."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("MLFLOW_TRACKING_URI", "CRAMNAS_STUDY_STORAGE", "CRAMNAS_INJECT_FAULT")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_AUTH_MODE="disabled", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


class FakeTime:
    """A clock and a sleep for code that takes them as arguments: sleeping advances the clock at once."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def tiny_checkpoint(root: Path, extra_vocab: int = 0) -> Path:
    """A real checkpoint (`trainer.checkpoint.save_checkpoint`, as trainer.cram writes it) of a
    1-layer model in root/checkpoint, with a WordPiece tokenizer of 96 tokens; `extra_vocab` gives
    the model that many more tokens than its tokenizer."""
    from space.arch import ArchConfig
    from trainer.checkpoint import save_checkpoint
    from trainer.config import TrainConfig
    from trainer.model import CrammedBert
    from trainer.tokenizer import train_wordpiece

    tokenizer = train_wordpiece(["a small cat sleeps on the warm mat and dreams of fish, milk and quiet afternoons"] * 20,
                                vocab_size=96, normalization="cramming")
    tokenizer.save(str(root / "tokenizer.json"))
    arch = ArchConfig(layers=1, hidden=32, heads=2, vocab_size=tokenizer.get_vocab_size() + extra_vocab, max_seq_len=64)
    return save_checkpoint(root / "checkpoint", CrammedBert(arch), arch, TrainConfig(), root / "tokenizer.json", {})
