"""`search.audit` on synthetic studies: silent when the two stores agree, one line per problem
when they do not (a missing, duplicated, RUNNING or mismatched MLflow run, a wrong total)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from search.audit import audit_study, main
from search.tracking.tracker import StudyTracker
from tests.dashboard_study import TRAIN, write_study

pytestmark = pytest.mark.slow  # each test writes a synthetic study to a new MLflow store


def test_agreeing_stores_pass_and_the_total_is_checked(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    write_study(uri, "fine", 6, failed=(2,), pruned=(3,), repeats=(5,))
    audit = audit_study("fine", uri, trials=6)
    assert audit.ok, audit.problems
    assert (audit.counts["complete"], audit.counts["pruned"], audit.counts["failed"]) == (4, 1, 1)
    assert audit.runs == {"FINISHED": 5, "FAILED": 1}  # the pruned trial's run is FINISHED too
    assert audit_study("fine", uri, trials=7).problems == ["complete + pruned + failed = 6, expected 7"]
    assert main(["--study", "fine", "--tracking-uri", uri, "--trials", "6"]) == 0
    assert "consistent" in capsys.readouterr().out


def test_each_disagreement_is_one_problem(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    study = write_study(uri, "broken", 5, failed=(2,), pruned=(3,))
    client = MlflowClient(uri)
    client.set_terminated(study.trials[3].run_id, "KILLED")  # the study says pruned, which ends FINISHED
    client.set_tag(study.trials[2].run_id, "cramnas.failure_reason", "")  # a failure without its reason
    # A second run for trial 1, as a replayed create would make; and a run for a trial Optuna never had.
    tracker = StudyTracker(uri, "broken")
    duplicate = client.create_run(tracker.experiment_id(), tags={"cramnas.kind": "trial", "cramnas.trial": "1"},
                                  run_name="t0001-copy").info.run_id
    client.set_terminated(duplicate, "FINISHED")
    stray = tracker.open_trial_run(9, study.trials[0].arch, TRAIN, "stray")  # left RUNNING
    problems = audit_study("broken", uri).problems
    assert len(problems) == 4, problems
    assert any(p.startswith("trial 1: 2 MLflow runs") for p in problems)
    assert any(p.startswith("trial 2: failed without") for p in problems)
    assert any(p.startswith("trial 3: Optuna says pruned") and "KILLED" in p for p in problems)
    assert any("trial 9, which the Optuna study does not count" in p for p in problems)
    # The stray run is RUNNING, but it is reported as uncounted only, not as some trial's RUNNING run.
    assert client.get_run(stray).info.status == "RUNNING"
    assert not any(stray in p for p in problems), problems
    assert main(["--study", "broken", "--tracking-uri", uri]) == 1
    out = capsys.readouterr().out
    assert "4 problem(s)" in out


def test_a_missing_run_and_a_running_one_are_found(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    study = write_study(uri, "gaps", 4)
    client = MlflowClient(uri)
    client.delete_run(study.trials[1].run_id)  # deleted runs are not searched: as if never written
    client.update_run(study.trials[2].run_id, status="RUNNING")
    problems = audit_study("gaps", uri).problems
    assert "trial 1 (complete): no MLflow run" in problems
    assert f"trial 2: MLflow run {study.trials[2].run_id} still RUNNING" in problems


def test_unknown_study_is_one_line_exit_2(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    write_study(uri, "known", 1)
    capsys.readouterr()  # the stores' own start-up logging
    assert main(["--study", "nope", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--study: no study 'nope'" in err
    assert main(["--study", "x", "--tracking-uri", f"sqlite:///{tmp_path}/elsewhere/mlflow.db"]) == 2
    assert not (tmp_path / "elsewhere").exists()
