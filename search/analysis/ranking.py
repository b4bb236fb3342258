"""A finished study's trials in the order its objective ranks them: the terminal view, `search.export`
and the benchmarks rank by this one rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial, TrialState

from search.base import attrs

if TYPE_CHECKING:
    import optuna

    from search.base.objectives import Objective


def ranked_trials(study: optuna.Study, objective: Objective) -> list[FrozenTrial]:
    """The study's complete trials that reported the objective's ranking metric, best first (a tie:
    the earlier trial first). Repeats copy an earlier trial's result, so they do not compete."""
    key = objective.rank_metric
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if attrs.REPEAT_OF not in t.user_attrs and key in t.user_attrs.get(attrs.METRICS, {})]
    return sorted(trials, key=lambda t: objective.sort_key(t.user_attrs[attrs.METRICS][key]))
