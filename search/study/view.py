"""The terminal view of a running study: live counts, the best so far, ETA; the top 5 at the end.
Each loss is shown beside the corruption floor and its regime (trainer/references.py,
trainer/regimes.py), so a trial that learned nothing beyond frequencies and copying reads as such;
a trial recorded before those existed, beside the unigram floor."""

from __future__ import annotations

import contextlib
import sys
import time

import optuna
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from search.analysis.ranking import ranked_trials
from search.base import attrs
from search.base.states import COMPLETE, FAILED, PRUNED, REPEAT
from search.study.searcher import TrialOutcome
from search.study.spec import StudyPlan
from search.study.stopped import study_rung_ranking
from search.study.warm_start import search_verdict
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from trainer.console import duration, eta, floor_gap, is_terminal
from trainer.regimes import regime_of

# A log's width (a terminal's is its own): the final table's full MLflow run ids and an architecture
# such as "3x112/2h geglu pre-norm rotary window 16/global every 3" fit on one line each.
TABLE_WIDTH = 160


def floor_text(floor: float | None) -> str:
    """A reference loss as the terminal shows it; n/a for a study without one."""
    return "n/a" if floor is None else f"{floor:.3f} nats"


def references_text(plan: StudyPlan) -> str:
    """The references every trial's loss is read against, in one line."""
    if plan.corruption_floor is None:  # a plan of data prepared before the references existed
        return f"unigram floor {floor_text(plan.unigram_floor)}"
    return (f"corruption floor {floor_text(plan.corruption_floor)} (learned nothing), two-neighbour count model "
            f"{floor_text(plan.context_reference)}, unigram floor {floor_text(plan.unigram_floor)}")


def below_floor(metrics: dict[str, float], unit: str = " nats", short: bool = False) -> str:
    """How far a trial's validation loss ended from the corruption floor, in words (`0.481 nats
    below the corruption floor`), or, recorded before it existed, from the unigram floor; `short`:
    without naming the floor, for the table's column of the corruption floor."""
    for key, floor in (("nats_below_floor", "corruption floor"), ("nats_below_unigram", "unigram floor")):
        if key in metrics:
            gap = floor_gap(metrics[key], unit=unit)
            return gap if short and key == "nats_below_floor" else f"{gap} the {floor}"
    return "n/a"


class StudyView:
    def __init__(self, plan: StudyPlan, study: optuna.Study, tracker: StudyTracker, already_done: int, remaining: int):
        self.plan, self.study, self.tracker = plan, study, tracker
        self.remaining, self.already_done = remaining, already_done
        self.counts = dict.fromkeys((COMPLETE, REPEAT, PRUNED, FAILED), 0)
        self.running = 0
        self.best: TrialOutcome | None = None
        self.started = time.monotonic()
        # A terminal gets the live view; a log file or pipe one plain line per finished trial.
        self.terminal = is_terminal(sys.stdout)
        self.console = Console(width=None if self.terminal else TABLE_WIDTH)
        self._live: Live | None = None

    def trial_started(self) -> None:
        self.running += 1

    def trial_ended(self) -> None:
        self.running = max(0, self.running - 1)

    def _key(self, outcome: TrialOutcome) -> float | None:
        """The outcome's sort key by the objective (lower is better); None without its metric."""
        value = outcome.metrics.get(self.plan.objective.rank_metric)
        return None if value is None else self.plan.objective.sort_key(value)

    def record(self, outcome: TrialOutcome) -> None:
        self.counts[outcome.state] += 1
        key = self._key(outcome) if outcome.state in (COMPLETE, REPEAT) else None
        if key is not None and (self.best is None or key < self._key(self.best)):
            self.best = outcome
        if not self.terminal:
            print(self.trial_line(outcome), flush=True)
        elif outcome.state == FAILED:
            self.console.print(f"[red]trial {outcome.number} failed:[/red] {outcome.reason}")
        if self._live:
            self._live.update(self.render())

    def trial_line(self, outcome: TrialOutcome) -> str:
        """One finished trial as a log line: `trial 3 complete: 4x256/4h geglu pre-norm rotary;
        validation_loss 6.1234, 0.481 nats below the corruption floor; regime neighbours [4/8 done, ETA 3.2 min]`."""
        key = self.plan.objective.rank_metric
        line = f"trial {outcome.number}{first_draw_mark(outcome.proposal)} {outcome.state}: " \
               f"{outcome.proposal.config.describe()}"
        if key in outcome.metrics:
            line += f"; {key} {outcome.metrics[key]:.4f}"
            if key != "validation_loss" and "validation_loss" in outcome.metrics:
                line += f", validation MLM {outcome.metrics['validation_loss']:.4f}"
            if {"nats_below_floor", "nats_below_unigram"} & set(outcome.metrics):
                line += f", {below_floor(outcome.metrics)}"
        if regime_of(outcome.metrics):
            line += f"; regime {regime_of(outcome.metrics)}"
        if outcome.reason:
            line += f"; {outcome.reason}"
        finished = sum(self.counts.values())
        return line + (f" [{self.already_done + finished}/{self.plan.trials} done, "
                       f"{eta(time.monotonic() - self.started, finished, self.remaining)}]")

    def render(self) -> Table:
        finished = sum(self.counts.values())
        elapsed = time.monotonic() - self.started
        table = Table(title=f"study {self.plan.study}", show_header=False, box=None)
        table.add_row("trials", f"{self.already_done + finished}/{self.plan.trials} done: "
                      f"{self.counts['complete']} complete, {self.counts['repeat']} repeats, "
                      f"{self.counts['pruned']} pruned, {self.counts['failed']} failed; {self.running} running")
        table.add_row("time", f"{duration(elapsed)} elapsed" + (f", {eta(elapsed, finished, self.remaining)}"
                                                                  if finished else ""))
        table.add_row("floor", references_text(self.plan))
        if self.best:
            key = self.plan.objective.rank_metric
            regime = regime_of(self.best.metrics)
            table.add_row("best", f"trial {self.best.number}: {key}={self.best.metrics[key]:.4f}, "
                          f"{below_floor(self.best.metrics)}{f', {regime}' if regime else ''}  "
                          f"{self.best.proposal.config.describe()}")
        return table

    @contextlib.contextmanager
    def live(self):
        if not self.terminal:  # Live off a terminal prints only its last frame, at the end: the lines say it all
            yield
            return
        with Live(self.render(), console=self.console, refresh_per_second=1, transient=False) as live:
            self._live = live
            try:
                yield
            finally:
                live.update(self.render())
                self._live = None

    def final_table(self, top: int = 5) -> None:
        key = self.plan.objective.rank_metric
        trials = ranked_trials(self.study, self.plan.objective)
        # No vertical rules and single padding: the room they took is the architecture's.
        table = Table(title=f"top {min(top, len(trials))} of study {self.plan.study} by {key}", box=box.SIMPLE_HEAD,
                      collapse_padding=True, pad_edge=False)
        columns = ["trial", key, "val MLM", "vs corruption floor", "regime", "tokens/s", "params", "architecture",
                   "MLflow run"]
        if key == "validation_loss":
            columns.remove("val MLM")  # it is the ranking column already
        for column in columns:  # the architecture wraps where the width runs out; numbers and run ids stay whole
            table.add_column(column, no_wrap=column != "architecture")
        for trial in trials[:top]:
            metrics = trial.user_attrs[attrs.METRICS]
            run = self.tracker.find_trial_run(trial.number)
            cells = [str(trial.number), f"{metrics[key]:.4f}", f"{metrics.get('validation_loss', float('nan')):.3f}",
                     below_floor(metrics, unit="", short=True), regime_of(metrics) or "n/a",
                     f"{metrics.get('tokens_per_s', 0):,.0f}", f"{metrics.get('params', 0) / 1e6:.1f}M",
                     ArchConfig.from_dict(trial.user_attrs[attrs.ARCH]).describe(), run.info.run_id if run else "-"]
            if key == "validation_loss":
                del cells[2]
            table.add_row(*cells)
        self.console.print(table)
        # Beneath the table, not in it: a log is 160 columns wide and the architecture must stay on one line.
        first = [f"trial {t.number}{first_draw_mark(t.user_attrs)}" for t in trials[:top] if first_draw_mark(t.user_attrs)]
        if first:
            print(f"of the study's first draw: {', '.join(first)}")
        verdict = search_verdict([(t.number, t.user_attrs[attrs.METRICS][key], first_draw_mark(t.user_attrs))
                                  for t in trials], key)
        if verdict:
            print(verdict)
        ranks = study_rung_ranking(self.study) if not self.plan.objective.multi else []
        if ranks:  # what early stopping at each report would have kept (benchmarks/RESULTS.md, "The study a user runs")
            print(f"how the train loss at each progress report ranked the final {key} over the study's "
                  f"{max(r.trials for r in ranks)} complete trials (Spearman, by report): "
                  + ", ".join(f"{r.report}: {r.spearman:.2f}" for r in ranks))
        print(f"{references_text(self.plan)}: a trial that ends no lower than the first learned nothing beyond "
              "frequencies and copying the unchanged tokens")
        counts = ", ".join(f"{number} {state}" for state, number in self.counts.items() if number)
        print(f"this session: {counts or 'no trials'}; study store {self.plan.storage}")  # next: search.study.next_steps


def first_draw_mark(source) -> str:
    """` (warm start sized-cpu)` or ` (cover)` for a trial of the study's first draw, else nothing;
    `source` is a Proposal or a trial's user attributes."""
    get = source.get if isinstance(source, dict) else lambda key: getattr(source, key, None)
    if get(attrs.WARM_START):
        return f" (warm start {get(attrs.WARM_START)})"
    return f" ({get(attrs.FIRST_DRAW)})" if get(attrs.FIRST_DRAW) else ""
