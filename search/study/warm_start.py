"""A study's first draw: warm starts, then a covering design, before any model takes over.

    warm = warm_starts("profile", profile, space)                 # the profile's hand designs (default)
    warm = warm_starts("study:cpu-short:5", profile, space, storage)   # the top 5 of an earlier study
    warm = warm_starts("none", profile, space)                    # opt out
    study = controllers.open_study(..., warm_starts=warm, cover=True)

A fresh study trains first what a careful person would (the profile's `warm_start` list of hand
designs in trainer/configs/, each a member of the profile's space, or the best trials of an earlier
study), then a covering design (`space.design.covering_design`) in which every value of every choice
and bool is trained once. These are ordinary trials, queued as Optuna's waiting trials: recorded,
early-stopped and counted in the study's compute like any other, and marked, in Optuna (user
attributes `warm_start` and `first_draw`), MLflow (tags `cramnas.warm_start`, `cramnas.first_draw`)
and the report. Why: a study that starts from random draws may never try the one choice that
matters (a 32-trial TPE study never drew rotary positions, benchmarks/RESULTS.md, "Accounting"),
and its first table ranks architectures that learned nothing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from search.base import attrs
from space import ArchConfig, SearchSpace
from space.design import covering_design, optuna_params
from space.errors import UsageError

# How many of an earlier study's best trials `--warm-start study:NAME` takes without `:K`.
DEFAULT_TOP = 5
COVER = "cover"  # the `first_draw` attribute of a covering-design trial


def hand_design_names(profile: str | dict[str, Any]) -> list[str]:
    """The names (trainer/configs/<name>.yaml) of the hand designs a profile's studies start from:
    its `warm_start` list; `profile` is a profile's name (search/profiles/<name>.yaml) or its loaded
    settings."""
    import yaml

    from search.base.paths import PROFILES

    if isinstance(profile, str):
        profile = yaml.safe_load((PROFILES / f"{profile}.yaml").read_text())
    return list(profile.get("warm_start", []))


def hand_designs(profile: str | dict[str, Any]) -> list[tuple[str, ArchConfig]]:
    """The hand designs a profile's studies start from (`hand_design_names`), by name."""
    from search.base.paths import CONFIGS
    from trainer.config import load_run_config

    return [(name, load_run_config(CONFIGS / f"{name}.yaml").arch) for name in hand_design_names(profile)]


def study_top(storage: Any, name: str, top: int) -> list[tuple[str, ArchConfig]]:
    """The `top` best COMPLETE trials of study `name` by its first objective, as `study:NAME#N`."""
    import optuna
    from optuna.study import StudyDirection
    from optuna.trial import TrialState

    if storage is None or name not in optuna.study.get_all_study_names(storage):
        raise UsageError(f"--warm-start: study {name} not found in {storage}; name a study of this --storage "
                         f"(or its MLflow store's), or use --warm-start profile")
    study = optuna.load_study(study_name=name, storage=storage)
    sign = -1 if study.directions[0] == StudyDirection.MAXIMIZE else 1
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if attrs.ARCH in t.user_attrs and attrs.REPEAT_OF not in t.user_attrs and t.values]
    if not complete:
        raise UsageError(f"--warm-start: study {name} has no complete trial to start from; use --warm-start profile")
    complete.sort(key=lambda t: sign * t.values[0])
    return [(f"study:{name}#{t.number}", ArchConfig.from_dict(t.user_attrs[attrs.ARCH])) for t in complete[:top]]


def parse_spec(spec: str) -> tuple[str, str | None, int]:
    """`--warm-start`'s value as (kind, study name, K): kind is profile, none or study."""
    if spec in ("profile", "none"):
        return spec, None, 0
    parts = spec.split(":")
    if parts[0] == "study" and len(parts) in (2, 3) and parts[1]:
        if len(parts) == 3 and not (parts[2].isdigit() and int(parts[2]) >= 1):
            raise UsageError(f"--warm-start: {spec!r}: K must be a whole number of trials, at least 1, "
                             f"e.g. study:{parts[1]}:5")
        return "study", parts[1], int(parts[2]) if len(parts) == 3 else DEFAULT_TOP
    raise UsageError(f"--warm-start: {spec!r} is not one of profile, none, study:NAME[:K]; e.g. --warm-start "
                     "study:my-short-study:5")


def warm_starts(spec: str, profile: dict[str, Any], space: SearchSpace, storage: Any = None,
                warn=print) -> list[tuple[str, ArchConfig]]:
    """The warm starts `--warm-start spec` names (`profile`, `none` or `study:NAME[:K]`) that are
    members of `space`; one `warn` line for each that is not (a custom --space may leave some out)."""
    kind, name, top = parse_spec(spec)
    chosen = {"none": list, "profile": lambda: hand_designs(profile),
              "study": lambda: study_top(storage, name, top)}[kind]()
    members = []
    for label, config in chosen:
        reason = space.validate(config)
        if reason:
            warn(f"warm start {label} left out: not a member of the space {space.name} ({reason})")
        else:
            members.append((label, config))
    return members


def first_draw(space: SearchSpace, warm: Sequence[tuple[str, ArchConfig]], cover: bool,
               seed: int | None) -> list[tuple[dict[str, str], ArchConfig]]:
    """The trials a new study runs first, each with the user attributes that mark it: the warm
    starts, then (with `cover`) the covering design drawn with `seed`."""
    draw = [({attrs.WARM_START: name}, config) for name, config in warm]
    if cover:
        draw += [({attrs.FIRST_DRAW: COVER}, config) for config in covering_design(space, random.Random(seed))]
    return draw


def enqueue_first_draw(study, space: SearchSpace, draw: Sequence[tuple[dict[str, str], ArchConfig]]) -> None:
    """Queue the first draw as Optuna's waiting trials, asked before the sampler draws anything."""
    for marks, config in draw:
        study.enqueue_trial(optuna_params(space, config), user_attrs=dict(marks))


def describe_first_draw(study) -> str | None:
    """One line on what a study trains first, or None when it has no first draw."""
    # A screened study's promoted trials keep their screen's marks; its own first draw is the screen's.
    trials = [t for t in study.get_trials(deepcopy=False) if attrs.PROMOTED_FROM not in t.user_attrs]
    warm = [t.user_attrs[attrs.WARM_START] for t in trials if attrs.WARM_START in t.user_attrs]
    covering = sum(t.user_attrs.get(attrs.FIRST_DRAW) == COVER for t in trials)
    if not warm and not covering:
        return None
    parts = [f"{len(warm)} warm start{'s' if len(warm) != 1 else ''} ({', '.join(warm)})"] if warm else []
    if covering:
        parts.append(f"a covering design of {covering} trial{'s' if covering != 1 else ''} in which every value of "
                     "every choice is trained")
    return "first draw: " + " and ".join(parts) + "; the controller takes over after them"


def search_verdict(ranked: Sequence[tuple[int, float, str]], metric: str) -> str | None:
    """Whether the controller found anything the first draw had not: `ranked` holds (trial, value
    of `metric`, first-draw mark) best first, the mark being `first_draw_mark`'s text (` (warm
    start sized-cpu)`, ` (cover)` or empty for the controller's own trials). None when either
    kind of trial is missing."""
    own = [row for row in ranked if not row[2]]
    first = [row for row in ranked if row[2]]
    if not own or not first:
        return None
    best, runner = ranked[0], (own if ranked[0][2] else first)[0]
    gap = abs(best[1] - runner[1])
    if best[2]:
        kind = best[2].strip(" ()")
        return (f"the search found nothing better than its first draw in {len(own)} trials of its own: the best "
                f"trial is trial {best[0]} ({kind}); the controller's best, trial {runner[0]}, is {gap:.3f} behind "
                f"by {metric}")
    return (f"the search beat its first draw: trial {best[0]}, the controller's, is {gap:.3f} ahead by {metric} of the "
            f"first draw's best, trial {runner[0]}{runner[2]}")
