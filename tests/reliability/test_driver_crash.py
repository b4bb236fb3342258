"""The study driver SIGKILLed mid-study (its Ray processes, or the local executor's, with it), twice, then `--resume`: the
study reaches exactly its requested total of trials with results, both stores agree, no run is
left RUNNING, and every architecture the dead drivers left in flight is trained again, once, in a
new trial linked to the one cut short."""

from __future__ import annotations

import subprocess
import sys

import pytest
from optuna.trial import TrialState

from search.run import main
from search.study.controllers import is_cut_short
from tests.helpers import cli_env, requires_shared_data
from tests.studies import check_stores_agree, kill_session, study_args, trials_in, wait_for


def _drawn(tmp_path, numbers: list[int]) -> list[int]:
    """Those of `numbers` whose architecture was drawn: a driver can die inside `ask`, before the draw,
    and such a trial has nothing to re-run."""
    import optuna

    study = optuna.load_study(study_name="killed", storage=f"sqlite:///{tmp_path}/optuna.db")
    return [t.number for t in study.get_trials(deepcopy=False) if t.number in numbers and "arch" in t.user_attrs]


def _reruns_asked(tmp_path) -> bool:
    """The resumed driver has handed out a re-run (its reconcile and re-queue are done)."""
    import optuna

    study = optuna.load_study(study_name="killed", storage=f"sqlite:///{tmp_path}/optuna.db")
    return any(t.user_attrs.get("rerun_of") is not None and t.state != TrialState.WAITING
               for t in study.get_trials(deepcopy=False))


@requires_shared_data
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("executor", ["ray", "local"])
def test_driver_killed_twice_resumes_to_the_exact_total_re_running_what_was_in_flight(
        executor, wiki_slice_dir, slice_cache, tmp_path, capsys):
    args = study_args(tmp_path, wiki_slice_dir, "killed", "--trials", "8", "--controller", "tpe",
                      "--objective", "mlm", "--no-probe", "--no-early-stop", "--executor", executor,
                      cache_dir=slice_cache)

    def driver(*extra: str, log: str | None = None) -> subprocess.Popen:
        out = open(tmp_path / log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, "-m", "search.run", *args, *extra], cwd=tmp_path, env=cli_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    proc = driver()
    try:  # kill once some trials are done and others running
        wait_for(lambda: (len(trials_in(tmp_path, "killed", TrialState.COMPLETE)) >= 3
                          and trials_in(tmp_path, "killed", TrialState.RUNNING)), 240, "three complete trials and a running one")
    finally:
        kill_session(proc)
    finished = [n for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
                for n in trials_in(tmp_path, "killed", state)]
    first_cut = trials_in(tmp_path, "killed", TrialState.RUNNING)  # what the driver's death cut short
    assert len(finished) < 8 and first_cut, (finished, first_cut)

    proc = driver("--resume", log="second.log")
    try:  # kill again once it trains again: re-runs asked, a trial running
        wait_for(lambda: _reruns_asked(tmp_path) and trials_in(tmp_path, "killed", TrialState.RUNNING), 240,
                 "a re-run handed out and a trial running")
    finally:
        kill_session(proc)
    second_cut = trials_in(tmp_path, "killed", TrialState.RUNNING)
    assert f"resuming: {len(_drawn(tmp_path, first_cut))} trials the driver left running are re-run with the same " \
        "architectures" in (tmp_path / "second.log").read_text()

    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    third = capsys.readouterr().out
    study, runs = check_stores_agree(tmp_path, "killed", 8)
    trials = study.trials
    cut = [t for t in trials if is_cut_short(t)]
    assert [t.number for t in cut] == sorted(first_cut + second_cut)
    # The driver may die inside `ask`, before the draw: nothing was in flight, unless the trial is a
    # queued re-run, whose architecture was fixed when it was queued.
    in_flight = [t for t in cut if "arch" in t.user_attrs or t.user_attrs.get("rerun_of") is not None]
    assert (f"resuming: {len([t for t in in_flight if t.number in second_cut])} trials the driver left running"
            in third) == any(t.number in second_cut for t in in_flight)
    assert all(t.state != TrialState.FAIL or is_cut_short(t) for t in trials)  # no other failure

    run_of = {int(r["trial"]): r for r in runs}
    rerun_of = {t.number: t.user_attrs["rerun_of"] for t in trials if t.user_attrs.get("rerun_of") is not None}
    assert sorted(rerun_of.values()) == [t.number for t in in_flight]  # each re-run once, nothing else

    def drawn(trial):  # the trial of its chain of re-runs that drew the architecture
        while "arch" not in trial.user_attrs:
            trial = trials[trial.user_attrs["rerun_of"]]
        return trial

    for number, original in rerun_of.items():
        rerun = trials[number]
        if "arch" in rerun.user_attrs:  # not cut short inside `ask`, so with every parameter
            assert rerun.params == drawn(trials[original]).params
            assert rerun.user_attrs["fingerprint"] == drawn(trials[original]).user_attrs["fingerprint"]
        tags = run_of[number]
        assert (tags["tags.cramnas.rerun_of"], tags["tags.cramnas.rerun_of_run_id"]) == \
            (str(original), run_of[original]["run_id"])
    re_run = {original: number for number, original in rerun_of.items()}
    for trial in in_flight:  # its architecture is trained, by its re-run or the re-run's own re-run
        last = trial
        while is_cut_short(last):
            last = trials[re_run[last.number]]
        assert last.state == TrialState.COMPLETE and last.user_attrs["fingerprint"] == drawn(trial).user_attrs["fingerprint"]
    assert all(r["status"] == "KILLED" for r in runs if int(r["trial"]) in {t.number for t in cut})

    # A finished study resumed again: nothing re-run twice, nothing added.
    assert main([*args, "--resume"]) == 0
    assert "resuming:" not in capsys.readouterr().out
    again, _ = check_stores_agree(tmp_path, "killed", 8)
    assert len(again.trials) == len(trials)
