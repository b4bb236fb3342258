"""The trial's way back (`search.study.report`): what a worker sends Ray and what the driver reads back.

The searcher's side is checked end to end on scratch stores: a progress report and a final one, in
the flattened form Ray hands a searcher, land in MLflow and Optuna under the names they always had."""

from __future__ import annotations

import json

import mlflow
import optuna
import pytest

from search.base.objectives import OBJECTIVES
from search.study import controllers
from search.study.report import RAY_KEYS, ProgressReport, TrialReport, from_tune, trial_metrics
from search.study.searcher import CramnasSearcher
from search.study.spec import TrialSpec
from search.tracking.tracker import StudyTracker
from space import load_space
from tests.helpers import ROOT
from trainer.budget import Budget
from trainer.config import TrainConfig

CRAM = {"validation_loss": 6.2, "unigram_floor": 6.95, "nats_below_unigram": 0.75, "corruption_floor": 6.4,
        "nats_below_floor": 0.2, "context_reference": 3.2, "tokens": 4096, "tokens_per_s": 512.5, "params": 1e6,
        "flops_per_token": 6e6, "seconds": 8.0, "validation_seconds": 1.5, "steps": 16, "oom_halvings": 1,
        "validation_loss_by_kind": {"mask": 6.8, "random": 7.0, "unchanged": 0.5},
        "rollbacks": [{"step": 3}, {"step": 9}], "regime": "plateau", "arch_fingerprint": "abc"}
PROBE = {"average": 0.61, "seconds": {"total": 12.0, "sst2": 12.0}, "metrics": {"sst2": {"accuracy": 0.61}}}

# What `search.study.trial.trial_metrics` returned for CRAM and PROBE before it moved here: the MLflow
# metric names of every recorded study.
OLD_METRICS = {
    "validation_loss": 6.2, "unigram_floor": 6.95, "nats_below_unigram": 0.75, "corruption_floor": 6.4,
    "nats_below_floor": 0.2, "context_reference": 3.2, "tokens": 4096.0, "tokens_per_s": 512.5, "params": 1e6,
    "flops_per_token": 6e6, "seconds": 8.0, "validation_seconds": 1.5, "steps": 16.0, "oom_halvings": 1.0,
    "validation_loss.mask": 6.8, "validation_loss.random": 7.0, "validation_loss.unchanged": 0.5,
    "rollbacks": 2.0, "probe_average": 0.61, "probe_seconds": 12.0, "glue.sst2.accuracy": 0.61,
}

# Some of what Ray Tune adds to each result before a searcher sees it.
RAY = {"trial_id": "abc_00000", "done": False, "pid": 4242, "timestamp": 1.7e9, "time_this_iter_s": 0.5,
       "time_total_s": 3.0, "time_since_restore": 3.0, "iterations_since_restore": 2, "training_iteration": 2,
       "date": "2026-01-01_00-00-00", "hostname": "node", "node_ip": "10.0.0.1", "config/trial_number": 7,
       "config/train/lr": 1e-3}


def flattened(report: dict) -> dict:
    """`report` as Ray hands it to a searcher: nested dicts flattened under "/", with Ray's keys."""
    def flat(prefix: str, value):
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                yield from flat(f"{prefix}/{key}" if prefix else key, inner)
        else:
            yield prefix, value
    return {**RAY, **dict(flat("", report))}


def test_trial_metrics_are_the_old_names_and_values():
    metrics = trial_metrics(CRAM, PROBE)
    assert metrics == OLD_METRICS and all(type(value) is float for value in metrics.values())
    assert trial_metrics(CRAM, None) == {k: v for k, v in OLD_METRICS.items() if "probe" not in k and "glue" not in k}


def test_a_progress_report_round_trips_and_keeps_the_asha_key():
    report = ProgressReport(0.25, 7.5, 1024, 300.0)
    sent = report.to_tune()
    assert sent == {"budget_fraction": 0.25, "train_loss": 7.5, "tokens": 1024, "tokens_per_s": 300.0, "final": False}
    assert from_tune(sent) == report and from_tune(flattened(sent)) == report
    assert report.series() == {"train_loss": 7.5, "tokens_per_s": 300.0, "budget_fraction": 0.25}
    assert "train_loss" not in report.last_metrics()  # logged as a series already


def test_a_final_report_round_trips_through_rays_flattening():
    result = {"cram": CRAM, "probe": PROBE, "gpu_ids": ["0"], "data": {"source": "cache", "node": "n1"}}
    report = TrialReport(trial_metrics(CRAM, PROBE), result=result, checkpoint_path="/ckpt/t0007", gpu_peak_gb=1.5)
    sent = report.to_tune()
    assert sent["final"] is True and sent["gpu_peak_gb"] == 1.5 and sent["checkpoint_path"] == "/ckpt/t0007"
    assert "failed" not in sent and "traceback" not in sent
    assert from_tune(sent) == report
    back = from_tune(flattened(sent))
    assert back == report  # Ray's keys and its copy of the config are no metric; result/ nests again
    assert back.result["cram"]["validation_loss_by_kind"] == {"mask": 6.8, "random": 7.0, "unchanged": 0.5}
    assert back.recorded_metrics() == {**OLD_METRICS, "gpu_peak_gb": 1.5}


def test_a_failed_report_round_trips_with_its_reason_cut():
    report = TrialReport.failure("RuntimeError: " + "x" * 3000, "Traceback ...\n" + "y" * 5000, 2.5)
    assert len(report.reason) == 2000 and len(report.traceback) == 4000 and report.traceback.endswith("y")
    sent = report.to_tune()
    assert (sent["final"], sent["failed"], sent["seconds"]) == (True, True, 2.5)
    back = from_tune(flattened(sent))
    assert back == report and back.recorded_metrics() == {"seconds": 2.5}
    # A failure that gave no reason still reads as one.
    assert TrialReport.from_tune({"final": True, "failed": True}).reason == "unknown"


def test_rays_bookkeeping_is_never_a_metric():
    back = from_tune({**RAY, "final": True, "validation_loss": 6.0})
    assert back.recorded_metrics() == {"validation_loss": 6.0}
    assert RAY_KEYS <= set(RAY)  # every key this test feeds in is one Ray sends
    assert from_tune(RAY) is None and from_tune(None) is None  # no report in it


def test_a_repeat_reports_the_original_metrics_again():
    recorded = {**OLD_METRICS, "gpu_peak_gb": 1.5}
    back = from_tune(TrialReport.repeat(recorded).to_tune())
    assert back.recorded_metrics() == recorded and back.gpu_peak_gb == 1.5 and not back.failed


@pytest.fixture
def searcher(tmp_path):
    uri, storage = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    space = load_space(ROOT / "tests" / "search_files" / "tiny_space.yaml")
    study = controllers.open_study("typed", storage, "random", "probe", space, seed=0)
    tracker = StudyTracker(uri, "typed")
    tracker.start_study({"controller": "random", "objective": "probe"})
    return CramnasSearcher(study, space, OBJECTIVES["probe"], tracker,
                           TrialSpec(TrainConfig(), Budget.parse("2e4tokens"), "data-0123"), {"controller": "random"})


def test_the_searcher_records_what_the_reports_carry(searcher):
    searcher.suggest("ok")
    searcher.on_trial_result("ok", flattened(ProgressReport(0.5, 7.5, 2048, 300.0).to_tune()))
    result = {"cram": {"validation_loss": 6.2}, "probe": None, "gpu_ids": [], "data": {"source": "cache"}}
    final = flattened(TrialReport(trial_metrics(CRAM, PROBE), result=result, gpu_peak_gb=1.5).to_tune())
    searcher.on_trial_complete("ok", final)
    searcher.suggest("bad")
    searcher.on_trial_complete("bad", flattened(TrialReport.failure("RuntimeError: no", "Traceback: no", 1.0).to_tune()))

    ok, bad = searcher.study.get_trials()
    assert ok.state == optuna.trial.TrialState.COMPLETE and ok.values == [0.61]
    assert ok.user_attrs["metrics"] == {**OLD_METRICS, "gpu_peak_gb": 1.5} and ok.user_attrs["intermediate"] == [[1, 7.5]]
    assert bad.state == optuna.trial.TrialState.FAIL and bad.user_attrs["failure_reason"] == "RuntimeError: no"
    tracker = searcher.tracker
    run = tracker.find_trial_run(0)
    assert run.data.metrics == {**OLD_METRICS, "gpu_peak_gb": 1.5, "train_loss": 7.5, "budget_fraction": 0.5}
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(run.info.run_id, "train_loss")] == [(2048, 7.5)]
    assert tracker.read_artifact(run.info.run_id, "result.json") == json.loads(json.dumps(result))
    assert tracker.read_artifact(run.info.run_id, "traceback.txt") is None
    failed = tracker.find_trial_run(1)
    assert failed.data.tags["cramnas.failure_reason"] == "RuntimeError: no" and failed.data.metrics == {"seconds": 1.0}
    assert tracker.read_artifact(failed.info.run_id, "traceback.txt") == "Traceback: no"
    assert mlflow.MlflowClient(tracker.uri).get_run(failed.info.run_id).info.status == "FAILED"


def test_a_pruned_trial_keeps_its_last_progress_but_not_its_train_loss(searcher):
    searcher.suggest("pruned")
    progress = flattened(ProgressReport(0.25, 7.9, 1024, 250.0).to_tune())
    searcher.on_trial_result("pruned", progress)
    searcher.on_trial_complete("pruned", progress)
    (trial,) = searcher.study.get_trials()
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.user_attrs["metrics"] == {"budget_fraction": 0.25, "tokens": 1024.0, "tokens_per_s": 250.0}
