"""search.tracking against a real SQLite MLflow store in a temporary directory (no server)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    TEMPORARILY_UNAVAILABLE,
)

from search.tracking import (
    Retry,
    StudyTracker,
    TrackingError,
    best_trial_run,
    check_store,
    resolve_uri,
    trial_params,
    trial_runs,
)
from space.arch import ArchConfig
from tests.conftest import FakeTime
from trainer.config import TrainConfig

ARCH = ArchConfig(layers=2, hidden=128, heads=2, vocab_size=2048, max_seq_len=64).to_dict()
TRAIN = TrainConfig(lr=2e-3, batch_size=64, micro_batch=32).to_dict()
STUDY_INFO = {"controller": "evolution", "objective": "validation_loss",
              "space": "space/spaces/crammed_bert_cpu.yaml", "budget": "120s", "code_version": "abc123",
              "train": TRAIN}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    # One database for the module: creating MLflow's schema takes seconds. Tests use their own studies.
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture
def uri(store) -> str:
    return f"sqlite:///{store}/mlflow.db"


@pytest.fixture
def tracker(uri, request) -> StudyTracker:
    tracker = StudyTracker(uri, f"study-{request.node.name}")
    tracker.start_study(STUDY_INFO)
    return tracker


def runs_of(tracker: StudyTracker, filter_string: str = ""):
    return MlflowClient(tracker.uri).search_runs([tracker.experiment_id()], filter_string)


def test_study_run_is_created_once_and_reused(uri, store):
    first = StudyTracker(uri, "resumed-study")
    run_id = first.start_study(STUDY_INFO)
    first.finish_study()
    # A resumed driver: a new tracker, a newer code version, the study run reopened, not duplicated.
    again = StudyTracker(uri, "resumed-study")
    assert again.start_study({**STUDY_INFO, "code_version": "def456"}) == run_id
    runs = runs_of(again)
    assert [r.info.run_id for r in runs] == [run_id]
    run = runs[0]
    assert run.info.run_name == "resumed-study" and run.info.status == "RUNNING"
    assert run.data.tags["cramnas.kind"] == "study"
    assert run.data.tags["cramnas.controller"] == "evolution"
    assert run.data.tags["cramnas.code_version"] == "def456"  # tags follow the current driver
    assert run.data.params["code_version"] == "abc123"  # params keep their first value
    assert run.data.params["budget"] == "120s" and run.data.params["train.lr"] == "0.002"
    assert "cramnas.train" not in run.data.tags
    # Artifacts live beside the database, not in the working directory.
    assert Path(run.info.artifact_uri).is_relative_to(store / "mlruns")


def test_trial_run_is_nested_with_readable_params_and_tags(tracker):
    run_id = tracker.trial_run(3, ARCH, TRAIN, {"generation": 1, "mutation": None})
    run = MlflowClient(tracker.uri).get_run(run_id)
    fingerprint = ArchConfig.from_dict(ARCH).fingerprint()
    assert run.info.run_name == f"t0003-{fingerprint}"
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == tracker.study_run_id
    assert tags["cramnas.trial"] == "3" and tags["cramnas.kind"] == "trial"
    assert tags["cramnas.fingerprint"] == fingerprint
    assert tags["cramnas.controller"] == "evolution"  # the study's, by default
    assert tags["cramnas.generation"] == "1" and tags["cramnas.status"] == "running"
    assert "cramnas.mutation" not in tags
    assert run.data.params["arch.layers"] == "2" and run.data.params["arch.position"] == "scaled_sinusoidal"
    assert run.data.params["train.lr"] == "0.002" and run.data.params["budget"] == "120s"


def test_param_names_read_well():
    names = set(trial_params(ARCH, TRAIN, "120s"))
    assert {f"arch.{f.name}" for f in dataclasses.fields(ArchConfig)} <= names
    assert {f"train.{f.name}" for f in dataclasses.fields(TrainConfig)} <= names
    assert "budget" in names
    assert len(names) == len(ARCH) + len(TRAIN) + 1


def test_trial_run_is_idempotent_across_calls_and_trackers(tracker):
    run_id = tracker.trial_run(0, ARCH, TRAIN)
    assert tracker.trial_run(0, ARCH, TRAIN) == run_id
    assert StudyTracker(tracker.uri, tracker.study_name).trial_run(0, ARCH, TRAIN) == run_id
    assert len(runs_of(tracker, "tags.`cramnas.trial` = '0'")) == 1
    # Another architecture under the same trial number is a caller's bug, not a silent overwrite.
    with pytest.raises(TrackingError, match="trial 0"):
        tracker.trial_run(0, {**ARCH, "layers": 4}, TRAIN)


def test_lineage_tag_resolves_to_the_parent_trials_run(tracker):
    parent = tracker.trial_run(0, ARCH, TRAIN)
    child = tracker.trial_run(1, {**ARCH, "layers": 3}, TRAIN, {"parent_trial": 0, "mutation": "layers+1"})
    tags = MlflowClient(tracker.uri).get_run(child).data.tags
    assert tags["cramnas.parent_run_id"] == parent
    assert tags["cramnas.parent_trial"] == "0" and tags["cramnas.mutation"] == "layers+1"
    orphan = tracker.trial_run(2, ARCH, TRAIN, {"parent_trial": 99})
    assert "cramnas.parent_run_id" not in MlflowClient(tracker.uri).get_run(orphan).data.tags


def test_progress_and_finish_log_metrics_artifacts_and_status(tracker, tmp_path):
    run_id = tracker.trial_run(0, ARCH, TRAIN)
    for tokens, loss in [(1000, 7.5), (2000, 6.0)]:
        progress = {"train_loss": loss, "tokens_per_s": 900.0, "budget_fraction": tokens / 3000}
        tracker.log_progress(run_id, tokens, progress)
    cram = {"validation_loss": 5.5, "tokens": 3000, "steps": 12, "seconds": 3.2, "tokens_per_s": 950.0,
            "params": 500_000, "flops_per_token": 3e6, "loss_curve": [(1000, 7.5), (2000, 6.0), (3000, 5.6)]}
    probe = {"metrics": {"sst2": {"accuracy": 0.81}, "mrpc": {"f1": 0.7, "accuracy": 0.65}}, "average": 0.755}
    final = {"validation_loss": cram["validation_loss"], "tokens": cram["tokens"], "tokens_per_s": cram["tokens_per_s"],
             "glue": probe["metrics"], "probe_average": probe["average"]}  # nested: glue.<task>.<metric>
    tracker.finish_trial(run_id, "FINISHED", final,
                         artifacts={"arch.yaml": ARCH, "result.json": cram}, loss_curve=cram["loss_curve"])

    client = MlflowClient(tracker.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["cramnas.status"] == "complete"
    metrics = run.data.metrics
    assert metrics["validation_loss"] == 5.5 and metrics["probe_average"] == 0.755
    assert metrics["glue.sst2.accuracy"] == 0.81 and metrics["glue.mrpc.f1"] == 0.7
    assert metrics["tokens_per_s"] == 950.0  # the final value ends the progress series
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train_loss"))
    assert history == [(1000, 7.5), (2000, 6.0), (3000, 5.6)]  # progress points not logged twice
    assert yaml.safe_load(Path(client.download_artifacts(run_id, "arch.yaml", str(tmp_path))).read_text()) == ARCH
    result = json.loads(Path(client.download_artifacts(run_id, "result.json", str(tmp_path))).read_text())
    assert result["validation_loss"] == 5.5 and result["loss_curve"][-1] == [3000, 5.6]


@pytest.mark.parametrize("status, tags, expected", [
    ("KILLED", {}, "pruned"),
    ("FAILED", {"failure_reason": "out of memory"}, "failed"),
    ("FINISHED", {"status": "repeat", "repeat_of": 4}, "repeat"),
])
def test_finish_statuses(tracker, status, tags, expected):
    run_id = tracker.trial_run(5, ARCH, TRAIN)
    tracker.finish_trial(run_id, status, {"tokens": 10}, tags)
    run = MlflowClient(tracker.uri).get_run(run_id)
    assert run.info.status == status and run.data.tags["cramnas.status"] == expected
    assert run.data.tags.get("cramnas.failure_reason") == tags.get("failure_reason")
    with pytest.raises(ValueError, match="status"):
        tracker.finish_trial(run_id, "DONE")


def test_stale_runs_are_killed_and_reopened_when_rerun(tracker):
    done = tracker.trial_run(0, ARCH, TRAIN)
    tracker.finish_trial(done, "FINISHED", {"tokens": 10})
    stale = tracker.trial_run(1, ARCH, TRAIN)
    assert [run.info.run_id for run in tracker.running_trial_runs()] == [stale]
    assert tracker.mark_stale_runs_killed() == [stale]
    client = MlflowClient(tracker.uri)
    run = client.get_run(stale)
    assert run.info.status == "KILLED" and run.data.tags["cramnas.failure_reason"] == "driver died"
    assert client.get_run(done).info.status == "FINISHED"
    assert client.get_run(tracker.study_run_id).info.status == "RUNNING"  # the study run is resumed, not killed
    assert tracker.mark_stale_runs_killed() == []
    # The resumed study runs trial 1 again: its run comes back to life, without the old reason.
    assert tracker.trial_run(1, ARCH, TRAIN) == stale
    run = client.get_run(stale)
    assert run.info.status == "RUNNING" and "cramnas.failure_reason" not in run.data.tags


def test_reading_back_trials_and_the_best_one(tracker):
    for trial, (loss, status) in enumerate([(5.0, "FINISHED"), (4.0, "FINISHED"), (3.0, "KILLED")]):
        run_id = tracker.trial_run(trial, {**ARCH, "layers": trial + 1}, TRAIN)
        tracker.finish_trial(run_id, status, {"validation_loss": loss, "tokens": 100})
    tracker.trial_run(3, ARCH, TRAIN)  # still running: no metric yet

    frame = trial_runs(tracker.study_name, tracker.uri)
    assert list(frame["trial"]) == [0, 1, 2, 3]
    assert list(frame["params.arch.layers"]) == ["1", "2", "3", "2"]
    assert list(frame["tags.cramnas.status"]) == ["complete", "complete", "pruned", "running"]
    best = best_trial_run(tracker.study_name, "validation_loss", "min", tracker.uri)
    assert best["trial"] == 1  # the pruned trial's lower loss does not compete
    assert tracker.best_trial_run("validation_loss", "max")["trial"] == 0
    assert tracker.best_trial_run("probe_average") is None


def test_a_worker_finds_the_study_through_a_pickled_tracker(tracker):
    worker = pickle.loads(pickle.dumps(tracker))
    assert worker.trial_run(0, ARCH, TRAIN) == tracker.trial_run(0, ARCH, TRAIN)
    with pytest.raises(TrackingError, match="start_study"):
        StudyTracker(tracker.uri, "never-started").trial_run(0, ARCH, TRAIN)


def test_store_check(uri, tmp_path, monkeypatch):
    assert check_store(uri) == uri
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = f"sqlite:///{blocker}/sub/mlflow.db"
    with pytest.raises(TrackingError) as error:
        check_store(bad)
    message = str(error.value)
    assert "\n" not in message and bad in message and "--tracking-uri" in message
    not_a_database = tmp_path / "notes.db"
    not_a_database.write_text("not a database " * 100)
    with pytest.raises(TrackingError, match="not a database") as error:
        check_store(f"sqlite:///{not_a_database}")
    assert "\n" not in str(error.value)
    # A relative path is pinned to the driver's directory: Ray workers run elsewhere.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_uri() == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///runs/x.db")
    assert resolve_uri() == f"sqlite:///{tmp_path}/runs/x.db"


def flaky(failures: int, error: Exception):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "ok"
    return call, calls


def test_retry_recovers_from_transient_failures():
    fake = FakeTime()
    retry = Retry(timeout_s=60, sleep=fake.sleep, clock=fake.clock)
    call, calls = flaky(3, MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE))
    assert retry("logging", call) == "ok"
    assert len(calls) == 4 and fake.sleeps == [0.5, 1.0, 2.0]
    call, calls = flaky(1, ConnectionError("connection refused"))
    assert retry("logging", call) == "ok" and len(calls) == 2


def test_retry_gives_up_after_the_bound_with_one_line():
    fake = FakeTime()
    retry = Retry(timeout_s=60, sleep=fake.sleep, clock=fake.clock)
    call, calls = flaky(10**6, MlflowException("API request failed\nConnection refused"))
    with pytest.raises(TrackingError) as error:
        retry("logging progress (MLflow at http://127.0.0.1:5000)", call)
    assert fake.now == 60 and max(fake.sleeps) == 8.0
    message = str(error.value)
    assert "\n" not in message and "http://127.0.0.1:5000" in message and f"{len(calls)} tries" in message


def test_retry_does_not_retry_permanent_errors():
    fake = FakeTime()
    retry = Retry(sleep=fake.sleep, clock=fake.clock)
    call, _ = flaky(1, MlflowException("Changing param values is not allowed", error_code=INVALID_PARAMETER_VALUE))
    with pytest.raises(TrackingError, match="Changing param values"):
        retry("logging", call)
    call, _ = flaky(1, TypeError("a bug"))
    with pytest.raises(TypeError):
        retry("logging", call)
    assert fake.sleeps == []
