"""Where a study's two stores live: MLflow (what people look at) and the Optuna study (the
controller's memory). The study sits beside a SQLite MLflow store, so one directory holds a whole
search; with a remote MLflow server it defaults to `optuna.db` in the working directory. Trial
checkpoints (`search.run --save-checkpoints`) go to `checkpoints/<study>/` in that same place."""

from __future__ import annotations

import os
import re
from pathlib import Path

from search.tracking import resolve_uri


def study_storage(tracking_uri: str | None, storage: str | None = None) -> str:
    """The Optuna storage URL for a tracking URI (an explicit `storage` wins)."""
    if storage:
        return storage
    if os.environ.get("CRAMNAS_STUDY_STORAGE"):
        return os.environ["CRAMNAS_STUDY_STORAGE"]
    uri = resolve_uri(tracking_uri)
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).with_name('optuna.db')}"
    return "sqlite:///optuna.db"


def checkpoint_dir(tracking_uri: str | None, study: str) -> Path:
    """Where a study's trials write their checkpoints (`t0007/` each): `checkpoints/<study>` beside a
    SQLite MLflow store, else in the working directory; absolute, since Ray workers run elsewhere."""
    uri = resolve_uri(tracking_uri)
    base = Path(uri[len("sqlite:///"):].split("?", 1)[0]).parent if uri.startswith("sqlite:///") else Path.cwd()
    return (base / "checkpoints" / re.sub(r"[^A-Za-z0-9._-]+", "_", study)).resolve()
