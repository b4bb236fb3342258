"""A promotion ladder: `python -m search.confirm --study NAME --top 6 --seeds 3 --ladder 3x,9x,27x`.

A study ranks architectures after minutes of training; its user then crams the winner for hours,
and ranks move with compute. The ladder confirms the study's top candidates at budgets rising
towards the user's, by successive halving on the budget: at the first rung every `--top` candidate
is crammed with every seed, the best 1/`--eta` of them (default 3; at least one) by their mean
over seeds go up to the next rung, and so on. `--baselines` go up every rung beside them as the
fixed references: never ranked for promotion, never dropped. The pick is the best candidate at the
highest rung that has a complete seed; `search.export` exports it (`provenance.ladder`).

The rungs are budgets of the kind of the study's budget per trial (the study run's `budget`, the
one a plain confirmation defaults to), each above it and above the rung before:
- `--ladder 3x,9x,27x`: multiples of that budget, or budgets (`--ladder 3x,9x,6e13flops`);
- `--target 6e13flops` (or `--target 30x`): the last rung, exactly; the rungs below it are 3x, 9x, 27x ... the study's
  budget, leaving out a power of 3 within a factor 2 of the target, so that no rung nearly repeats
  the one above it. A study of 1e13flops: `--target 6e13flops` climbs 3e13, 6e13;
  `--target 3e14flops` climbs 3e13, 9e13, 3e14.
A multiple is written as an amount in the unit of the study's budget (`60000tokens`, `6e13flops`,
`900s`), a budget as given: that text is the rung's `cramnas.budget`, so the same command again
finds its runs.

Each (candidate or baseline, seed, rung) is an ordinary confirmation or baseline run of
`search.confirm` under the rung's budget, tagged `cramnas.rung` with the rung's index from 0. The
ladder therefore resumes as confirmations do: a finished run is read back instead of crammed, so
the same scores promote the same candidates, and a run left KILLED is re-done.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from search.analysis.stats import mean_interval, plus_minus
from search.base.states import FAILED
from space.errors import UsageError
from trainer.budget import Budget, BudgetError
from trainer.console import count
from trainer.regimes import regime_of

if TYPE_CHECKING:  # only for the annotations
    import argparse

    from mlflow.entities import Run

    from search.base.objectives import Objective
    from search.study.spec import Probe
    from search.tracking.tracker import StudyTracker
    from trainer.data import PretrainData

DEFAULT_ETA = 3
# search.confirm's --top and --seeds by default, so also what `search.run --estimate --ladder` prices.
LADDER_TOP, LADDER_SEEDS = 5, 3
TARGET_STEP = 3  # --target's rungs rise from the study's budget in this factor
UNIT = {"seconds": "s", "tokens": "tokens", "flops": "flops", "refs": "refs"}  # Budget.kind -> the unit Budget.parse reads
_MULTIPLE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*x\s*$", re.IGNORECASE)
EXAMPLE = "e.g. --ladder 3x,9x,27x"


@dataclass(frozen=True)
class Ladder:
    trial_budget: Budget  # the study's, per trial: what the rungs are multiples of
    rungs: tuple[Budget, ...]  # rising
    eta: int  # the best 1/eta of a rung's candidates go up

    def multiple(self, rung: Budget) -> str:
        return f"{rung.amount / self.trial_budget.amount:.6g}x"

    def describe(self) -> str:
        return ", ".join(f"{rung.text} ({self.multiple(rung)})" for rung in self.rungs)

    def climbers(self, candidates: int) -> list[int]:
        """How many candidates train at each rung at most (fewer when some complete no seed)."""
        counts = [candidates]
        for _ in self.rungs[1:]:
            counts.append(kept(counts[-1], self.eta))
        return counts


def kept(candidates: int, eta: int) -> int:
    """How many of a rung's `candidates` go up: the best 1/eta, at least one."""
    return max(1, candidates // eta)


# ---- the flags ------------------------------------------------------------------------------------

def wanted(args: argparse.Namespace) -> bool:
    """Whether the command climbs a ladder (`--ladder` or `--target`) rather than confirm under one budget."""
    return args.ladder is not None or args.target is not None


def check_flags(args: argparse.Namespace) -> None:
    """The ladder's flags against the others, before the study is read."""
    if not wanted(args):
        if args.eta is not None:
            raise UsageError(f"--eta: only with --ladder or --target (it sets how many go up each rung); add one, {EXAMPLE}")
        return
    flag = "--ladder" if args.ladder is not None else "--target"
    if args.ladder is not None and args.target is not None:
        raise UsageError("--target: give either --ladder (every rung) or --target (the last rung), not both")
    if args.budget:
        raise UsageError(f"{flag}: the rungs are the budgets, multiples of the study's; drop --budget "
                         f"(to train at {args.budget}, make it a rung: --ladder 3x,{args.budget})")
    if args.eta is not None and args.eta < 1:
        raise UsageError(f"--eta: must be at least 1 (3: the best third go up each rung; 1: all of them), got {args.eta}")
    if args.top < 1:
        raise UsageError(f"--top: a ladder promotes candidates: give --top 1 or more, got {args.top}")


def ladder_of(args: argparse.Namespace, trial_budget: Budget) -> Ladder:
    """The ladder `--ladder` or `--target` climbs from the study's `trial_budget`; a one-line
    UsageError naming the flag and the fix for anything it cannot climb."""
    eta = DEFAULT_ETA if args.eta is None else args.eta
    if args.ladder is not None:
        written = [text.strip() for text in args.ladder.split(",")]
        rungs = [budget_of(text, trial_budget, "--ladder", EXAMPLE) for text in written]
        check_rising(written, rungs)
    else:
        target = args.target.strip()
        rungs = target_rungs(budget_of(target, trial_budget, "--target", "e.g. --target 30x"), trial_budget)
    return Ladder(trial_budget, tuple(rungs), eta)


def multiple_of(budget: Budget, factor: float) -> Budget:
    """`factor` times `budget`, written in its unit (`3e13flops`; read back, so that text and amount agree)."""
    return Budget.parse(f"{budget.amount * factor:g}".replace("e+", "e") + UNIT[budget.kind])


def budget_of(text: str, trial_budget: Budget, flag: str, fix: str) -> Budget:
    """A rung as `flag` gives it: a multiple of the study's budget (`3x`) or a budget of its kind,
    above the study's budget; `fix` is what to write instead."""
    match = _MULTIPLE.match(text)
    try:
        budget = multiple_of(trial_budget, float(match.group(1))) if match else Budget.parse(text)
    except BudgetError:
        if not match:
            raise UsageError(f"{flag}: cannot read {text!r}: write a multiple of the study's budget {trial_budget.text} "
                             f"(3x) or a budget in its unit ({UNIT[trial_budget.kind]}), {fix}") from None
        budget = None  # 0x: no budget at all
    if budget is not None and budget.kind != trial_budget.kind:  # budgets of two kinds do not compare
        raise UsageError(f"{flag}: {text} counts {budget.kind}, the study's budget {trial_budget.text} counts "
                         f"{trial_budget.kind}; write it in {UNIT[trial_budget.kind]} or as a multiple (3x), {fix}")
    if budget is None or budget.amount <= trial_budget.amount:
        raise UsageError(f"{flag}: {text} is not above the study's budget {trial_budget.text}, which the ladder "
                         f"climbs from; start above it, {fix}")
    return budget


def check_rising(written: list[str], rungs: list[Budget]) -> None:
    for (before, low), (text, high) in zip(zip(written, rungs), zip(written[1:], rungs[1:])):
        if high.amount <= low.amount:
            raise UsageError(f"--ladder: rungs must rise, but {text} comes after {before}; list them smallest "
                             f"first, {EXAMPLE}")


def target_rungs(target: Budget, trial_budget: Budget) -> list[Budget]:
    """3x, 9x, 27x ... `trial_budget` while at most half the target, then the target itself."""
    rungs = []
    factor = TARGET_STEP
    while 2 * multiple_of(trial_budget, factor).amount <= target.amount:
        rungs.append(multiple_of(trial_budget, factor))
        factor *= TARGET_STEP
    return [*rungs, target]


# ---- the climb ----------------------------------------------------------------------------------

# What the ladder climbs with: search.confirm builds the plan and its candidates, trains each (candidate,
# seed) into a SeedOutcome, and the ladder promotes by them.


@dataclass
class Candidate:
    """One configuration to train with each seed: a trial to confirm (its rank in the study, its
    run and score), or a hand-designed `baseline` (its config name; no rank, trial, run or score)."""

    rank: int | None
    trial: int | None
    run_id: str | None
    score: float | None
    arch: dict[str, Any]
    train: dict[str, Any]
    fingerprint: str | None
    data_fingerprint: str | None
    baseline: str | None = None

    @property
    def label(self) -> str:
        return f"baseline {self.baseline}" if self.baseline is not None else f"trial {self.trial}"

    def find_run(self, tracker: StudyTracker, seed: int, budget: str) -> Run | None:
        if self.baseline is not None:
            return tracker.find_baseline_run(self.baseline, seed, budget)
        return tracker.find_confirmation_run(self.run_id, seed, budget)

    def open_run(self, tracker: StudyTracker, seed: int, index: int, train: dict[str, Any], budget: str) -> str:
        if self.baseline is not None:
            return tracker.open_baseline_run(self.baseline, seed, index, self.arch, train, budget, self.fingerprint)
        return tracker.open_confirmation_run(self.run_id, self.trial, seed, index, self.arch, train, budget,
                                             self.fingerprint)

    def describe(self) -> str:
        """Its architecture in a few words (`ArchConfig.describe`)."""
        from space.arch import ArchConfig, ArchError

        try:  # defaults first: an arch read back from params may leave a field out
            return ArchConfig.from_dict({**ArchConfig().to_dict(), **self.arch}).describe()
        except ArchError as error:  # a trial of an impossible architecture (it failed, as its confirmations do)
            return f"invalid: {error}"

    @property
    def data_shape(self) -> tuple[int, int]:
        from space.arch import ArchConfig

        return (int(self.arch.get("vocab_size", ArchConfig.vocab_size)),
                int(self.arch.get("max_seq_len", ArchConfig.max_seq_len)))


@dataclass
class ConfirmPlan:
    study: str
    tracker: StudyTracker
    objective: Objective  # the study's: candidates are ranked and confirmed by its rank_metric
    budget: Budget
    seeds: list[int]
    candidates: list[Candidate]
    baselines: list[Candidate]
    probe: Probe | None  # the study's probe, without the seed (each run's own); None: no probe
    data: dict[tuple[int, int], PretrainData] = field(default_factory=dict)  # (vocab, seq) -> data
    retry_failed: bool = False
    ladder: Ladder | None = None  # --ladder or --target: `budget` is then its top rung's, for the data
    rung: int | None = None  # the ladder's rung being trained (search.analysis.ladder.climb), tagged on its runs

    @property
    def configurations(self) -> list[Candidate]:
        return [*self.candidates, *self.baselines]


@dataclass
class SeedOutcome:
    """How one (candidate or baseline, seed) run ended."""

    candidate: Candidate
    seed: int
    run_id: str
    state: str  # search.base.states: complete or failed
    score: float | None
    reason: str | None = None
    earlier: bool = False  # a finished run of an earlier invocation, kept as it was
    metrics: dict[str, float] = field(default_factory=dict)  # a complete run's final metrics


@dataclass
class Standing:
    """A configuration at one rung: its seeds' outcomes, and their mean score."""

    candidate: Candidate
    outcomes: list[SeedOutcome]

    @property
    def complete(self) -> list[SeedOutcome]:
        return [o for o in self.outcomes if o.score is not None and math.isfinite(o.score)]

    @cached_property
    def summary(self) -> tuple[float, float | None] | None:
        """Mean score over the complete seeds and its 95% half-width (None: one seed); None: no complete seed."""
        scores = [o.score for o in self.complete]
        return mean_interval(scores) if scores else None

    @property
    def regime(self) -> str | None:
        """The regime of the mean validation loss, against the references its runs recorded."""
        metrics = [o.metrics for o in self.complete if "validation_loss" in o.metrics]
        if not metrics:
            return None
        return regime_of({**metrics[0], "validation_loss": statistics.fmean(m["validation_loss"] for m in metrics)})


@dataclass
class Rung:
    """One rung as it was trained: its budget, every configuration's standing, who went up."""

    index: int
    budget: Budget
    standings: list[Standing]  # candidates in study rank order, then baselines
    promoted: list[Candidate]  # the candidates that go up to the next rung (none from the last)


def promote(standings: list[Standing], objective: Objective, eta: int) -> list[Candidate]:
    """The best 1/eta of the rung's candidates (at least one) by their mean score; one without a
    complete seed has no mean and stays. Baselines go up every rung anyway: they are not ranked."""
    candidates = [s for s in standings if s.candidate.baseline is None]
    # Stable: of two equal means, the candidate the study ranked higher goes up.
    ranked = sorted((s for s in candidates if s.summary), key=lambda s: objective.sort_key(s.summary[0]))
    return [s.candidate for s in ranked[:kept(len(candidates), eta)]]


ConfirmOne = Callable[["ConfirmPlan", "Candidate", int, int], "SeedOutcome"]  # search.confirm.confirm_one


def climb(plan: ConfirmPlan, confirm: ConfirmOne, outcomes: list[SeedOutcome]) -> list[Rung]:
    """Train `plan.ladder` rung by rung with `confirm`; every outcome is appended to `outcomes` as it
    comes, so that a Ctrl-C can say how many are kept."""
    ladder = plan.ladder
    rungs: list[Rung] = []
    climbing = plan.candidates
    for index, budget in enumerate(ladder.rungs):
        at_rung = replace(plan, budget=budget, rung=index, candidates=climbing)
        baselines = f" and {count(len(plan.baselines), 'baseline')}" if plan.baselines else ""
        print(f"rung {index}: {budget.text} ({ladder.multiple(budget)} the study's budget), "
              f"{count(len(climbing), 'candidate')}{baselines}, {count(len(plan.seeds), 'seed')} each", flush=True)
        standings = []
        for candidate in at_rung.configurations:
            standing = Standing(candidate, [])
            for number, seed in enumerate(plan.seeds, start=1):
                standing.outcomes.append(confirm(at_rung, candidate, number, seed))
                outcomes.append(standing.outcomes[-1])
            standings.append(standing)
        last = index == len(ladder.rungs) - 1
        rungs.append(Rung(index, budget, standings, [] if last else promote(standings, plan.objective, ladder.eta)))
        climbing = rungs[-1].promoted
        if not last and not climbing:
            print(f"no candidate completed a seed under {budget.text}: the ladder stops at rung {index}")
            break
    return rungs


def pick(rungs: list[Rung], objective: Objective) -> tuple[Rung, Standing] | None:
    """The best candidate by mean score at the highest rung where one completed a seed."""
    for rung in reversed(rungs):
        scored = [s for s in rung.standings if s.candidate.baseline is None and s.summary]
        if scored:
            return rung, min(scored, key=lambda s: objective.sort_key(s.summary[0]))
    return None


# ---- the tables ---------------------------------------------------------------------------------

def interval_text(summary: tuple[float, float | None] | None) -> str:
    """`5.1234 ± 0.0100`, `5.1234` (one seed: the n column says so), or `-` without a complete seed."""
    return "-" if summary is None else plus_minus(*summary, 4)


def fate(rung: Rung, standing: Standing, chosen: Standing | None) -> str:
    if standing.candidate.baseline is not None:
        return "reference"
    if standing is chosen:
        return "pick"
    if any(candidate is standing.candidate for candidate in rung.promoted):
        return f"promoted to rung {rung.index + 1}"
    return "stays" if rung.promoted else ""


def print_ladder(plan: ConfirmPlan, rungs: list[Rung]) -> None:
    """One table per rung (mean ± 95% interval, regime, who went up), then the pick."""
    from rich.console import Console
    from rich.table import Table

    objective, ladder = plan.objective, plan.ladder
    chosen = pick(rungs, objective)
    console = Console(width=None if sys.stdout.isatty() else 160)
    for rung in rungs:
        table = Table(title=f"rung {rung.index} of study {plan.study}: {rung.budget.text} "
                            f"({ladder.multiple(rung.budget)}), seeds {', '.join(map(str, plan.seeds))}: "
                            f"{objective.rank_metric} ({'higher' if objective.higher_is_better else 'lower'} is better)")
        for column in ("rank", "configuration", "architecture", "mean (95% CI)", "n", "failed", "regime", "next"):
            table.add_column(column, no_wrap=column != "architecture")
        ranked = sorted(rung.standings, key=lambda s: (s.summary is None, objective.sort_key(s.summary[0]) if s.summary else 0))
        for position, standing in enumerate(ranked, start=1):
            candidate = standing.candidate
            failed = sum(outcome.state == FAILED for outcome in standing.outcomes)
            table.add_row(str(position) if standing.summary else "-", candidate.label, candidate.describe(),
                          interval_text(standing.summary), str(len(standing.complete)), str(failed),
                          standing.regime or "-", fate(rung, standing, chosen[1] if chosen else None))
        console.print(table)
    if chosen is None:
        print("no pick: no candidate completed a seed at any rung")
        return
    rung, standing = chosen
    candidate = standing.candidate
    print(f"pick: {candidate.label} (search rank {candidate.rank}), the best at rung {rung.index}, {rung.budget.text} "
          f"({ladder.multiple(rung.budget)}): {objective.rank_metric} {interval_text(standing.summary)} over "
          f"{count(len(standing.complete), 'seed')}, regime {standing.regime or 'unknown'}")
