"""The terminal view of a running study: live counts, the best so far, ETA; the top 5 at the end."""

from __future__ import annotations

import contextlib
import sys
import time

from ray.tune import Callback
from rich.console import Console
from rich.live import Live
from rich.table import Table

from search.export import ranked_trials
from search.searcher import Outcome


def describe(arch: dict) -> str:
    """An architecture in one short line: the choices that most tell models apart."""
    return (f"{arch['layers']}x{arch['hidden']}/{arch['heads']}h {arch['ffn_kind']} {arch['norm_placement']}-norm "
            f"{arch['position']}")


class _RunningCounter(Callback):
    def __init__(self, view: StudyView):
        self.view = view

    def __getstate__(self) -> dict:
        return {}  # pickled with the Tuner (see CramnasSearcher.__getstate__); the view stays here

    def on_trial_start(self, iteration, trials, trial, **info):
        self.view.running += 1

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.view.running = max(0, self.view.running - 1)

    on_trial_error = on_trial_complete


class StudyView:
    def __init__(self, plan, study, tracker, already_done: int, remaining: int):
        self.plan, self.study, self.tracker = plan, study, tracker
        self.remaining, self.already_done = remaining, already_done
        self.counts = {"complete": 0, "repeat": 0, "pruned": 0, "failed": 0}
        self.running = 0
        self.best: Outcome | None = None
        self.started = time.monotonic()
        # Not a terminal (a log file, CI): wide enough that the top-5 table keeps run ids whole.
        self.console = Console(width=None if sys.stdout.isatty() else 160)
        self._live: Live | None = None

    def callback(self) -> Callback:
        return _RunningCounter(self)

    def _score(self, outcome: Outcome) -> float | None:
        key = self.plan.objective.metrics[0]
        if key not in outcome.metrics:
            return None
        sign = 1.0 if self.plan.objective.directions[0] == "maximize" else -1.0
        return sign * outcome.metrics[key]

    def record(self, outcome: Outcome) -> None:
        self.counts[outcome.state] += 1
        score = self._score(outcome) if outcome.state in ("complete", "repeat") else None
        if score is not None and (self.best is None or score > self._score(self.best)):
            self.best = outcome
        if outcome.state == "failed":
            self.console.print(f"[red]trial {outcome.number} failed:[/red] {outcome.reason}")
        if self._live:
            self._live.update(self.render())

    def render(self) -> Table:
        finished = sum(self.counts.values())
        elapsed = time.monotonic() - self.started
        eta = elapsed / finished * (self.remaining - finished) if finished else None
        table = Table(title=f"study {self.plan.study}", show_header=False, box=None)
        table.add_row("trials", f"{self.already_done + finished}/{self.plan.trials} done: "
                      f"{self.counts['complete']} complete, {self.counts['repeat']} repeats, "
                      f"{self.counts['pruned']} pruned, {self.counts['failed']} failed; {self.running} running")
        table.add_row("time", f"{elapsed / 60:.1f} min elapsed" + (f", ETA {eta / 60:.1f} min" if eta else ""))
        if self.best:
            key = self.plan.objective.metrics[0]
            table.add_row("best", f"trial {self.best.number}: {key}={self.best.metrics[key]:.4f}  "
                          f"{describe(self.best.proposal.config.to_dict())}")
        return table

    @contextlib.contextmanager
    def live(self):
        with Live(self.render(), console=self.console, refresh_per_second=1, transient=False) as live:
            self._live = live
            try:
                yield
            finally:
                live.update(self.render())
                self._live = None

    def final_table(self, top: int = 5) -> None:
        key = self.plan.objective.metrics[0]
        trials = ranked_trials(self.study, key, "max" if self.plan.objective.directions[0] == "maximize" else "min")
        table = Table(title=f"top {min(top, len(trials))} of study {self.plan.study} by {key}")
        columns = ["trial", key, "val MLM", "tokens/s", "params", "architecture", "MLflow run"]
        if key == "validation_loss":
            columns.remove("val MLM")  # it is the ranking column already
        for column in columns:
            table.add_column(column, no_wrap=True)
        for trial in trials[:top]:
            metrics = trial.user_attrs["metrics"]
            run = self.tracker.find_trial_run(trial.number)
            cells = [str(trial.number), f"{metrics[key]:.4f}", f"{metrics.get('validation_loss', float('nan')):.3f}",
                     f"{metrics.get('tokens_per_s', 0):,.0f}", f"{metrics.get('params', 0) / 1e6:.1f}M",
                     describe(trial.user_attrs["arch"]), run.info.run_id if run else "-"]
            if key == "validation_loss":
                del cells[2]
            table.add_row(*cells)
        self.console.print(table)
        counts = {k: v for k, v in self.counts.items() if v}
        print(f"this session: {counts or 'no trials'}; study store {self.plan.storage}")
        if trials:
            print(f"export the winner:  python -m search.export --study {self.plan.study} "
                  f"--tracking-uri {self.plan.tracking_uri}")
