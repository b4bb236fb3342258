"""Where a study's two stores live, and the checks that they can be used: MLflow (what people look
at) and the Optuna study (the controller's memory). The study sits beside a SQLite MLflow store,
so one directory holds a whole search; with a remote MLflow server it defaults to `optuna.db` in
the working directory. Trial checkpoints (`search.run --save-checkpoints`) go to
`checkpoints/<study>/` in that same place."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mlflow import MlflowClient

from search.tracking.retry import Retry, TrackingError, first_line
from space.errors import UsageError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def resolve_uri(uri: str | None = None) -> str:
    """The tracking URI to use: `uri`, else `MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db`.

    A relative SQLite path is made absolute, because Ray Tune runs trial functions in their own
    working directories, where it would silently open a second, empty database.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    path = sqlite_path(uri)
    return f"sqlite:///{path.resolve()}" if path is not None else uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (query string dropped); None for other stores."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


def existing_store(uri: str | None = None) -> str:
    """The resolved URI of a store that readers (search.confirm, search.export, search.audit) need
    to exist already: opening a missing SQLite file would create an empty store, so that is a
    one-line TrackingError instead."""
    uri = resolve_uri(uri)
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise TrackingError(f"--tracking-uri: no MLflow store at {path}; pass the --tracking-uri the search used")
    return uri


def check_store(uri: str | None = None) -> str:
    """Open (creating if needed) the tracking store and check it can be written; return its URI.

    The search calls this before any trial, so that a wrong `--tracking-uri` fails in a second with
    one line instead of after the first trial's training. A SQLite file is checked on disk first:
    MLflow reports a read-only or misplaced database as a retryable database error.
    """
    uri = resolve_uri(uri)
    fix = "pass --tracking-uri (or set MLFLOW_TRACKING_URI) to a writable store"
    path = sqlite_path(uri)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrackingError(f"MLflow store {uri}: cannot create {path.parent} "
                                f"({error.strerror}); {fix}") from None
        target = path if path.exists() else path.parent
        if not os.access(target, os.W_OK):
            raise TrackingError(f"MLflow store {uri}: {target} is not writable; {fix}")

    def open_store() -> None:
        # Opening a SQLite store creates or migrates its schema: the write that proves it usable.
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)

    try:
        Retry()(f"opening MLflow store {uri}", open_store)
    except TrackingError as error:
        raise TrackingError(f"{error}; {fix}") from None
    except Exception as error:  # noqa: BLE001 - a file that is not a database, a bad URI scheme, ...
        raise TrackingError(f"MLflow store {uri} is not usable: {first_line(error)}; {fix}") from None
    return uri





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
    study not in it is a one-line UsageError ending in `fix`."""
    import optuna

    storage = study_storage(tracking_uri, storage)
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        raise UsageError(f"--study: no study store at {storage} (opening it would create an empty one); {fix}")
    try:
        names = optuna.study.get_all_study_names(storage)
    except Exception as error:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL, driver or file
        raise UsageError(f"--storage: cannot open {storage} ({first_line(error)}); {fix}") from None
    if study_name not in names:
        raise UsageError(f"--study: no study {study_name!r} in {storage}; {fix}")
    return storage


def checkpoint_dir(tracking_uri: str | None, study: str) -> Path:
    """Where a study's trials write their checkpoints (`t0007/` each): `checkpoints/<study>` beside a
    SQLite MLflow store, else in the working directory; absolute, since Ray workers run elsewhere."""
    database = sqlite_path(resolve_uri(tracking_uri))
    base = database.parent if database is not None else Path.cwd()
    return (base / "checkpoints" / re.sub(r"[^A-Za-z0-9._-]+", "_", study)).resolve()
