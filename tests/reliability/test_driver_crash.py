"""The study driver SIGKILLed mid-study (its Ray processes with it), then `--resume`: the study
reaches exactly its requested total and both stores agree, with no run left RUNNING."""

from __future__ import annotations

import subprocess
import sys

import pytest
from optuna.trial import TrialState

from search.run import main
from tests.helpers import cli_env, requires_shared_data
from tests.studies import check_stores_agree, kill_session, study_args, trials_in, wait_for


@requires_shared_data
@pytest.mark.slow
@pytest.mark.subprocess
def test_driver_killed_mid_study_resumes_to_the_exact_total(wiki_slice_dir, slice_cache, tmp_path):
    args = study_args(tmp_path, wiki_slice_dir, "killed", "--trials", "8", "--controller", "tpe",
                      "--objective", "mlm", "--no-probe", "--no-early-stop", cache_dir=slice_cache)
    proc = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # kill once some trials are done and others running
        wait_for(lambda: (len(trials_in(tmp_path, "killed", TrialState.COMPLETE)) >= 3
                          and trials_in(tmp_path, "killed", TrialState.RUNNING)), 240, "three complete trials and a running one")
    finally:
        kill_session(proc)
    finished = [n for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                for n in trials_in(tmp_path, "killed", state)]
    running = trials_in(tmp_path, "killed", TrialState.RUNNING)  # what the driver's death cut short
    assert len(finished) < 8 and running, (finished, running)
    assert main([*args, "--resume"]) == 0
    study, runs = check_stores_agree(tmp_path, "killed", 8)
    died = [t.number for t in study.trials if t.user_attrs.get("failure_reason") == "driver died"]
    assert died == running
    assert all(r["status"] == "KILLED" for r in runs if int(r["trial"]) in died)
    assert all(t.user_attrs.get("failure_reason") == "driver died" for t in study.trials if t.state == TrialState.FAIL)
