"""`search.run --executor local`: the study's trials on this machine without Ray.

Each trial runs in a process of its own (spawned, so no CUDA or thread state of the driver leaks
into it), as many at once as their CPUs and GPUs fit here (`search.resources.concurrency`). A trial
that crashes its process (a segfault, the kernel's OOM killer, `kill -9`) fails alone, with its
reason, as a Ray worker's death does. The worker sends each report through a pipe and waits at each
progress report for the driver's word: go on, or stop (early stopping by `search.asha`, which
decides as Ray's ASHA does). Records, resume and the trial's own code are the Ray executor's
(`search.searcher`, `search.study`, `search.trial`): only the placing of trials differs.

What it needs beside torch: Optuna, MLflow's tracking client and its SQLite store, the data
libraries; not Ray, whose wheel is what a GPU machine without a package index cannot be given."""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from search.asha import SuccessiveHalving
from search.report import ASHA_METRIC, FINAL
from search.searcher import CramnasSearcher
from search.spec import StudyPlan
from search.trial import Placement

GO, STOP = "go", "stop"


class TrialStopped(BaseException):
    """Raised in a worker at the report where early stopping ends its trial: a BaseException, so
    that the trial's `except Exception` does not record it as a failure."""


def worker(config: dict[str, Any], pipe: Connection, placement: Placement) -> None:
    """A trial's process: its CPUs and GPU set, then `search.trial.execute_trial`."""
    import torch

    from search.trial import execute_trial

    if placement.cpus:
        torch.set_num_threads(max(1, int(placement.cpus)))
    if placement.gpu_ids:
        torch.cuda.set_device(int(placement.gpu_ids[0]))  # `cuda` is then the trial's own (trial_device)

    def report(result: dict[str, Any]) -> None:
        pipe.send(result)
        if not result.get(FINAL) and pipe.recv() == STOP:
            raise TrialStopped

    try:
        execute_trial(config, report, placement)
    except TrialStopped:
        pass
    finally:
        pipe.close()


def slot_gpus(slot: int, gpus_per_trial: float) -> tuple[str, ...]:
    """The GPU ids of the `slot`-th trial running at once: whole GPUs of its own, or a share of one
    (0.5 GPU a trial: slots 0 and 1 on GPU 0)."""
    if gpus_per_trial <= 0:
        return ()
    if gpus_per_trial >= 1:
        whole = int(gpus_per_trial)
        return tuple(str(gpu) for gpu in range(slot * whole, (slot + 1) * whole))
    return (str(int(slot * gpus_per_trial)),)


@dataclass
class Running:
    trial_id: str
    slot: int
    process: multiprocessing.Process
    pipe: Connection
    reports: int = 0
    stopped: bool = False
    ended: bool = False


def run_locally(plan: StudyPlan, searcher: CramnasSearcher, view, early_stop: dict | None, remaining: int) -> None:
    """Run `remaining` trials here, at most as many at once as their resources fit."""
    from search.resources import concurrency, local_gpus
    from trainer.loop import max_progress_reports

    gpus = local_gpus() if plan.resources["gpu"] > 0 else 0
    slots = concurrency(plan.resources, {"cpu": os.cpu_count() or 1, "gpu": gpus}, plan.max_concurrent,
                        lambda line: print(line, file=sys.stderr))
    asha = None
    if early_stop:
        asha = SuccessiveHalving(early_stop["grace_reports"], early_stop["reduction_factor"],
                                 max_progress_reports(plan.template.train.report_every) + 0.5)
    spawn = multiprocessing.get_context("spawn")
    running: dict[str, Running] = {}
    started = 0
    try:
        while started < remaining or running:
            free = sorted(set(range(slots)) - {trial.slot for trial in running.values()})
            while started < remaining and free:
                trial_id = f"local_{started}"
                config = searcher.suggest(trial_id)
                slot = free.pop(0)
                placement = Placement(cpus=plan.resources["cpu"], gpu_ids=slot_gpus(slot, plan.resources["gpu"]))
                ours, theirs = spawn.Pipe()
                process = spawn.Process(target=worker, args=(config, theirs, placement), name=f"cramnas-{trial_id}",
                                        daemon=True)
                process.start()
                theirs.close()  # the worker's end: once it exits, reading ours raises EOFError
                running[trial_id] = Running(trial_id, slot, process, ours)
                started += 1
                view.trial_started()
            for trial in _next_events(running):
                _handle(trial, searcher, asha)
                if trial.ended:
                    del running[trial.trial_id]
                    view.trial_ended()
    finally:  # the driver stops (Ctrl-C, an error): its trials stop with it, left RUNNING for --resume
        for trial in running.values():
            trial.process.kill()
            trial.process.join()


def _next_events(running: dict[str, Running]) -> list[Running]:
    """The running trials with something to read (a report, or the end of their pipe)."""
    ready = set(wait([trial.pipe for trial in running.values()]))
    return [trial for trial in running.values() if trial.pipe in ready]


def _handle(trial: Running, searcher: CramnasSearcher, asha: SuccessiveHalving | None) -> None:
    try:
        result = trial.pipe.recv()
    except EOFError:  # the worker's end closed: it exited
        trial.process.join()
        if trial.stopped:
            searcher.on_trial_complete(trial.trial_id)  # its last progress report is its end: pruned
        else:
            searcher.on_trial_complete(trial.trial_id, died=f"its process exited with code {trial.process.exitcode} "
                                                            "before its final report")
        trial.pipe.close()
        trial.ended = True
        return
    if result.get(FINAL):
        trial.process.join()
        trial.pipe.close()
        searcher.on_trial_complete(trial.trial_id, result)
        trial.ended = True
        return
    trial.reports += 1
    searcher.on_trial_result(trial.trial_id, result)
    trial.stopped = asha is not None and asha.should_stop(trial.trial_id, trial.reports, result[ASHA_METRIC])
    trial.pipe.send(STOP if trial.stopped else GO)
