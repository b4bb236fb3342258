"""Run a checked `Plan` (search.run): open or resume the study, reconcile its two stores, start
Ray, run the remaining trials on Ray Tune, show progress, print the top 5.

The Optuna study is the source of truth. MLflow may be down for a while (a tracking server that
restarts): the driver holds its records and carries on (`search.tracking.PendingWrites`), waits
up to `TRACKING_WAIT_S` at the end for the rest, and if MLflow is still away, says so and exits 1;
`--resume` then writes every missing run from the study (`reconcile`)."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from search import controllers
from search.searcher import CramnasSearcher
from search.tracking import Retry, StudyTracker, TrackingUnavailable
from search.view import StudyView

# Ray's per-trial files (results, logs) go here unless RunConfig is told otherwise (STACK.md).
RAY_RESULTS = Path(tempfile.gettempdir()) / "cramnas-ray"

# How long a driver write retries before MLflow counts as down and its records are held: short,
# since Ray's event loop, and with it every trial, waits on it.
DRIVER_RETRY_S = 10.0
# How long the driver waits at the end of a study for MLflow to take the records it holds.
TRACKING_WAIT_S = 600.0


def reconcile(study, tracker: StudyTracker, train: dict) -> dict[str, int]:
    """After a driver died or gave up on MLflow: trials it left running fail in both stores; a
    finished trial without an MLflow run (the driver died before recording it, or MLflow was down
    until the end) gets one, from the study's record (its final metrics, not its progress curve);
    and any MLflow run whose trial the study had already finished is closed with the study's
    verdict. Nothing is re-run or counted twice: the study is the source of truth for counts."""
    stale = controllers.fail_stale_running(study)
    recorded = {int(number) for number in tracker.trial_runs()["trial"]}
    rebuilt = 0
    trials = study.get_trials(deepcopy=False)  # as they stay below: only MLflow is written
    for trial in trials:
        if trial.number in recorded or not trial.state.is_finished() or "infeasible" in trial.user_attrs:
            continue
        arch = trial.user_attrs.get("arch", {})
        tags = {"controller": study.user_attrs.get("controller"),
                **{key: trial.user_attrs[key] for key in ("generation", "parent_trial", "mutation", "repeat_of")
                   if trial.user_attrs.get(key) is not None}}
        if not arch:  # the driver died before even recording what it had drawn
            tags["fingerprint"] = "unknown"
        tracker.trial_run(trial.number, arch, train, tags)  # RUNNING: closed with the verdict below
        rebuilt += trial.number not in stale
    closed = 0
    for run in tracker.running_trial_runs():
        number = int(run.data.tags[tracker.trial_tag])
        trial = trials[number]
        state = controllers.STATE_NAMES[trial.state]
        if state == "complete" and trial.user_attrs.get("repeat_of") is not None:
            state = "repeat"
        # A run the crash cut short is KILLED; one whose trial had ended gets the study's verdict.
        status = "KILLED" if number in stale else {"failed": "FAILED", "pruned": "KILLED"}.get(state, "FINISHED")
        tracker.finish_trial(run.info.run_id, status, trial.user_attrs.get("metrics", {}),
                             {"status": state, "failure_reason": trial.user_attrs.get("failure_reason")}, {})
        closed += 1
    return {"stale_trials": len(stale), "rebuilt_runs": rebuilt, "closed_runs": closed}


def run_study(plan) -> int:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from search.trial import run_trial

    # Tune's result files are off (records live in MLflow), so its post-run analysis finds none.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)

    study = plan.optuna_study
    if not plan.resume:  # what export needs to write a config that trainer.cram runs unchanged
        study.set_user_attr("train", plan.template["train"])
        study.set_user_attr("budget", plan.budget.text)
    tracker = StudyTracker(plan.tracking_uri, plan.study, retry=Retry(timeout_s=DRIVER_RETRY_S))
    parent_run = tracker.start_study({
        "controller": plan.controller, "objective": plan.objective.name, "space": str(plan.space_path),
        "budget": plan.budget.text, "trials": plan.trials, "code_version": _code_version(),
        "train": plan.template["train"], "probe_tasks": ",".join((plan.template["probe"] or {}).get("tasks", [])),
    })
    if plan.resume:
        fixed = reconcile(study, tracker, plan.template["train"])
        if any(fixed.values()):
            print(f"resume: {fixed['stale_trials']} trials left running by the dead driver marked failed; "
                  f"{fixed['rebuilt_runs']} missing MLflow runs written from the study; "
                  f"{fixed['closed_runs']} MLflow runs closed to match the study")
    counts = controllers.study_counts(study)
    done = counts["complete"] + counts["pruned"] + counts["failed"]
    remaining = plan.trials - done
    print(f"study {plan.study}: {done} of {plan.trials} trials done, {remaining} to run "
          f"(controller {plan.controller}, objective {plan.objective.name}, budget {plan.budget.text}); "
          f"MLflow {plan.tracking_uri}, run {parent_run}")
    view = StudyView(plan, study, tracker, already_done=done, remaining=max(remaining, 0))
    searcher = None
    if remaining > 0:
        if plan.address:
            ray.init(address=plan.address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                     _temp_dir=str(Path(tempfile.gettempdir()) / "cramnas-ray-session"))
        searcher = CramnasSearcher(study, plan.space, plan.objective, tracker, plan.template,
                                   {"controller": plan.controller}, on_outcome=view.record)
        scheduler = FIFOScheduler()
        if plan.early_stop:
            scheduler = ASHAScheduler(time_attr="training_iteration", metric="mlm_loss", mode="min",
                                      max_t=17, grace_period=plan.early_stop["grace_reports"],
                                      reduction_factor=plan.early_stop["reduction_factor"])
        tuner = tune.Tuner(
            tune.with_resources(run_trial, plan.resources),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=remaining,
                                        max_concurrent_trials=plan.max_concurrent, reuse_actors=True),
            run_config=tune.RunConfig(name=f"{plan.study}-{int(time.time())}", storage_path=str(RAY_RESULTS),
                                      verbose=0, callbacks=[view.callback()]),
        )
        try:
            with view.live():
                tuner.fit()
        except KeyboardInterrupt:
            close_tracking(plan, tracker, searcher, "KILLED", wait_s=DRIVER_RETRY_S)  # `--resume` reopens it
            print(f"interrupted: resume with  python -m search.run --study {plan.study} --resume "
                  f"--trials {plan.trials}")
            return 130
        finally:
            ray.shutdown()
    if not close_tracking(plan, tracker, searcher, "FINISHED", wait_s=TRACKING_WAIT_S):
        return 1
    view.final_table()
    return 0


def close_tracking(plan, tracker: StudyTracker, searcher: CramnasSearcher | None, status: str,
                   wait_s: float) -> bool:
    """Write the MLflow records held while it was down, then end the study run. False, with one
    line saying how to recover, if MLflow stays unreachable: every trial is in the study store."""
    try:
        if searcher is not None and searcher.writes.queue:
            print(f"waiting up to {wait_s:.0f} s for MLflow at {plan.tracking_uri} to take "
                  f"{len(searcher.writes.queue)} held records")
            searcher.writes.drain(wait_s)
        tracker.finish_study(status)
    except TrackingUnavailable as error:
        print(f"error: MLflow is unreachable, some trials are not in it yet: {error}; every trial is in the "
              f"study store {plan.storage}: once MLflow is back, `python -m search.run --study {plan.study} "
              f"--resume --trials {plan.trials}` writes them", file=sys.stderr)
        return False
    return True


def _code_version() -> str:
    from trainer.cram import code_version

    return code_version()
