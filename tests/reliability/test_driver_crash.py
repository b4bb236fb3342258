"""The study driver SIGKILLed mid-study (its Ray processes with it), then `--resume`: the study
reaches exactly its requested total and both stores agree, with no run left RUNNING."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from search.run import main
from tests.conftest import requires_shared_data
from tests.studies import ROOT, check_stores_agree, kill_session, study_args


@requires_shared_data
def test_driver_killed_mid_study_resumes_to_the_exact_total(wiki_slice_dir, slice_cache, tmp_path):
    args = study_args(tmp_path, wiki_slice_dir, "killed", "--trials", "8", "--controller", "tpe",
                      "--objective", "mlm", "--no-probe", "--no-early-stop", cache_dir=slice_cache)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:  # kill once some trials are done and others running
            time.sleep(0.5)
            try:
                study = optuna.load_study(study_name="killed", storage=storage)
            except KeyError:  # not created yet
                continue
            if len(study.get_trials(states=(TrialState.COMPLETE,))) >= 3:
                break
        else:
            pytest.fail("the study made no progress")
    finally:
        kill_session(proc)
    before = optuna.load_study(study_name="killed", storage=storage)
    assert len([t for t in before.trials if t.state.is_finished()]) < 8
    assert main([*args, "--resume"]) == 0
    study, runs = check_stores_agree(tmp_path, "killed", 8)
    died = [t.number for t in study.trials if t.user_attrs.get("failure_reason") == "driver died"]
    assert all(r["status"] == "KILLED" for r in runs if int(r["trial"]) in died)
    assert all(t.user_attrs.get("failure_reason") == "driver died" for t in study.trials if t.state == TrialState.FAIL)
