"""`search.run`'s default executor: the study's trials on Ray Tune, on this machine or, with
`--address`, on a Ray cluster. Ray places each trial on the CPUs and GPUs it asks for, reuses its
workers, and stops trials with its ASHA scheduler; `search.study.searcher.CramnasSearcher` keeps every
record, seen by Ray as a `Searcher`.

Everything here imports Ray; nothing else in a study needs it (`search.study.local_executor` runs
without it)."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import Searcher

from search.study.report import ASHA_METRIC
from search.study.resources import auto_cpus_per_trial, concurrency
from search.study.searcher import CramnasSearcher
from search.study.spec import StudyPlan
from search.study.trial import Placement, ShippedData, execute_trial

# Ray's per-trial files (results, logs) go here unless RunConfig is told otherwise (docs/stack.md).
RAY_RESULTS = Path(tempfile.gettempdir()) / "cramnas-ray"


def start_local_ray(num_cpus: int | None = None, num_gpus: int | None = None, session: str = "cramnas-ray-session") -> None:
    """A new local Ray (address="local": never a `ray start` cluster that happens to run here)
    whose workers run at the trials' priority.

    Ray runs its workers at niceness 15 unless told otherwise: a trial then gets a fraction of a
    core beside any ordinary process (measured: 14x fewer tokens/s beside two busy ones), and a
    wall-clock budget measures the neighbours. The trials are this machine's work. (A `ray start`
    cluster should be started with RAY_worker_niceness=0 for the same reason.)"""
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, include_dashboard=False,
             log_to_driver=False, _temp_dir=str(Path(tempfile.gettempdir()) / session))


def early_stopping(early_stop: dict, report_every: float) -> ASHAScheduler:
    """ASHA over a trial's progress reports (`training_iteration` counts them): rungs at
    `grace_reports` x `reduction_factor`^k reports, all among the progress reports, which come only
    while budget is left (`trainer.loop.Trainer.run`), so a trial is stopped before its budget is
    spent or not at all. `max_t` lies half-way between the last progress report and the final one:
    ASHA stops whatever reaches `max_t`, so no progress report may, and its rungs are the
    milestones up to `max_t`; the final report (validation, probe) has no train loss, so ASHA
    leaves it alone. (`search.study.asha.SuccessiveHalving` decides the same without Ray.)"""
    from trainer.loop import max_progress_reports

    return ASHAScheduler(time_attr="training_iteration", metric=ASHA_METRIC, mode="min",
                         max_t=max_progress_reports(report_every) + 0.5, grace_period=early_stop["grace_reports"],
                         reduction_factor=early_stop["reduction_factor"])


def ray_trial(config: dict[str, Any], shipped: ShippedData | None = None) -> None:
    """Ray Tune's function trainable: the trial on the CPUs and GPUs Ray reserved for it."""
    context = ray.get_runtime_context()
    placement = Placement(cpus=context.get_assigned_resources().get("CPU"),
                          gpu_ids=tuple(str(gpu) for gpu in ray.get_gpu_ids()), node=context.get_node_id())
    execute_trial(config, tune.report, placement, shipped)


class TuneSearcher(Searcher):
    """`CramnasSearcher` as Ray Tune's search algorithm."""

    def __init__(self, searcher: CramnasSearcher):
        super().__init__()
        # Not `self.searcher`: Ray takes a searcher with that attribute for a wrapper of another.
        self.cramnas = searcher

    def __getstate__(self) -> dict:
        # Ray pickles the Tuner, searcher included, for its own experiment restore, which cramnas
        # does not use: a study resumes from its stores (`search.run --resume`). The study's
        # storage engine and the terminal view do not pickle, so only the identity travels.
        return {"study_name": self.cramnas.study.study_name}

    def save(self, checkpoint_path: str) -> None:
        pass  # the Optuna study is the searcher's state, saved as it changes (see __getstate__)

    def restore(self, checkpoint_path: str) -> None:
        pass

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # our objective comes from the study, not from Ray's metric/mode

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        return self.cramnas.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.cramnas.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.cramnas.on_trial_complete(trial_id, result, died="Ray reported a trial error" if error else None)


class _RunningCounter(Callback):
    """The view's count of running trials, from Ray's trial events."""

    def __init__(self, view):
        self.view = view

    def __getstate__(self) -> dict:
        return {}  # pickled with the Tuner (see TuneSearcher.__getstate__); the view stays here

    def on_trial_start(self, iteration, trials, trial, **info):
        self.view.trial_started()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.view.trial_ended()

    on_trial_error = on_trial_complete


def run_on_ray(plan: StudyPlan, searcher: CramnasSearcher, view, early_stop: dict | None, remaining: int) -> None:
    """Run `remaining` trials on Ray Tune (a local Ray, or the cluster at `plan.address`), at most as
    many at once as their resources fit (`search.study.resources.concurrency`)."""
    from trainer.data import entry_files

    # Tune's result files are off (records live in MLflow), so its post-run analysis finds none.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    if plan.address:
        ray.init(address=plan.address, log_to_driver=False)
    else:
        start_local_ray()
    try:
        placeable = ray.cluster_resources()  # this machine's, or the cluster's with --address
        if plan.resources["cpu"] is None:  # `cpus_per_trial: auto` with --address: the cluster's CPUs per GPU
            plan.resources["cpu"] = auto_cpus_per_trial(placeable.get("CPU", 1), placeable.get("GPU", 0),
                                                        plan.resources["gpu"])
        concurrent = concurrency(plan.resources, {"cpu": placeable.get("CPU", 1), "gpu": placeable.get("GPU", 0)},
                                 plan.max_concurrent, lambda line: print(line, file=sys.stderr))
        shipped = None
        if plan.address:  # other nodes may lack the driver's cache: each fetches the data once (ShippedData)
            shipped = ShippedData(ray.put(entry_files(plan.template.data_fingerprint, plan.template.cache_dir)))
        scheduler = early_stopping(early_stop, plan.template.train.report_every) if early_stop else FIFOScheduler()
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(ray_trial, shipped=shipped), plan.resources),
            tune_config=tune.TuneConfig(search_alg=TuneSearcher(searcher), scheduler=scheduler, num_samples=remaining,
                                        max_concurrent_trials=concurrent, reuse_actors=True),
            run_config=tune.RunConfig(name=f"{plan.study}-{int(time.time())}", storage_path=str(RAY_RESULTS),
                                      verbose=0, callbacks=[_RunningCounter(view)]),
        )
        tuner.fit()
    finally:
        ray.shutdown()
