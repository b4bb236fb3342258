"""Writing to a tracking store that may be away for a while: `Retry` rides out transient failures
with backoff, `PendingWrites` holds writes in order while the store stays down, so that a tracking
server that restarts costs neither the study nor a record.

Errors: `TrackingError` is a store that cannot be used (its one-line message names the URI and the
fix); `TrackingUnavailable` is one that kept failing transiently until the retry deadline.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests
from mlflow.exceptions import MlflowException

from space.errors import CramnasError


class TrackingError(CramnasError):
    """The tracking store cannot be used; the one-line message names the URI and the fix."""


class TrackingUnavailable(TrackingError):
    """The store kept failing transiently (down, restarting, locked) until the retry deadline:
    the write may succeed later, unlike the permanent errors TrackingError stands for."""



# Error codes of failures that may pass: server down or restarting (connection errors reach us as
# MlflowException with MLflow's default code INTERNAL_ERROR), rate limits, and SQLite's "database
# is locked" when several trials write at once (MLflow maps it to TEMPORARILY_UNAVAILABLE).
TRANSIENT_CODES = frozenset({"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED",
                             "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "SERVICE_UNDER_MAINTENANCE",
                             "ABORTED", "IO_ERROR"})


def is_transient(error: BaseException) -> bool:
    if isinstance(error, MlflowException):
        return error.error_code in TRANSIENT_CODES
    return isinstance(error, (ConnectionError, TimeoutError, requests.ConnectionError, requests.Timeout))


@dataclass
class Retry:
    """Call a function, retrying transient failures with exponential backoff for `timeout_s`.

    A permanent MLflow error (invalid parameter, changed param value, ...) raises `TrackingError` at
    once; a transient one is retried until the deadline, then raises `TrackingUnavailable`; any
    other exception is a bug and propagates untouched. Over HTTP each failing call may itself take
    a while: MLflow retries connections internally (`MLFLOW_HTTP_REQUEST_MAX_RETRIES`, 7 tries with
    backoff up to 2 minutes, by default), which `search.run` turns off so that this deadline holds.
    """

    timeout_s: float = 60.0
    first_delay_s: float = 0.5
    max_delay_s: float = 8.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def __call__(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = self.clock()
        delay, tries = self.first_delay_s, 0
        while True:
            tries += 1
            try:
                return fn(*args, **kwargs)
            except Exception as error:
                if not is_transient(error):
                    if isinstance(error, MlflowException):
                        raise TrackingError(f"{what}: {first_line(error)}") from error
                    raise
                remaining = start + self.timeout_s - self.clock()
                if remaining <= 0:
                    raise TrackingUnavailable(
                        f"{what}: still failing after {tries} tries over {self.clock() - start:.0f} s "
                        f"({first_line(error)}); check that the tracking store is up and reachable"
                    ) from error
                self.sleep(min(delay, remaining))
                delay = min(2 * delay, self.max_delay_s)


class PendingWrites:
    """Tracking writes in order, holding back those the store cannot take now.

    A study must neither die nor stall while its tracking server restarts: the driver's writes run
    inside Ray Tune's event loop, and a worker waits at each report until the loop takes it, so a
    write blocked on a dead server pauses every trial. A write that fails with
    `TrackingUnavailable` (its `Retry` gave up) is queued, and so is everything after it, since
    order matters (a run is created before its metrics and closed last). Later writes replay the
    queue once `reachable()` says the store answers again, checking at most every `every_s`
    seconds; `drain` waits for the rest at the end of the study. Every write must be safe to
    repeat: one that "failed" may have reached the store before its reply was lost
    (`StudyTracker` finds runs by tag before creating them and fixes metric timestamps).
    """

    def __init__(self, reachable: Callable[[], bool], every_s: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = print) -> None:
        self.reachable, self.every_s, self.sleep, self.clock, self.say = reachable, every_s, sleep, clock, say
        self.queue: deque[tuple[str, Callable[[], Any]]] = deque()
        self.held_since: float | None = None  # when the first held write failed
        self.checked = float("-inf")  # when reachability was last checked
        self.error = ""

    def submit(self, what: str, write: Callable[[], Any]) -> None:
        """Write now, or queue behind the writes already held."""
        self.queue.append((what, write))
        self.flush()

    def flush(self) -> bool:
        """Replay held writes if the store answers (checked at most every `every_s`); True when none are left."""
        if self.held_since is not None:
            if self.clock() - self.checked < self.every_s:
                return False
            self.checked = self.clock()
            if not self.reachable():
                return False
        while self.queue:
            _, write = self.queue[0]
            try:
                write()
            except TrackingUnavailable as error:
                if self.held_since is None:
                    self.held_since = self.checked = self.clock()
                    self.say(f"MLflow unreachable: holding its records and carrying on ({first_line(error)})")
                self.error = first_line(error)
                return False
            except Exception:
                self.queue.popleft()  # a permanent error is a bug, not an outage: never replay it
                raise
            self.queue.popleft()
        if self.held_since is not None:
            self.say(f"MLflow reachable again after {self.clock() - self.held_since:.0f} s: held records written")
            self.held_since = None
        return True

    def drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the held writes to go through; TrackingUnavailable if they cannot."""
        deadline = self.clock() + timeout_s
        while not self.flush():
            if self.clock() >= deadline:
                raise TrackingUnavailable(f"{len(self.queue)} records (first: {self.queue[0][0]}) still not "
                                          f"written after waiting {timeout_s:.0f} s ({self.error})")
            self.sleep(min(self.every_s, max(deadline - self.clock(), 0.0)))


def first_line(error: BaseException, limit: int = 300) -> str:
    """One line of an error: MLflow's messages can carry SQL statements or a response body."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


