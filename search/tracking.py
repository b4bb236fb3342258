"""MLflow conventions for cramnas studies: one experiment per study, one run per trial.

Layout (DESIGN.md, "Tracking"):
- experiment = study (same name); artifacts of a SQLite store go beside the database file;
- one *study run* (run name = study name, tag `cramnas.kind=study`): controller, objective, space,
  budget and code version as tags and params, the study's training settings as `train.*` params;
- one *trial run* per trial number, nested under the study run (`mlflow.parentRunId`), named
  `t0007-<fingerprint>`, tagged `cramnas.kind=trial` and `cramnas.trial=7`. Params `arch.<field>`,
  `train.<field>` and `budget`; lineage tags `cramnas.parent_trial` / `cramnas.parent_run_id`;
  metrics `train_loss`, `tokens_per_s`, ... over tokens seen, final `validation_loss`,
  `glue.<task>.<metric>`, `probe_average`; artifacts `arch.yaml` and `result.json`.

Every run is found again by its tags, never remembered in memory, so a driver that crashes and
resumes reuses the study run and each trial's run instead of creating second ones. All calls go
through `MlflowClient` with explicit run ids (trials log from Ray workers, where MLflow's global
active-run state would be wrong) and through `Retry`; the study driver also holds back writes
that `Retry` gives up on (`PendingWrites`), so a tracking server that restarts costs neither the
study nor a record. The tag `cramnas.checkpoint` holds the path of a trial's checkpoint when the
study saves them (`search.run --save-checkpoints`).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import requests
import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException

from space.arch import ArchConfig

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
TAG = "cramnas."  # prefix of every tag cramnas sets (besides MLflow's own `mlflow.parentRunId`)
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
# `cramnas.status` when finish_trial's tags do not say (a repeat, for one, must be said).
TRIAL_STATUS = {"FINISHED": "complete", "KILLED": "pruned", "FAILED": "failed"}


class TrackingError(ValueError):
    """The tracking store cannot be used; the one-line message names the URI and the fix."""


class TrackingUnavailable(TrackingError):
    """The store kept failing transiently (down, restarting, locked) until the retry deadline:
    the write may succeed later, unlike the permanent errors TrackingError stands for."""


# ---- tracking URI and store check ---------------------------------------------------------------

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


# ---- retries ----------------------------------------------------------------------------------

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


# ---- naming -------------------------------------------------------------------------------------

def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"train": {"lr": 1e-3}}` -> `{"train.lr": 1e-3}`: the dotted names MLflow's compare view shows."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def trial_params(arch: Mapping[str, Any], train: Mapping[str, Any], budget: Any = None) -> dict[str, str]:
    """Params of a trial run: `arch.<field>`, `train.<field>` and `budget`, as MLflow strings."""
    params = {**flatten(arch, "arch."), **flatten(train, "train.")}
    if budget is not None:
        params["budget"] = budget
    return {name: str(value) for name, value in params.items()}


def _tag_name(key: str) -> str:
    """Short keys become `cramnas.<key>`; a key that already names its namespace is kept."""
    return key if "." in key else TAG + key


def _tags(tags: Mapping[str, Any]) -> dict[str, str]:
    # None means "not applicable" (no parent, no mutation): MLflow has no null tag, so leave it out.
    return {_tag_name(key): str(value) for key, value in tags.items() if value is not None}


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    flat = flatten(metrics)
    for name, value in flat.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metric {name}: expected a number, got {value!r}")
    return {name: float(value) for name, value in flat.items()}


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---- the study ----------------------------------------------------------------------------------

class StudyTracker:
    """The MLflow side of one study. Cheap to build and picklable, so each Ray worker can hold one.

    Only the driver calls `start_study`, `mark_stale_runs_killed` and `finish_study`; workers find
    the study run by its tag.
    """

    trial_tag = TAG + "trial"  # the tag holding a trial run's trial number

    def __init__(self, uri: str | None, study_name: str, *, artifact_root: str | None = None,
                 retry: Retry | None = None) -> None:
        self.uri = resolve_uri(uri)
        self.study_name = study_name
        # MLflow puts a SQLite store's artifacts under the *working directory's* ./mlruns; keep them
        # beside the database instead, so that a study is one folder wherever the driver ran.
        sqlite = sqlite_path(self.uri)
        if artifact_root is None and sqlite is not None:
            artifact_root = str(sqlite.parent / "mlruns")
        self.artifact_root = artifact_root
        self.retry = retry or Retry()
        self._client: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._study_run: Run | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The client holds a database engine, which does not pickle; a worker opens its own.
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.retry(f"{what} (study {self.study_name!r}, MLflow at {self.uri})", fn, *args, **kwargs)

    def reachable(self) -> bool:
        """One untried call to the store: is it answering now? (`PendingWrites` asks before replaying.)"""
        try:
            self.client.search_experiments(max_results=1)
        except Exception as error:  # transient ones mean "not now"; others are bugs
            if is_transient(error):
                return False
            raise
        return True

    def _log_batch(self, what: str, run_id: str, metrics: Sequence[Metric] = (),
                   params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None) -> None:
        # Entities are built once, outside the retried call, so that a retry after a half-applied
        # batch re-sends identical metrics (same timestamps), which MLflow de-duplicates.
        self._call(what, self.client.log_batch, run_id, metrics=list(metrics),
                   params=[Param(k, v) for k, v in (params or {}).items()],
                   tags=[RunTag(k, v) for k, v in (tags or {}).items()], synchronous=True)

    # ---- experiment and study run ----

    def experiment_id(self, create: bool = False) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._call("finding the experiment", self._find_experiment, create)
        return self._experiment_id

    def _find_experiment(self, create: bool) -> str:
        experiment = self.client.get_experiment_by_name(self.study_name)
        if experiment is None:
            if not create:
                raise TrackingError(f"MLflow at {self.uri} has no experiment {self.study_name!r}; "
                                    "the study driver creates it with start_study")
            location = None
            if self.artifact_root is not None:
                slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.study_name)
                location = f"{self.artifact_root.rstrip('/')}/{slug}"
            return self.client.create_experiment(self.study_name, artifact_location=location)
        if experiment.lifecycle_stage != "active":
            raise TrackingError(f"MLflow at {self.uri}: experiment {self.study_name!r} is deleted; "
                                f"restore it (mlflow experiments restore --experiment-id "
                                f"{experiment.experiment_id}) or choose another study name")
        return experiment.experiment_id

    def _search(self, filter_string: str, max_results: int = 1000) -> list[Run]:
        """Every active run of the study's experiment matching the filter, oldest first."""
        runs: list[Run] = []
        token = None
        while True:
            page = self._call("searching runs", self.client.search_runs, [self.experiment_id()],
                              filter_string, max_results=max_results,
                              order_by=["attributes.start_time ASC"], page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def _find_study_run(self) -> Run | None:
        runs = self._search(f"tags.`{TAG}kind` = 'study'")
        return runs[0] if runs else None

    def start_study(self, info: Mapping[str, Any]) -> str:
        """Create the study run, or reuse it on resume; return its run id.

        `info` holds the study's settings, e.g. `{"controller": "tpe", "objective":
        "validation_loss", "space": "space/spaces/crammed_bert.yaml", "budget": "600s",
        "code_version": "...", "train": TrainConfig.to_dict()}`. Scalars become tags
        (`cramnas.<key>`) and params; nested mappings become dotted params (`train.lr`). On resume
        the tags are updated (the code version may have moved on) and new params are added, but a
        param keeps its first value: MLflow params are write-once, and whether a changed setting may
        resume the study is the study store's decision, not the tracker's.
        """
        self.experiment_id(create=True)
        tags = {**_tags({k: v for k, v in info.items() if not isinstance(v, Mapping)}), TAG + "kind": "study"}
        params = {name: str(value) for name, value in flatten(info).items()}

        def find_or_create() -> Run:
            # One retried unit: a retry after a lost "created" reply finds the run instead of
            # creating a second one.
            run = self._find_study_run()
            if run is None:
                run = self.client.create_run(self.experiment_id(), tags=tags, run_name=self.study_name)
            return run

        run = self._call("starting the study run", find_or_create)
        run_id = run.info.run_id
        if run.info.status != "RUNNING":  # a resumed study that had been finished or killed
            self._call("reopening the study run", self.client.update_run, run_id, status="RUNNING")
        new_params = {k: v for k, v in params.items() if k not in run.data.params}
        self._log_batch("logging the study settings", run_id, params=new_params, tags=tags)
        self._study_run = None  # `run` predates the batch just logged: read it again when needed
        return run_id

    def study_run(self) -> Run:
        """The study run (found by its tag and cached: workers never call `start_study`)."""
        if self._study_run is None:
            run = self._find_study_run()
            if run is None:
                raise TrackingError(f"MLflow at {self.uri}: study {self.study_name!r} has no study run; "
                                    "the study driver creates it with start_study")
            self._study_run = run
        return self._study_run

    @property
    def study_run_id(self) -> str:
        return self.study_run().info.run_id

    def finish_study(self, status: str = "FINISHED") -> None:
        self._check_status(status)
        self._call("ending the study run", self.client.set_terminated, self.study_run_id, status=status)

    # ---- trial runs ----

    def find_trial_run(self, trial_number: int) -> Run | None:
        runs = self._search(f"tags.`{TAG}kind` = 'trial' and tags.`{self.trial_tag}` = '{int(trial_number)}'")
        return runs[0] if runs else None

    def running_trial_runs(self) -> list[Run]:
        """Trial runs still RUNNING: on resume, the ones a dead driver left behind."""
        return self._search(f"tags.`{TAG}kind` = 'trial' and attributes.status = 'RUNNING'")

    def trial_run(self, trial_number: int, arch: Mapping[str, Any], train: Mapping[str, Any],
                  tags: Mapping[str, Any] | None = None, budget: Any = None) -> str:
        """The run of trial `trial_number`: created on the first call, the same run on every later one.

        `tags` uses short keys: fingerprint (computed from `arch` when absent), controller and
        budget (the study's when absent), generation, parent_trial (its run id is looked up and
        set as `cramnas.parent_run_id`), mutation, repeat_of. A reused run that had been killed or
        failed is reopened: the trial is being run again.
        """
        study = self.study_run()
        tags = dict(tags or {})
        fingerprint = tags.pop("fingerprint", None) or ArchConfig.from_dict(dict(arch)).fingerprint()
        tags.setdefault("controller", study.data.tags.get(TAG + "controller"))
        if budget is None:
            budget = study.data.params.get("budget")
        parent_trial = tags.get("parent_trial")
        if parent_trial is not None:
            parent = self.find_trial_run(int(parent_trial))
            # An unknown parent (say, a seed imported from another study) keeps only its number.
            tags[TAG + "parent_run_id"] = parent.info.run_id if parent else None
        run_tags = {
            **_tags(tags),
            TAG + "kind": "trial",
            self.trial_tag: str(int(trial_number)),
            TAG + "fingerprint": fingerprint,
            "mlflow.parentRunId": study.info.run_id,
        }

        def find_or_create() -> tuple[Run, bool]:
            run = self.find_trial_run(trial_number)
            if run is not None:
                return run, False
            # The lookup tags are set with the run itself, so the run can never exist unfindable.
            return self.client.create_run(self.experiment_id(), tags={**run_tags, TAG + "status": "running"},
                                          run_name=f"t{int(trial_number):04d}-{fingerprint}"), True

        run, created = self._call(f"starting the run of trial {trial_number}", find_or_create)
        run_id = run.info.run_id
        if not created and run.info.status in ("KILLED", "FAILED"):
            self._call(f"reopening the run of trial {trial_number}", self.client.update_run, run_id, status="RUNNING")
            if TAG + "failure_reason" in run.data.tags:
                self._call("clearing the failure reason", self.client.delete_tag, run_id, TAG + "failure_reason")
            run_tags[TAG + "status"] = "running"
        # Params are write-once: logging the same values again is a no-op, different ones an error
        # (a caller mixing up trial numbers), which surfaces as TrackingError.
        self._log_batch(f"logging trial {trial_number}'s settings", run_id,
                        params=trial_params(arch, train, budget), tags=run_tags)
        return run_id

    def log_progress(self, run_id: str, step_tokens: int, metrics: Mapping[str, Any],
                     timestamp_ms: int | None = None) -> None:
        """One progress report (`train_loss`, `tokens_per_s`, `budget_fraction`, ...) at step = tokens seen.

        `timestamp_ms` (default: now) is fixed by a caller that may send the report again
        (`PendingWrites`): MLflow drops a metric point identical to one it has, so a repeat after a
        lost reply adds nothing."""
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        batch = [Metric(name, value, timestamp, int(step_tokens)) for name, value in _numbers(metrics).items()]
        self._log_batch("logging progress", run_id, metrics=batch)

    def finish_trial(self, run_id: str, status: str, metrics: Mapping[str, Any] | None = None,
                     tags: Mapping[str, Any] | None = None, artifacts: Mapping[str, str | dict] | None = None,
                     loss_curve: Sequence[tuple[int, float]] = (), timestamp_ms: int | None = None) -> None:
        """Final metrics, loss curve, status tags and artifacts of a trial; then end its run.

        `metrics` may nest (`{"glue": {"sst2": {"accuracy": 0.8}}}` -> `glue.sst2.accuracy`);
        `search.trial.trial_metrics` builds them from the trial's results. They are logged at step = `tokens`
        (the trial's last step) so that `tokens_per_s` ends where its progress series ends.
        `loss_curve` points already logged by `log_progress` are not logged twice. `tags` uses short
        keys: status (complete, pruned, failed or repeat; by default from `status`) and
        failure_reason. `artifacts` maps a file name to text or a dict, written as YAML or JSON by
        its extension: by convention `arch.yaml` (the arch dict) and `result.json`. `timestamp_ms`:
        see `log_progress`; every step here may be repeated without duplicating anything.
        """
        self._check_status(status)
        final = _numbers(metrics or {})
        step = int(final.get("tokens", 0))
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        batch = [Metric(name, value, timestamp, step) for name, value in final.items()]
        if loss_curve:
            logged = {m.step for m in self._call("reading the loss curve", self.client.get_metric_history,
                                                 run_id, "train_loss")}
            batch += [Metric("train_loss", float(loss), timestamp, int(tokens))
                      for tokens, loss in loss_curve if int(tokens) not in logged]
        run_tags = _tags({"status": TRIAL_STATUS[status], **(tags or {})})
        self._log_batch("logging the trial's results", run_id, metrics=batch, tags=run_tags)
        for name, content in (artifacts or {}).items():
            if isinstance(content, str):
                self._call(f"writing {name}", self.client.log_text, run_id, content, name)
            else:
                self._call(f"writing {name}", self.client.log_dict, run_id, content, name)
        self._call("ending the trial run", self.client.set_terminated, run_id, status=status)

    def read_artifact(self, run_id: str, name: str) -> Any:
        """A run's artifact as `finish_trial` wrote it: `*.yaml`/`*.json` parsed, other files as
        text; None when the run has no such artifact."""
        if name not in {item.path for item in self._call("listing artifacts", self.client.list_artifacts, run_id)}:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(self._call(f"reading {name}", self.client.download_artifacts, run_id, name, tmp)).read_text()
        if name.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text) if name.endswith((".yaml", ".yml")) else text

    def mark_stale_runs_killed(self) -> list[str]:
        """End as KILLED the trial runs a dead driver left RUNNING; return their run ids.

        Call it on resume, before any trial starts: every RUNNING trial run of the study is
        taken as orphaned.
        """
        stale = self.running_trial_runs()
        for run in stale:
            self._log_batch("marking a stale run", run.info.run_id,
                            tags=_tags({"status": "failed", "failure_reason": "driver died"}))
            self._call("ending a stale run", self.client.set_terminated, run.info.run_id, status="KILLED")
        return [run.info.run_id for run in stale]

    # ---- confirmation runs (search.confirm) ----

    def find_confirmation_run(self, original_run_id: str, seed: int, budget: str) -> Run | None:
        """The run that re-trained trial run `original_run_id` with `seed` under `budget`, if any."""
        runs = self._search(f"tags.`{TAG}kind` = 'confirmation' and tags.`{TAG}confirmation_of` = "
                            f"'{original_run_id}' and tags.`{TAG}seed` = '{int(seed)}' and "
                            f"tags.`{TAG}budget` = '{budget}'")
        return runs[0] if runs else None

    def confirmation_run(self, original_run_id: str, trial_number: int, seed: int, index: int,
                         arch: Mapping[str, Any], train: Mapping[str, Any], budget: str,
                         fingerprint: str | None = None) -> str:
        """The run re-training trial `trial_number`'s architecture (its run `original_run_id`) with
        `seed` under `budget`: nested under the study run, named `confirm-t0007-s1` (`index` = 1),
        tagged `cramnas.kind=confirmation`, `confirmation_of`, `original_trial`, `seed`, `budget`
        and `fingerprint`, with the params of a trial run. Created on the first call; a later call
        returns the same run, reopened, so a re-done confirmation never makes a second run. Its
        results go through `finish_trial`.
        """
        study = self.study_run()
        lookup = {  # set with the run itself, so the run can never exist unfindable
            TAG + "kind": "confirmation",
            TAG + "confirmation_of": original_run_id,
            TAG + "original_trial": str(int(trial_number)),
            TAG + "seed": str(int(seed)),
            TAG + "budget": budget,
            "mlflow.parentRunId": study.info.run_id,
            **_tags({"fingerprint": fingerprint}),
        }

        def find_or_create() -> tuple[Run, bool]:
            run = self.find_confirmation_run(original_run_id, seed, budget)
            if run is not None:
                return run, False
            return self.client.create_run(self.experiment_id(), tags={**lookup, TAG + "status": "running"},
                                          run_name=f"confirm-t{int(trial_number):04d}-s{int(index)}"), True

        what = f"the confirmation of trial {trial_number} with seed {seed}"
        run, created = self._call(f"starting {what}", find_or_create)
        run_id = run.info.run_id
        if not created:
            if run.info.status != "RUNNING":
                self._call(f"reopening {what}", self.client.update_run, run_id, status="RUNNING")
            if TAG + "failure_reason" in run.data.tags:
                self._call("clearing the failure reason", self.client.delete_tag, run_id, TAG + "failure_reason")
        self._log_batch(f"logging {what}'s settings", run_id, params=trial_params(arch, train, budget),
                        tags={**lookup, TAG + "status": "running"})
        return run_id

    # ---- reading back ----

    def trial_runs(self) -> pd.DataFrame:
        """One row per trial run, by trial number: `run_id`, `run_name`, `trial`, `status` (MLflow's),
        `start_time`, `end_time` and `params.*`, `metrics.*` (latest value), `tags.*` columns."""
        rows = [{"trial": int(run.data.tags[self.trial_tag]), **_run_row(run)}
                for run in self._search(f"tags.`{TAG}kind` = 'trial'")]
        if not rows:
            return pd.DataFrame(columns=["run_id", "run_name", "trial", "status", "start_time", "end_time"])
        return pd.DataFrame(rows).sort_values("trial", ignore_index=True)

    def confirmation_runs(self) -> pd.DataFrame:
        """One row per confirmation run (`search.confirm`), oldest first, with the columns of
        `trial_runs` (its `trial` is the original trial's number, from `cramnas.original_trial`)."""
        rows = [{"trial": int(run.data.tags.get(TAG + "original_trial", -1)), **_run_row(run)}
                for run in self._search(f"tags.`{TAG}kind` = 'confirmation'")]
        if not rows:
            return pd.DataFrame(columns=["run_id", "run_name", "trial", "status", "start_time", "end_time"])
        return pd.DataFrame(rows)

    def best_trial_run(self, metric: str, mode: str = "min") -> dict[str, Any] | None:
        """The complete trial with the lowest (`mode="min"`) or highest (`"max"`) `metric`, as a row
        of `trial_runs`; None when no complete trial has it. Pruned trials stopped early and repeats
        copy an earlier result, so neither competes."""
        top = self.top_trial_runs(metric, mode, 1)
        return top[0] if top else None

    def top_trial_runs(self, metric: str, mode: str = "min", k: int = 1) -> list[dict[str, Any]]:
        """The `k` best complete trials by `metric`, best first (a tie: the earlier trial first), as
        rows of `trial_runs`; fewer when fewer complete trials have it."""
        if mode not in ("min", "max"):
            raise ValueError(f"mode: expected min or max, got {mode!r}")
        frame = self.trial_runs()
        column = f"metrics.{metric}"
        if column not in frame or f"tags.{TAG}status" not in frame:
            return []
        # A diverged trial's NaN loss, or a metric it never logged (NaN in the frame), never wins.
        candidates = frame[(frame[f"tags.{TAG}status"] == "complete") & frame[column].map(math.isfinite)]
        ranked = candidates.sort_values(column, ascending=mode == "min", kind="stable")
        return ranked.head(k).to_dict("records")

    @staticmethod
    def _check_status(status: str) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"status: expected one of {', '.join(RUN_STATUSES)}, got {status!r}")


def _run_row(run: Run) -> dict[str, Any]:
    """A run as a flat row: `run_id`, `run_name`, `status` (MLflow's), `start_time`, `end_time`,
    `params.*`, `metrics.*` (latest value) and `tags.*`."""
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "start_time": pd.to_datetime(run.info.start_time, unit="ms", utc=True),
        "end_time": pd.to_datetime(run.info.end_time, unit="ms", utc=True),
        **{f"params.{k}": v for k, v in run.data.params.items()},
        **{f"metrics.{k}": v for k, v in run.data.metrics.items()},
        **{f"tags.{k}": v for k, v in run.data.tags.items()},
    }


def trial_runs(study_name: str, uri: str | None = None) -> pd.DataFrame:
    """`StudyTracker.trial_runs` for readers (export, dashboards) that hold no tracker."""
    return StudyTracker(uri, study_name).trial_runs()


def best_trial_run(study_name: str, metric: str, mode: str = "min", uri: str | None = None) -> dict[str, Any] | None:
    """`StudyTracker.best_trial_run` for readers that hold no tracker."""
    return StudyTracker(uri, study_name).best_trial_run(metric, mode)
