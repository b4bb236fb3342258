"""Helpers for tests that run real (tiny) studies: `search.run` arguments, the two-store check,
waiting on a driver's progress, and killing a driver with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.base.states import run_statuses, state_of_trial
from search.study.controllers import is_cut_short
from search.tracking.tracker import StudyTracker
from tests.helpers import ROOT

PROFILE = ROOT / "tests" / "search_files" / "tiny_profile.yaml"


def study_args(tmp_path: Path, data: Path, study: str, *extra: str, tracking_uri: str | None = None,
               cache_dir: Path | None = None) -> list[str]:
    """`search.run` arguments for a study of the tiny profile, its stores (and by default its token
    cache) in `tmp_path`."""
    return ["--profile", str(PROFILE), "--data", str(data), "--study", study, "--seed", "1",
            "--tracking-uri", tracking_uri or f"sqlite:///{tmp_path}/mlflow.db",
            "--storage", f"sqlite:///{tmp_path}/optuna.db", "--cache-dir", str(cache_dir or tmp_path / "cache"),
            *extra]


def check_stores_agree(tmp_path: Path, study_name: str, trials: int,
                       tracking_uri: str | None = None) -> tuple[optuna.Study, list[dict]]:
    """Counts are exact (`trials` with results; trials the driver's death cut short count apart,
    their re-runs count), every Optuna trial but an infeasible draw has exactly one MLflow run,
    none RUNNING, and the run's status matches the trial's state."""
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path}/optuna.db")
    counted = [t for t in study.trials if "infeasible" not in t.user_attrs]
    assert len([t for t in counted if not is_cut_short(t)]) == trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in counted)
    runs = StudyTracker(tracking_uri or f"sqlite:///{tmp_path}/mlflow.db", study_name).trial_table().to_dict("records")
    assert sorted(int(r["trial"]) for r in runs) == sorted(t.number for t in counted)  # one run each
    # KILLED for a failed trial: a run the driver's death cut short (see search.study.driver.reconcile).
    by_trial = {int(r["trial"]): r for r in runs}
    for trial in counted:
        assert by_trial[trial.number]["status"] in run_statuses(state_of_trial(trial)), trial.number
        assert by_trial[trial.number]["tags.cramnas.state"] == state_of_trial(trial), trial.number
    return study, runs


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with `start_new_session=True` and everything in its session (a
    driver's local Ray processes)."""
    sid = os.getsid(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def trials_in(tmp_path: Path, study_name: str, state: TrialState) -> list[int]:
    """The numbers of the study's trials in `state` now, as a driver writing `tmp_path`/optuna.db
    left them ([] before it created the study)."""
    try:
        study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path}/optuna.db")
    except KeyError:  # not created yet
        return []
    return [t.number for t in study.get_trials(deepcopy=False, states=(state,))]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.5)
