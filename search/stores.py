"""Where a study's two stores live: MLflow (what people look at) and the Optuna study (the
controller's memory). The study sits beside a SQLite MLflow store, so one directory holds a whole
search; with a remote MLflow server it defaults to `optuna.db` in the working directory. Trial
checkpoints (`search.run --save-checkpoints`) go to `checkpoints/<study>/` in that same place."""

from __future__ import annotations

import os
import re
from pathlib import Path

from search.tracking import first_line, resolve_uri, sqlite_path


def study_storage(tracking_uri: str | None, storage: str | None = None) -> str:
    """The Optuna storage URL for a tracking URI (an explicit `storage` wins)."""
    if storage:
        return storage
    if os.environ.get("CRAMNAS_STUDY_STORAGE"):
        return os.environ["CRAMNAS_STUDY_STORAGE"]
    database = sqlite_path(resolve_uri(tracking_uri))
    return f"sqlite:///{database.with_name('optuna.db')}" if database is not None else "sqlite:///optuna.db"


def existing_study(study_name: str, tracking_uri: str | None, storage: str | None, fix: str) -> str:
    """The Optuna storage URL holding `study_name`, for readers (search.export, search.audit): a
    missing SQLite file (opening it would create an empty one), a store that cannot be opened or a
    study not in it is a one-line ValueError ending in `fix`."""
    import optuna

    storage = study_storage(tracking_uri, storage)
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        raise ValueError(f"--study: no study store at {storage} (opening it would create an empty one); {fix}")
    try:
        names = optuna.study.get_all_study_names(storage)
    except Exception as error:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL, driver or file
        raise ValueError(f"--storage: cannot open {storage} ({first_line(error)}); {fix}") from None
    if study_name not in names:
        raise ValueError(f"--study: no study {study_name!r} in {storage}; {fix}")
    return storage


def checkpoint_dir(tracking_uri: str | None, study: str) -> Path:
    """Where a study's trials write their checkpoints (`t0007/` each): `checkpoints/<study>` beside a
    SQLite MLflow store, else in the working directory; absolute, since Ray workers run elsewhere."""
    database = sqlite_path(resolve_uri(tracking_uri))
    base = database.parent if database is not None else Path.cwd()
    return (base / "checkpoints" / re.sub(r"[^A-Za-z0-9._-]+", "_", study)).resolve()
