"""Parameter importance of a study: Optuna's fANOVA on the study's own trials.

The controller's Optuna study (`search.tracking.stores.study_storage`, beside a SQLite MLflow store) holds
each trial's parameters as the sampler saw them, with their distributions; that is the first
choice. When it is missing (a study copied without its `optuna.db`, an MLflow server elsewhere),
an in-memory Optuna study is rebuilt from the MLflow runs' `params.arch.*`, which says less about
the ranges (only values that were drawn are known). Either way only complete trials that are not
repeats count, as in the rest of the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from dashboards.analysis import Score, scored
from search.base import attrs
from search.tracking.params import param_value
from search.tracking.stores import sqlite_path

SEED = 0  # fANOVA fits random forests: a fixed seed makes the report reproducible
# Below this many complete trials fANOVA's shares are mostly noise (a forest fitted to a handful of
# points, often fewer than the parameters): the report still draws them, greyed, with a warning.
MIN_TRIALS = 10


@dataclass
class Importance:
    source: str  # where the trials came from, in words
    trials: int  # the complete trials the importances rest on
    values: dict[str, float] = field(default_factory=dict)  # parameter -> importance, largest first
    note: str = ""  # why there are none, when there are none

    @property
    def reliable(self) -> bool:
        """Enough trials (`MIN_TRIALS`) for the importances to say which parameters matter."""
        return self.trials >= MIN_TRIALS


def _optuna_trials(study_name: str, storage: str) -> list[optuna.trial.FrozenTrial] | None:
    """The study's counted trials from its Optuna store; None when the store or study is missing."""
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        return None  # opening a missing SQLite file would create an empty one
    try:
        if study_name not in optuna.study.get_all_study_names(storage):
            return None
        study = optuna.load_study(study_name=study_name, storage=storage)
    except Exception:  # noqa: BLE001 - an unreadable store: fall back to MLflow, as for a missing one
        return None
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if attrs.REPEAT_OF not in t.user_attrs and attrs.INFEASIBLE not in t.user_attrs]


def _distribution(values: list) -> BaseDistribution:
    """Integers and floats keep their order (fANOVA splits on it); anything else is categorical."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return IntDistribution(min(values), max(values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return FloatDistribution(float(min(values)), float(max(values)))
    return CategoricalDistribution(sorted(set(values), key=str))


def _mlflow_trials(frame: pd.DataFrame, score: Score) -> list[optuna.trial.FrozenTrial]:
    """Trials rebuilt from MLflow params: the `params.arch.*` that varied among counted trials,
    read back as `search.tracking.params.param_value` reads every param."""
    rows = scored(frame, score)
    columns = [c for c in frame.columns if c.startswith("params.arch.") and rows[c].dropna().nunique() > 1]
    rows = rows.dropna(subset=columns)
    values = {c.removeprefix("params.arch."): [param_value(str(text)) for text in rows[c]] for c in columns}
    distributions = {name: _distribution(column) for name, column in values.items()}
    trials = []
    for index, value in enumerate(rows[score.column].astype(float)):
        params = {name: float(column[index]) if isinstance(distributions[name], FloatDistribution) else column[index]
                  for name, column in values.items()}
        trials.append(optuna.trial.create_trial(params=params, distributions=distributions, values=[value]))
    return trials


def param_importance(study_name: str, storage: str | None, frame: pd.DataFrame, score: Score) -> Importance:
    """fANOVA importances (summing to 1) of the study's parameters for its first objective."""
    trials = _optuna_trials(study_name, storage) if storage else None
    if trials is not None:
        source = f"the Optuna study store ({storage})"
        # A multi-objective study's first value is its score (probe_average): one value per trial.
        trials = [optuna.trial.create_trial(params=t.params, distributions=t.distributions, values=[t.values[0]])
                  for t in trials if t.values and np.isfinite(t.values[0])]
    else:
        where = f"no study {study_name!r} in {storage}" if storage else "no Optuna store given"
        source = f"the MLflow runs' arch params ({where}, so the study was rebuilt from MLflow)"
        trials = _mlflow_trials(frame, score)
    if len(trials) < 2:
        return Importance(source, len(trials), note=f"needs at least 2 complete trials, has {len(trials)}")
    # In memory, so repeats and infeasible draws stay out and the stored study is never written.
    study = optuna.create_study(direction="maximize" if score.higher_is_better else "minimize")
    study.add_trials(trials)
    try:
        values = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=SEED))
    except (RuntimeError, ValueError) as error:  # e.g. no parameter present in every trial
        return Importance(source, len(trials), note=f"Optuna could not compute importances: {error}")
    if not values:
        return Importance(source, len(trials), note="no parameter varied across the complete trials")
    return Importance(source, len(trials), dict(values))
