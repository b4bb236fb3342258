"""A study as the dashboards read it: its MLflow experiment, study run, trial, confirmation and baseline runs.

Only reads. Checks that would otherwise fail deep inside MLflow (a store that does not exist, a
study that is not in it) raise `UsageError` with one line naming the flag and the fix; the CLIs
print it and exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Run

from dashboards.analysis import Score, choose_score, prepare
from search.base import attrs
from search.base import tags as tag
from search.tracking.retry import TrackingError
from search.tracking.stores import existing_store
from search.tracking.tracker import StudyTracker
from space.errors import UsageError


def open_store(uri: str | None) -> tuple[str, MlflowClient]:
    """The resolved tracking URI and a client on it; a SQLite store must already exist (opening a
    missing one would silently create an empty database)."""
    try:
        uri = existing_store(uri)
    except TrackingError as error:  # its message names --tracking-uri already
        raise UsageError(str(error)) from None
    return uri, MlflowClient(tracking_uri=uri)


def known_studies(client: MlflowClient) -> list[str]:
    """Names of the store's active experiments, one per study (MLflow's `Default` left out)."""
    names = []
    token = None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        names += [e.name for e in page if e.name != "Default"]
        token = page.token
        if not token:
            return sorted(names)


def experiment_id(client: MlflowClient, uri: str, study: str) -> str:
    """The experiment id of `study`; UsageError listing the known studies when there is none."""
    experiment = client.get_experiment_by_name(study)
    if experiment is None or experiment.lifecycle_stage != "active":
        known = known_studies(client)
        listed = ", ".join(known[:20]) + (f" (and {len(known) - 20} more)" if len(known) > 20 else "")
        raise UsageError(f"--study: no study {study!r} in {uri}; known studies: {listed or 'none'}")
    return experiment.experiment_id


@dataclass
class StudyData:
    name: str
    uri: str
    experiment_id: str
    study_run: Run | None  # None only for an experiment that no cramnas driver started
    trials: pd.DataFrame  # `StudyTracker.trial_table`, prepared (analysis.prepare)
    confirmations: pd.DataFrame  # `StudyTracker.confirmation_table`, prepared
    score: Score
    # `StudyTracker.baseline_table`, prepared: hand-designed configs trained beside the confirmations
    baselines: pd.DataFrame = field(default_factory=pd.DataFrame)

    def setting(self, key: str) -> str | None:
        return _setting(self.study_run, key)

    @property
    def controller(self) -> str:
        return self.setting(attrs.CONTROLLER) or "unknown"


def load_study(study: str, uri: str | None = None) -> StudyData:
    uri, client = open_store(uri)
    try:
        exp_id = experiment_id(client, uri, study)
        tracker = StudyTracker(uri, study)
        runs = client.search_runs([exp_id], tag.where(tag.KIND, tag.STUDY), max_results=1)
        trials, confirmations = prepare(tracker.trial_table()), prepare(tracker.confirmation_table())
        baselines = prepare(tracker.baseline_table())
    except TrackingError as error:
        raise UsageError(f"--tracking-uri: {error}") from None
    study_run = runs[0] if runs else None
    score = choose_score(_setting(study_run, attrs.OBJECTIVE), trials)
    return StudyData(study, uri, exp_id, study_run, trials, confirmations, score, baselines)


def _setting(study_run: Run | None, key: str) -> str | None:
    """A study setting: the study run's `cramnas.<key>` tag, else its param."""
    if study_run is None:
        return None
    return study_run.data.tags.get(tag.named(key)) or study_run.data.params.get(key)
