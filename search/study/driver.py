"""Run a checked `StudyPlan` (search.run): open or resume the study, reconcile its two stores, run
the remaining trials on its executor (Ray Tune, `search.study.ray_executor`, or this machine's own
processes, `search.study.local_executor`), show progress, print the top 5.

The Optuna study is the source of truth. MLflow may be down for a while (a tracking server that
restarts): the driver holds its records and carries on (`search.tracking.tracker.PendingWrites`), waits
up to `TRACKING_WAIT_S` at the end for the rest, and if MLflow is still away, says so and exits 1;
`--resume` then writes every missing run from the study (`reconcile`)."""

from __future__ import annotations

import dataclasses
import sys

import optuna

from search.base import attrs
from search.base import tags as tag
from search.base.states import COMPLETE, FAILED, PRUNED, state_of_trial
from search.study import controllers
from search.study.next_steps import data_settings
from search.study.searcher import CramnasSearcher
from search.study.spec import StudyPlan
from search.study.view import StudyView, references_text
from search.study.warm_start import describe_first_draw
from search.tracking.retry import Retry, TrackingUnavailable
from search.tracking.tracker import StudyTracker
from trainer.console import count

# How long a driver write retries before MLflow counts as down and its records are held: short,
# since Ray's event loop, and with it every trial, waits on it.
DRIVER_RETRY_S = 10.0
# How long the driver waits at the end of a study for MLflow to take the records it holds.
TRACKING_WAIT_S = 600.0


def reconcile(study: optuna.Study, tracker: StudyTracker, train: dict) -> dict[str, int]:
    """After a driver died or gave up on MLflow: trials it left running fail in both stores; a
    finished trial without an MLflow run (the driver died before recording it, or MLflow was down
    until the end) gets one, from the study's record (its final metrics, not its progress curve);
    and any MLflow run whose trial the study had already finished is closed with the study's
    verdict. Nothing is counted twice: the study is the source of truth for counts. (The
    architectures the dead driver left in flight are re-run by `controllers.rerun_cut_short`.)"""
    stale = controllers.fail_stale_running(study)
    recorded = {int(number) for number in tracker.trial_table()["trial"]}
    rebuilt = 0
    trials = study.get_trials(deepcopy=False)  # as they stay below: only MLflow is written
    for trial in trials:
        if trial.number in recorded or not trial.state.is_finished() or attrs.INFEASIBLE in trial.user_attrs:
            continue
        arch = trial.user_attrs.get(attrs.ARCH, {})
        tags = {attrs.CONTROLLER: study.user_attrs.get(attrs.CONTROLLER),
                **{key: trial.user_attrs[key] for key in (*attrs.LINEAGE, attrs.REPEAT_OF, attrs.RERUN_OF)
                   if trial.user_attrs.get(key) is not None}}
        # "unknown": the driver died before even recording what it had drawn.
        fingerprint = trial.user_attrs.get(attrs.FINGERPRINT, "unknown")
        tracker.open_trial_run(trial.number, arch, train, fingerprint, tags)  # RUNNING: closed with the verdict below
        rebuilt += trial.number not in stale
    closed = 0
    for run in tracker.running_trial_runs():
        number = int(run.data.tags[tag.TRIAL_NUMBER])
        trial = trials[number]
        # A run the crash cut short ends KILLED; one whose trial had ended gets the study's verdict.
        tracker.finish_run(run.info.run_id, state_of_trial(trial), trial.user_attrs.get(attrs.METRICS, {}),
                           reason=trial.user_attrs.get(attrs.FAILURE_REASON), cut_short=number in stale)
        closed += 1
    return {"stale_trials": len(stale), "rebuilt_runs": rebuilt, "closed_runs": closed}


def early_stop_for_session(early_stop: dict | None, trials: int) -> tuple[dict | None, str | None]:
    """The ASHA settings for a session of `trials` trials, and the line that says early stopping is
    off when there are too few of them for its rungs (`early_stop["min_trials"]`, search.run)."""
    if early_stop is None or trials >= early_stop["min_trials"]:
        return early_stop, None
    return None, (f"early stopping off: {count(trials, 'trial')} {'is' if trials == 1 else 'are'} too few to stop "
                  f"any (ASHA from {early_stop['min_trials']})")


def run_study(plan: StudyPlan) -> int:
    study = plan.optuna_study
    train = plan.template.train.to_dict()
    if not plan.resume:  # what export needs to write a config that trainer.cram runs unchanged
        study.set_user_attr(attrs.TRAIN, train)
        study.set_user_attr(attrs.BUDGET, plan.budget.text)
    tracker = StudyTracker(plan.tracking_uri, plan.study, retry=Retry(timeout_s=DRIVER_RETRY_S))
    parent_run = tracker.start_study({
        attrs.CONTROLLER: plan.controller, attrs.OBJECTIVE: plan.objective.name, attrs.SPACE: str(plan.space_path),
        attrs.BUDGET: plan.budget.text, "trials": plan.trials, "code_version": _code_version(),
        "train": train, **probe_settings(plan),
        # Where the data came from, so that the next commands can say it again (search.study.next_steps).
        **data_settings(plan.template.data_dir, plan.template.corpus, plan.template.cache_dir),
        # A property of the prepared data, so the study's once (tag and param): the report's header reads it.
        **{name: round(value, 4) for name in ("unigram_floor", "corruption_floor", "context_reference")
           if (value := getattr(plan, name)) is not None},
    })
    if plan.resume:
        fixed = reconcile(study, tracker, train)
        if any(fixed.values()):
            print(f"resume: {fixed['stale_trials']} trials left running by the dead driver marked failed; "
                  f"{fixed['rebuilt_runs']} missing MLflow runs written from the study; "
                  f"{fixed['closed_runs']} MLflow runs closed to match the study")
    counts = controllers.study_counts(study)
    done = sum(counts[state] for state in (COMPLETE, PRUNED, FAILED))  # trials cut short count apart
    remaining = plan.trials - done
    if plan.resume:  # the architectures a dead driver left in flight are trained first
        rerun = controllers.rerun_cut_short(study, remaining)
        if rerun:
            print(f"resuming: {len(rerun)} trials the driver left running are re-run with the same "
                  f"architectures (trials {', '.join(map(str, rerun))}, failed \"{controllers.DRIVER_DIED}\")")
    print(f"study {plan.study}: {done} of {plan.trials} trials done, {remaining} to run "
          f"(controller {plan.controller}, objective {plan.objective.name}, budget {plan.budget.text}"
          f"; {references_text(plan)}); "
          f"MLflow {plan.tracking_uri}, run {parent_run}")
    first = describe_first_draw(study)
    if first and remaining > 0:
        print(first)
    view = StudyView(plan, study, tracker, already_done=done, remaining=max(remaining, 0))
    searcher = None
    if remaining > 0:
        if plan.executor == "local":
            from search.study.local_executor import run_locally as execute
        else:
            from search.study.ray_executor import run_on_ray as execute
        searcher = CramnasSearcher(study, plan.space, plan.objective, tracker, plan.template,
                                   {attrs.CONTROLLER: plan.controller}, on_outcome=view.record)
        early_stop, off = early_stop_for_session(plan.early_stop, remaining)
        if off:
            print(off)
        try:
            with view.live():
                execute(plan, searcher, view, early_stop, remaining)
        except KeyboardInterrupt:
            close_tracking(plan, tracker, searcher, "KILLED", wait_s=DRIVER_RETRY_S)  # `--resume` reopens it
            print(f"interrupted: resume with  {plan.resume_command()}")
            return 130
    if not close_tracking(plan, tracker, searcher, "FINISHED", wait_s=TRACKING_WAIT_S):
        return 1
    view.final_table()
    return 0


def probe_settings(plan: StudyPlan) -> dict:
    """The probe as the study records it (`probe_tasks`, `probe_limits.*` params), so that
    search.confirm probes exactly as the study did: every limit, defaults included, but the data
    directory and the seed, which are each confirmation's own."""
    import glue

    probe = plan.template.probe
    if probe is None:
        return {"probe_tasks": ""}
    limits = dataclasses.asdict(glue.ProbeLimits(**probe.limits))
    return {"probe_tasks": ",".join(probe.tasks),
            "probe_limits": {key: value for key, value in limits.items() if key not in ("data_dir", "seed")}}


def close_tracking(plan: StudyPlan, tracker: StudyTracker, searcher: CramnasSearcher | None, status: str,
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
              f"study store {plan.storage}: once MLflow is back, `{plan.resume_command()}` writes them", file=sys.stderr)
        return False
    return True


def _code_version() -> str:
    from trainer.cram import code_version

    return code_version()
