"""What a trial stopped early tells the controller, and how well a report ranks the end.

Optuna's GPSampler and CMA-ES fit their model on COMPLETE trials only, and evolution breeds from
them: a trial that ASHA stopped (`search.study.ray_executor.early_stopping`, `search.run --early-stop`) would
tell them nothing, so a study with early stopping models the few trials that ran to the end (5 to 7
of 32 in the study of issue 38, mostly its first draw). `SeesStoppedTrials` wraps such a sampler:
when it models, every stopped trial is shown to it as finished, with the final value that the
study's own complete trials predict from the loss it had when it was stopped (a least-squares line
through their (loss at that report, final value) pairs, refit at every draw). TPE needs no wrapper:
it ranks pruned trials by their intermediate values itself.

`rung_ranking` is the measurement behind the default (benchmarks/RESULTS.md, "The study a user
runs"): over trials that ran to the end, how well the train loss at each progress report ranks the
final objective.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.search_space import intersection_search_space
from optuna.trial import FrozenTrial, TrialState

from search.base import attrs

# Fewer complete trials with a loss at a report than this, and a line through them means nothing:
# a trial stopped at that report stays unseen until there are more.
MIN_PAIRS = 3


def curve_of(trial: FrozenTrial) -> dict[int, float]:
    """A trial's progress curve, {report index: train loss} (`search.study.controllers.tell`)."""
    return {int(step): float(loss) for step, loss in trial.user_attrs.get(attrs.INTERMEDIATE, [])}


def _line(pairs: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of y on x, None when x does not vary."""
    n = len(pairs)
    mean_x = sum(x for x, _ in pairs) / n
    mean_y = sum(y for _, y in pairs) / n
    spread = sum((x - mean_x) ** 2 for x, _ in pairs)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / spread
    return mean_y - slope * mean_x, slope


def imputed_finals(trials: Sequence[FrozenTrial]) -> dict[int, float]:
    """{trial number: predicted final value} for every stopped trial (PRUNED with a progress
    curve; infeasible draws have none) whose last report has at least `MIN_PAIRS` complete trials
    with a loss at the same report."""
    complete = [(curve_of(t), t.values[0]) for t in trials
                if t.state == TrialState.COMPLETE and attrs.REPEAT_OF not in t.user_attrs and len(t.values) == 1]
    lines: dict[int, tuple[float, float] | None] = {}
    imputed = {}
    for trial in trials:
        if trial.state != TrialState.PRUNED or not (curve := curve_of(trial)):
            continue
        report = max(curve)
        if report not in lines:
            pairs = [(c[report], value) for c, value in complete if report in c]
            lines[report] = _line(pairs) if len(pairs) >= MIN_PAIRS else None
        if (line := lines[report]) is not None:
            imputed[trial.number] = line[0] + line[1] * curve[report]
    return imputed


class _StudyWithStoppedTrials:
    """The study as the wrapped sampler reads it: stopped trials it can predict are COMPLETE,
    with their imputed value; everything else (storage, directions, writes) is the study's own."""

    def __init__(self, study: optuna.Study):
        self._study = study
        trials = study._get_trials(deepcopy=False, use_cache=False)
        imputed = imputed_finals(trials)
        self._trials = [_as_complete(trial, imputed[trial.number]) if trial.number in imputed else trial
                        for trial in trials]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Sequence[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        chosen = [t for t in self._trials if states is None or t.state in states]
        return copy.deepcopy(chosen) if deepcopy else chosen

    def get_trials(self, deepcopy: bool = True, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)

    @property
    def trials(self) -> list[FrozenTrial]:
        return self._get_trials()


def _as_complete(trial: FrozenTrial, value: float) -> FrozenTrial:
    shown = copy.copy(trial)
    shown.state, shown.values = TrialState.COMPLETE, [value]
    return shown


class SeesStoppedTrials(BaseSampler):
    """`sampler`, modelling the study's stopped trials as well as its complete ones (see the module
    docstring). Its own random draws, start-up and writes are untouched."""

    def __init__(self, sampler: BaseSampler):
        self.sampler = sampler

    def reseed_rng(self) -> None:
        self.sampler.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        shown = _StudyWithStoppedTrials(study)
        space = self.sampler.infer_relative_search_space(shown, trial)
        # Optuna's samplers cache the intersection of their trials' parameters by trial number. A
        # trial stopped before a later one completed is shown only once its final can be imputed, so
        # the cache has passed it by and may keep a parameter it never drew (final_norm, under
        # post-norm), which GP and CMA-ES then fail to read. The intersection over the trials shown
        # now, recomputed, leaves such parameters out.
        shared = intersection_search_space(shown.get_trials(deepcopy=False))
        return {name: distribution for name, distribution in space.items() if shared.get(name) == distribution}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.sampler.sample_relative(_StudyWithStoppedTrials(study), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.sampler.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        # Evolution picks its parent here, from the population of finished trials.
        self.sampler.before_trial(_StudyWithStoppedTrials(study), trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.sampler.after_trial(study, trial, state, values)


# ---- how well a report ranks the end ----------------------------------------------------------

@dataclass(frozen=True)
class RungRank:
    report: int  # the progress report's index (1-based)
    trials: int  # complete trials with a loss at this report
    spearman: float
    low: float  # 95% bootstrap interval over the trials (NaN when none was drawn)
    high: float

    def text(self) -> str:
        return f"report {self.report}: Spearman {self.spearman:.2f} ({self.low:.2f} to {self.high:.2f}), {self.trials} trials"


def rung_ranking(curves: Sequence[dict[int, float]], finals: Sequence[float], reports: Sequence[int] | None = None,
                 resamples: int = 2000) -> list[RungRank]:
    """Spearman's rho between the loss at each report and the final value, over the trials that
    have both, with its bootstrap interval (`search.analysis.stats.correlation`; none with
    `resamples=0`); `reports` default to every report seen. A report with fewer than `MIN_PAIRS`
    trials, or one value for all, is left out."""
    from search.analysis.stats import correlation  # scipy: only when a ranking is measured

    if len(curves) != len(finals):
        raise ValueError(f"curves and finals differ in length: {len(curves)} and {len(finals)}")
    ranks = []
    for report in reports or sorted({step for curve in curves for step in curve}):
        pairs = [(curve[report], final) for curve, final in zip(curves, finals, strict=True) if report in curve]
        xs, ys = zip(*pairs, strict=True) if pairs else ((), ())
        if len(pairs) < MIN_PAIRS or len(set(xs)) < 2 or len(set(ys)) < 2:  # too few, or nothing ranked
            continue
        ranks.append(RungRank(report, len(pairs), *correlation(xs, ys, "spearman", resamples)))
    return ranks


def study_rung_ranking(study: optuna.Study) -> list[RungRank]:
    """`rung_ranking` over a single-objective study's complete trials that have a progress curve
    (repeats and warm-started copies carry none of their own), without intervals: the study's final
    table prints the correlations alone."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if len(t.values) == 1 and attrs.REPEAT_OF not in t.user_attrs and curve_of(t)]
    return rung_ranking([curve_of(t) for t in trials], [t.values[0] for t in trials], resamples=0)
