"""search.tracking.tracker against a real SQLite MLflow store in a temporary directory (no server)."""

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

from search.base.objectives import OBJECTIVES, Objective
from search.tracking.params import param_value, params_under, trial_params
from search.tracking.retry import Retry, TrackingError
from search.tracking.stores import check_store, resolve_uri
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from tests.helpers import FakeTime
from trainer.config import TrainConfig

ARCH = ArchConfig(layers=2, hidden=128, heads=2, vocab_size=2048, max_seq_len=64).to_dict()
FINGERPRINT = ArchConfig.from_dict(ARCH).fingerprint()
TRAIN = TrainConfig(lr=2e-3, batch_size=64, micro_batch=32).to_dict()
STUDY_INFO = {"controller": "evolution", "objective": "mlm",
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
    # Named apart from its trials, which sit nested under it.
    assert run.info.run_name == "study resumed-study" and run.info.status == "RUNNING"
    assert run.data.tags["cramnas.kind"] == "study"
    assert run.data.tags["cramnas.controller"] == "evolution"
    assert run.data.tags["cramnas.code_version"] == "def456"  # tags follow the current driver
    assert run.data.params["code_version"] == "abc123"  # params keep their first value
    assert run.data.params["budget"] == "120s" and run.data.params["train.lr"] == "0.002"
    assert "cramnas.train" not in run.data.tags
    # Artifacts live beside the database, not in the working directory.
    assert Path(run.info.artifact_uri).is_relative_to(store / "mlruns")


def test_trial_run_is_nested_with_readable_params_and_tags(tracker):
    run_id = tracker.open_trial_run(3, ARCH, TRAIN, FINGERPRINT, {"generation": 1, "mutation": None})
    run = MlflowClient(tracker.uri).get_run(run_id)
    # Trial first, then the architecture in words; the fingerprint stays findable as a tag.
    assert run.info.run_name == "t0003 2x128/2h geglu pre-norm scaled_sinusoidal"
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == tracker.study_run_id
    assert tags["cramnas.trial"] == "3" and tags["cramnas.kind"] == "trial"
    assert tags["cramnas.fingerprint"] == FINGERPRINT
    assert tags["cramnas.controller"] == "evolution"  # the study's, by default
    assert tags["cramnas.generation"] == "1" and tags["cramnas.state"] == "running"
    assert "cramnas.mutation" not in tags
    assert run.data.params["arch.layers"] == "2" and run.data.params["arch.position"] == "scaled_sinusoidal"
    assert run.data.params["train.lr"] == "0.002" and run.data.params["budget"] == "120s"


@pytest.mark.parametrize("arch, name", [
    ({**ARCH, "layers": 4, "ffn_kind": "swiglu", "position": "rotary"}, "t0012 4x128/2h swiglu pre-norm rotary"),
    ({"layers": 3}, "t0012 3x768/12h geglu pre-norm scaled_sinusoidal"),  # an older record: defaults fill the rest
    ({**ARCH, "hidden": 129}, f"t0012 {FINGERPRINT}"),  # impossible (129 in 2 heads): no words to give
    ({}, f"t0012 {FINGERPRINT}"),  # rebuilt by `reconcile` from a trial that recorded no architecture
])
def test_trial_run_names_give_the_architecture_when_there_is_one(tracker, arch, name):
    run_id = tracker.open_trial_run(12, arch, TRAIN, FINGERPRINT)
    assert MlflowClient(tracker.uri).get_run(run_id).info.run_name == name


def test_param_names_read_well():
    names = set(trial_params(ARCH, TRAIN, "120s"))
    assert {f"arch.{f.name}" for f in dataclasses.fields(ArchConfig)} <= names
    assert {f"train.{f.name}" for f in dataclasses.fields(TrainConfig)} <= names
    assert "budget" in names
    assert len(names) == len(ARCH) + len(TRAIN) + 1


def test_trial_run_is_idempotent_across_calls_and_trackers(tracker):
    run_id = tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT)
    assert tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT) == run_id
    assert StudyTracker(tracker.uri, tracker.study_name).open_trial_run(0, ARCH, TRAIN, FINGERPRINT) == run_id
    assert len(runs_of(tracker, "tags.`cramnas.trial` = '0'")) == 1
    # Another architecture under the same trial number is a caller's bug, not a silent overwrite.
    with pytest.raises(TrackingError, match="trial 0"):
        tracker.open_trial_run(0, {**ARCH, "layers": 4}, TRAIN, FINGERPRINT)


def test_lineage_tag_resolves_to_the_parent_trials_run(tracker):
    parent = tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT)
    child = tracker.open_trial_run(1, {**ARCH, "layers": 3}, TRAIN, "child", {"parent_trial": 0, "mutation": "layers+1"})
    tags = MlflowClient(tracker.uri).get_run(child).data.tags
    assert tags["cramnas.parent_run_id"] == parent
    assert tags["cramnas.parent_trial"] == "0" and tags["cramnas.mutation"] == "layers+1"
    orphan = tracker.open_trial_run(2, ARCH, TRAIN, FINGERPRINT, {"parent_trial": 99})
    assert "cramnas.parent_run_id" not in MlflowClient(tracker.uri).get_run(orphan).data.tags
    # A re-run of a trial the driver's death cut short links to that trial's run the same way.
    rerun = tracker.open_trial_run(3, ARCH, TRAIN, FINGERPRINT, {"rerun_of": 2})
    tags = MlflowClient(tracker.uri).get_run(rerun).data.tags
    assert (tags["cramnas.rerun_of"], tags["cramnas.rerun_of_run_id"]) == ("2", orphan)
    assert "cramnas.parent_run_id" not in tags


def test_progress_and_finish_log_metrics_artifacts_and_status(tracker, tmp_path):
    run_id = tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT)
    for tokens, loss in [(1000, 7.5), (2000, 6.0)]:
        progress = {"train_loss": loss, "tokens_per_s": 900.0, "budget_fraction": tokens / 3000}
        tracker.log_progress(run_id, tokens, progress)
    cram = {"validation_loss": 5.5, "tokens": 3000, "steps": 12, "seconds": 3.2, "tokens_per_s": 950.0,
            "params": 500_000, "flops_per_token": 3e6, "loss_curve": [(1000, 7.5), (2000, 6.0), (3000, 5.6)]}
    probe = {"metrics": {"sst2": {"accuracy": 0.81}, "mrpc": {"f1": 0.7, "accuracy": 0.65}}, "average": 0.755}
    final = {"validation_loss": cram["validation_loss"], "tokens": cram["tokens"], "tokens_per_s": cram["tokens_per_s"],
             "glue": probe["metrics"], "probe_average": probe["average"]}  # nested: glue.<task>.<metric>
    tracker.finish_run(run_id, "complete", final,
                       artifacts={"arch.yaml": ARCH, "result.json": cram}, loss_curve=cram["loss_curve"])

    client = MlflowClient(tracker.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["cramnas.state"] == "complete"
    metrics = run.data.metrics
    assert metrics["validation_loss"] == 5.5 and metrics["probe_average"] == 0.755
    assert metrics["glue.sst2.accuracy"] == 0.81 and metrics["glue.mrpc.f1"] == 0.7
    assert metrics["tokens_per_s"] == 950.0  # the final value ends the progress series
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train_loss"))
    assert history == [(1000, 7.5), (2000, 6.0), (3000, 5.6)]  # progress points not logged twice
    assert yaml.safe_load(Path(client.download_artifacts(run_id, "arch.yaml", str(tmp_path))).read_text()) == ARCH
    result = json.loads(Path(client.download_artifacts(run_id, "result.json", str(tmp_path))).read_text())
    assert result["validation_loss"] == 5.5 and result["loss_curve"][-1] == [3000, 5.6]


@pytest.mark.parametrize("state, reason, cut_short, status", [
    ("pruned", None, False, "FINISHED"),  # not KILLED: the MLflow UI draws it with a failure's red cross
    ("failed", "out of memory", False, "FAILED"),
    ("failed", "driver died", True, "KILLED"),
    ("repeat", None, False, "FINISHED"),
    ("complete", None, True, "FINISHED"),  # only a failed run ends otherwise when cut short
])
def test_each_state_ends_the_run_with_its_status(tracker, state, reason, cut_short, status):
    run_id = tracker.open_trial_run(5, ARCH, TRAIN, FINGERPRINT)
    tracker.finish_run(run_id, state, {"tokens": 10}, reason=reason, cut_short=cut_short)
    run = MlflowClient(tracker.uri).get_run(run_id)
    assert run.info.status == status and run.data.tags["cramnas.state"] == state
    assert run.data.tags.get("cramnas.failure_reason") == reason
    for wrong in ("DONE", "FINISHED", "running"):
        with pytest.raises(ValueError, match="state"):
            tracker.finish_run(run_id, wrong)


def test_a_pruned_trial_finishes_with_its_last_reported_loss(tracker):
    # As the searcher does: progress reports, then the end without the train loss (already logged).
    run_id = tracker.open_trial_run(6, ARCH, TRAIN, FINGERPRINT)
    for tokens, loss in ((1000, 7.5), (2000, 6.8)):
        tracker.log_progress(run_id, tokens, {"train_loss": loss, "tokens_per_s": 900.0})
    tracker.finish_run(run_id, "pruned", {"tokens": 2000, "tokens_per_s": 900.0},
                       reason="stopped early by ASHA after 2 of its reports")
    run = MlflowClient(tracker.uri).get_run(run_id)
    assert run.info.status not in ("FAILED", "KILLED") and run.data.tags["cramnas.state"] == "pruned"
    assert run.data.metrics["train_loss"] == 6.8


def test_a_run_cut_short_is_reopened_when_its_trial_runs_again(tracker):
    done = tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT)
    tracker.finish_run(done, "complete", {"tokens": 10})
    stale = tracker.open_trial_run(1, ARCH, TRAIN, FINGERPRINT)
    assert [run.info.run_id for run in tracker.running_trial_runs()] == [stale]
    tracker.finish_run(stale, "failed", reason="driver died", cut_short=True)  # as search.study.driver.reconcile does
    client = MlflowClient(tracker.uri)
    assert client.get_run(stale).info.status == "KILLED" and tracker.running_trial_runs() == []
    # The resumed study runs trial 1 again: its run comes back to life, without the old reason.
    assert tracker.open_trial_run(1, ARCH, TRAIN, FINGERPRINT) == stale
    run = client.get_run(stale)
    assert run.info.status == "RUNNING" and "cramnas.failure_reason" not in run.data.tags
    assert run.data.tags["cramnas.state"] == "running"
    assert client.get_run(done).info.status == "FINISHED"
    # A finished run is not reopened by a late second call (a driver retrying after a crash).
    assert tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT) == done
    assert client.get_run(done).info.status == "FINISHED"


def test_reading_back_trials_and_the_best_ones(tracker):
    for trial, (loss, state) in enumerate([(5.0, "complete"), (4.0, "complete"), (3.0, "pruned"), (2.0, "repeat")]):
        run_id = tracker.open_trial_run(trial, {**ARCH, "layers": trial + 1}, TRAIN, f"fp{trial}")
        tracker.finish_run(run_id, state, {"validation_loss": loss, "tokens": 100})
    tracker.open_trial_run(4, ARCH, TRAIN, FINGERPRINT)  # still running: no metric yet

    frame = tracker.trial_table()
    assert list(frame["trial"]) == [0, 1, 2, 3, 4]
    assert list(frame["params.arch.layers"]) == ["1", "2", "3", "4", "2"]
    assert list(frame["tags.cramnas.state"]) == ["complete", "complete", "pruned", "repeat", "running"]
    # The pruned trial's and the repeat's lower losses do not compete.
    assert [row["trial"] for row in tracker.top_trial_runs(OBJECTIVES["mlm"], 5)] == [1, 0]
    higher_loss = Objective("worst", ("validation_loss",), ("maximize",), "validation MLM loss, reversed")
    assert tracker.top_trial_runs(higher_loss)[0]["trial"] == 0
    assert tracker.top_trial_runs(OBJECTIVES["probe"]) == []


def test_params_read_back_as_logged():
    params = trial_params(ARCH, TRAIN, "120s")
    assert params_under(params, "arch") == ARCH and params_under(params, "train") == TRAIN
    assert params_under({f"params.{k}": v for k, v in params.items()}, "arch") == ARCH  # a trial_table row
    assert [param_value(text) for text in ("1e-12", "True", "[0.9, 0.98]", "None", "geglu", "3")] == [
        1e-12, True, [0.9, 0.98], None, "geglu", 3]


def test_a_worker_finds_the_study_through_a_pickled_tracker(tracker):
    worker = pickle.loads(pickle.dumps(tracker))
    assert worker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT) == tracker.open_trial_run(0, ARCH, TRAIN, FINGERPRINT)
    with pytest.raises(TrackingError, match="start_study"):
        StudyTracker(tracker.uri, "never-started").open_trial_run(0, ARCH, TRAIN, FINGERPRINT)


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
