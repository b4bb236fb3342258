"""`search.run --executor local`: the study's trials on this machine without Ray.

Each of the trials that run at once has a slot (`search.resources.concurrency`: as many as their
CPUs and GPUs fit here), with its CPUs, its GPUs or its share of one, and a worker process of its
own: spawned, so that no CUDA or thread state of the driver leaks into it, and kept for the slot's
next trial, as Ray keeps its actors (`reuse_actors`), so that a trial does not pay for importing
torch again (measured: 11 s a trial on the busy 2-core machine, against Ray's 0.9 s). A trial that
crashes its worker (a segfault, the kernel's OOM killer, `kill -9`) fails alone, with its reason,
as a Ray worker's death does, and the slot's next trial gets a new worker.

The worker sends each report through a pipe and waits at each progress report for the driver's
word: go on, or stop (early stopping by `search.study.asha`, which decides as Ray's ASHA does). A
stopped trial hands its memory back before the worker says it is done. Records, resume and the
trial's own code are the Ray executor's (`search.study.searcher`, `search.study.driver`,
`search.study.trial`): only the placing of trials differs.

What it needs beside torch: Optuna, MLflow's tracking client and its SQLite store, the data
libraries; not Ray, whose wheel is what a GPU machine without a package index cannot be given."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from search.study.asha import SuccessiveHalving
from search.study.report import ASHA_METRIC, FINAL
from search.study.searcher import CramnasSearcher
from search.study.spec import StudyPlan
from search.study.trial import Placement

GO, STOP, STOPPED = "go", "stop", "stopped"
EXIT_WAIT_S = 30.0  # how long an idle worker may take to exit at the end of a session


class TrialStopped(BaseException):
    """Raised in a worker at the report where early stopping ends its trial: a BaseException, so
    that the trial's `except Exception` does not record it as a failure."""


def worker(pipe: Connection, placement: Placement) -> None:
    """A slot's process: its CPUs and GPU set once, then `search.study.trial.execute_trial` for each
    trial config it is sent, until it is sent None."""
    import torch

    from search.study.trial import execute_trial

    # Ctrl-C reaches the whole process group: the driver alone answers it, ending its workers and
    # leaving their trials RUNNING for --resume, as with Ray; a worker would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if placement.cpus:
        torch.set_num_threads(max(1, int(placement.cpus)))
    if placement.gpu_ids:
        torch.cuda.set_device(int(placement.gpu_ids[0]))  # `cuda` is then the trial's own (trial_device)

    def report(result: dict[str, Any]) -> None:
        pipe.send(result)
        if not result.get(FINAL) and pipe.recv() == STOP:
            raise TrialStopped

    while (config := pipe.recv()) is not None:
        try:
            execute_trial(config, report, placement)
        except TrialStopped:  # execute_trial has freed the trial's memory on its way out
            pipe.send(STOPPED)
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
class Slot:
    """One trial at a time, on its placement, in its worker (None until started, or after it died)."""

    placement: Placement
    process: multiprocessing.Process | None = None
    pipe: Connection | None = None
    trial_id: str | None = None  # the trial it runs; None while idle
    reports: int = 0
    stopped: bool = False

    def start_worker(self, spawn) -> None:
        ours, theirs = spawn.Pipe()
        self.process = spawn.Process(target=worker, args=(theirs, self.placement), daemon=True,
                                     name=f"cramnas-worker-{','.join(self.placement.gpu_ids) or 'cpu'}")
        self.process.start()
        theirs.close()  # the worker's end: once it exits, reading ours raises EOFError
        self.pipe = ours

    def run(self, trial_id: str, config: dict[str, Any]) -> None:
        self.pipe.send(config)
        self.trial_id, self.reports, self.stopped = trial_id, 0, False

    def ended(self) -> None:
        self.trial_id = None

    def lost_worker(self) -> None:
        self.process.join()
        self.pipe.close()
        self.process = self.pipe = None


def run_locally(plan: StudyPlan, searcher: CramnasSearcher, view, early_stop: dict | None, remaining: int) -> None:
    """Run `remaining` trials here, at most as many at once as their resources fit."""
    from search.study.resources import concurrency, local_gpus
    from trainer.loop import max_progress_reports

    gpus = local_gpus() if plan.resources["gpu"] > 0 else 0
    count = concurrency(plan.resources, {"cpu": os.cpu_count() or 1, "gpu": gpus}, plan.max_concurrent,
                        lambda line: print(line, file=sys.stderr))
    slots = [Slot(Placement(cpus=plan.resources["cpu"], gpu_ids=slot_gpus(index, plan.resources["gpu"])))
             for index in range(count)]
    asha = None
    if early_stop:
        asha = SuccessiveHalving(early_stop["grace_reports"], early_stop["reduction_factor"],
                                 max_progress_reports(plan.template.train.report_every) + 0.5)
    spawn = multiprocessing.get_context("spawn")
    started = 0
    try:
        while started < remaining or any(slot.trial_id for slot in slots):
            for slot in slots:
                if slot.trial_id is None and started < remaining:
                    if slot.process is None:
                        slot.start_worker(spawn)
                    trial_id = f"local_{started}"
                    slot.run(trial_id, searcher.suggest(trial_id))
                    started += 1
                    view.trial_started()
            busy = [slot for slot in slots if slot.trial_id]
            ready = set(wait([slot.pipe for slot in busy]))
            for slot in busy:
                if slot.pipe in ready and _handle(slot, searcher, asha):
                    slot.ended()
                    view.trial_ended()
    finally:
        _close(slots)


def _handle(slot: Slot, searcher: CramnasSearcher, asha: SuccessiveHalving | None) -> bool:
    """Read the slot's next message and act on it: whether its trial has ended."""
    try:
        message = slot.pipe.recv()
    except EOFError:  # the worker is gone
        slot.process.join()
        code = slot.process.exitcode
        slot.lost_worker()
        if slot.stopped:  # stopped, and gone while freeing its memory: still stopped early
            searcher.on_trial_complete(slot.trial_id)
        else:
            searcher.on_trial_complete(slot.trial_id, died=f"its process exited with code {code} before its final report")
        return True
    if message == STOPPED:
        searcher.on_trial_complete(slot.trial_id)  # its last progress report is its end: pruned
        return True
    if message.get(FINAL):
        searcher.on_trial_complete(slot.trial_id, message)
        return True
    slot.reports += 1
    searcher.on_trial_result(slot.trial_id, message)
    slot.stopped = asha is not None and asha.should_stop(slot.trial_id, slot.reports, message[ASHA_METRIC])
    slot.pipe.send(STOP if slot.stopped else GO)
    return False


def _close(slots: list[Slot]) -> None:
    """Idle workers are told to exit; a worker still running a trial (the driver stops: Ctrl-C, an
    error) is killed, its trial left RUNNING for `--resume`."""
    for slot in slots:
        if slot.process is None:
            continue
        if slot.trial_id is None:
            try:
                slot.pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
            slot.process.join(EXIT_WAIT_S)
        if slot.process.is_alive():
            slot.process.kill()
        slot.lost_worker()
