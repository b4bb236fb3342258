"""The on-disk cache of prepared pretraining data: where it lives, how entries are named, how
processes take turns writing one (how a file is written whole: `trainer.atomic`).

    <cache>/tokenizers/<key>.json         trained tokenizers (`trainer.tokenizer`)
    <cache>/data/<fingerprint>/           packed sequences and their manifest (`trainer.data`)
    <cache>/data/.<fingerprint>.lock      held while a Ray node writes the entry the driver shipped
    <cache>/hf-datasets/                  the `datasets` Arrow copy of loaded corpora (`trainer.corpus`)

The cache root is `cache_dir`, else $CRAMNAS_CACHE, else ~/.cache/cramnas. Every entry is named
by a digest of what it depends on, so a changed input never meets a stale entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

# Part of every fingerprint: bump it when the cache layout or the packing changes.
FORMAT_VERSION = 1


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $CRAMNAS_CACHE, else ~/.cache/cramnas."""
    return Path(
        cache_dir or os.environ.get("CRAMNAS_CACHE") or Path.home() / ".cache" / "cramnas"
    ).expanduser()


def digest(identity: dict) -> str:
    """The name of a cache entry: a short hash of everything it depends on."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block: processes of one machine
    that would all write the same entry take turns, and the later ones find it written."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        yield
