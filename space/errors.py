"""The one base class of every cramnas user error.

A `CramnasError` is a mistake in what the user asked for (a flag, a budget, a space file, a missing
data directory, an unknown study): every CLI prints it as one `error:` line and exits with code 2.
Anything else, a `ValueError` from a tokenisation bug included, is a bug and keeps its traceback:
the CLI mains catch this base (and the named Optuna/MLflow errors), never plain `ValueError`.

It lives in `space/` because every other package imports `space`; it subclasses `ValueError` so
that callers that validate values may keep catching that.
"""

from __future__ import annotations


class CramnasError(ValueError):
    """A user error: printed as one line naming the field and the fix, exit code 2."""


class UsageError(CramnasError):
    """A user error found by a CLI before any trial or training (bad flags, stores, profiles)."""
