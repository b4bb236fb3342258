"""A screened study (`search.run --screen N --promote M`): successive halving over budgets in one
bracket, each rung a whole cram at its own budget and schedule.

    screen:     study NAME-screen, every one of --trials trials crammed whole at 1/N of --budget,
                with the controller, warm starts and covering design of any study
    promotion:  study NAME, the best ceil(trials/M) distinct architectures of the screen crammed at
                --budget, one trial each (user attribute `promoted_from`: the screen's trial)

The controller models whole crams only, every trial of the screen complete at its budget, so early
stopping hides nothing from it (issue 38). Why rungs of whole crams rather than a trial's own
reports: over the default studies' 87 architectures, a cram at a quarter of 2e12 FLOPs ranks the
final loss with Spearman 0.92, where the in-run report at the same share, read in the ramp of the
budget-shaped learning rate, gives 0.86 (benchmarks/RESULTS.md, "Rungs over budgets"). Run for real
at 32 trials (3 seeds) and 200, promoting the best quarter spent half the FLOPs of the unscreened
study and kept winners worth 2.2x to 10.6x sized-cpu's compute; each winner was among its
screen's best eighth, so promoting an eighth keeps them for 37.5% ("Screened studies, run for
real"). The CPU profile screens from 20 trials by default and promotes an eighth (its `screen`;
search.run.study_screen).
NAME is an ordinary study at --budget: export, confirm and the ladder read it unchanged, and its
report (dashboards.screen) shows where its trials came from in the screen.
A promoted trial keeps the screen trial's first-draw marks, so a study whose best is a promoted warm
start still says that the search found nothing better than it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from search.analysis.ladder import multiple_of
from search.base import attrs
from space import ArchConfig, SearchSpace
from space.design import optuna_params
from trainer.budget import Budget
from trainer.console import count

SUFFIX = "-screen"


def screen_name(study: str) -> str:
    """The screen's study beside study `study`."""
    return study + SUFFIX


def screen_budget(budget: Budget, screen: int) -> Budget:
    """A screen trial's budget: 1/`screen` of `budget`, in its unit."""
    return multiple_of(budget, 1 / screen)


def stored_screen(study: str, storage: str) -> tuple[int, int] | None:
    """Study `study`'s screen factor and promoted share as `storage` holds them, for a resume that does
    not say: the ones recorded on its screen (a screen recorded before the share was promoted the
    best 1/factor), (1, 1) for a study without one, None for a study not there (or a screen of before
    the factor was recorded): the profile's default applies."""
    names = set(optuna.study.get_all_study_names(storage))
    if screen_name(study) in names:
        recorded = optuna.load_study(study_name=screen_name(study), storage=storage).user_attrs
        factor = recorded.get(attrs.SCREEN)
        return None if factor is None else (factor, recorded.get(attrs.PROMOTE, factor))
    return (1, 1) if study in names else None


def promoted_count(trials: int, promote: int) -> int:
    """How many of a screen of `trials` go on to the whole budget: the best 1/`promote`, at least one."""
    return max(1, math.ceil(trials / promote))


def ranked_screen(screen: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The screen's complete trials, best first by its first objective, one per architecture (a
    repeat, or a second cram of an architecture drawn twice at once, is not promoted again)."""
    sign = -1 if screen.directions[0] == StudyDirection.MAXIMIZE else 1
    complete = sorted((t for t in screen.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                       if attrs.ARCH in t.user_attrs and attrs.REPEAT_OF not in t.user_attrs and t.values),
                      key=lambda t: (sign * t.values[0], t.number))
    distinct: dict[str, optuna.trial.FrozenTrial] = {}
    for trial in complete:
        distinct.setdefault(trial.user_attrs[attrs.FINGERPRINT], trial)
    return list(distinct.values())  # in the order first seen: best first


def promote(study: optuna.Study, screen: optuna.Study, space: SearchSpace, wanted: int) -> list[int]:
    """Queue in `study` the screen's best architectures that it has not been given yet, until it
    holds `wanted` promotions (a resume to more --trials promotes more); the screen trials queued."""
    given = {t.user_attrs[attrs.PROMOTED_FROM] for t in study.get_trials(deepcopy=False)
             if attrs.PROMOTED_FROM in t.user_attrs}
    queued = []
    for trial in ranked_screen(screen):
        if len(given) + len(queued) >= wanted:
            break
        if trial.number in given:
            continue
        marks = {key: trial.user_attrs[key] for key in (attrs.WARM_START, attrs.FIRST_DRAW) if key in trial.user_attrs}
        config = ArchConfig.from_dict(trial.user_attrs[attrs.ARCH])
        study.enqueue_trial(optuna_params(space, config), user_attrs={attrs.PROMOTED_FROM: trial.number, **marks})
        queued.append(trial.number)
    return queued


def flops(trials: Sequence[optuna.trial.FrozenTrial]) -> float:
    """The FLOPs the trials trained for (tokens x FLOPs per token of their recorded metrics; a repeat
    trained nothing)."""
    metrics = [t.user_attrs.get(attrs.METRICS, {}) for t in trials if attrs.REPEAT_OF not in t.user_attrs]
    return sum(m.get("tokens", 0.0) * m.get("flops_per_token", 0.0) for m in metrics)


def spent_line(screen: optuna.Study, study: optuna.Study, screen_size: int) -> str:
    """What the screened study spent, beside the same trials each crammed whole at the budget (the
    screen's FLOPs times `screen_size`, as every screen trial trains 1/`screen_size` of the budget),
    and how many of the screen's first draw it promoted."""
    screen_trials, trials = screen.get_trials(deepcopy=False), study.get_trials(deepcopy=False)
    screened, promoted = flops(screen_trials), flops(trials)
    whole = screened * screen_size
    share = f", {(screened + promoted) / whole:.0%} of the {whole:.3g} its trials would spend whole" if whole else ""
    first = [t.user_attrs.get(attrs.WARM_START) or t.user_attrs[attrs.FIRST_DRAW] for t in trials
             if attrs.WARM_START in t.user_attrs or attrs.FIRST_DRAW in t.user_attrs]
    marks = ", ".join(f"warm start {mark}" if mark != "cover" else mark for mark in first)
    from_first = f"{len(first)} of the first draw ({marks})" if first else "none of the first draw"
    return (f"screened study: {screened + promoted:.3g} FLOPs, the screen {screened:.3g} "
            f"({count(len(screen_trials), 'trial')}) and the promotion {promoted:.3g}{share}; "
            f"promoted {count(len(trials), 'trial')}, {from_first}")
