"""Where a search space's values come from: one small `Draw` protocol and its adapters.

`SearchSpace.walk` visits the parameters in file order and asks a `Draw` for each active one.
Swapping the draw changes what the walk does, without a second copy of the space's logic:

- `RandomDraw`: uniform draws (log-uniform where asked), for random search and load-time checks.
- `OptunaDraws`: one Optuna trial per point, so TPE, NSGA-II, ... steer the search.
- `ReplayDraw`: answers with an existing config's values: membership tests (`SearchSpace.validate`)
  and the parent's active parameters for `mutate`.
- `MutationDraw`: a parent's values with one of them changed: regularized evolution (`mutate`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from space.arch import ArchConfig

if TYPE_CHECKING:  # optuna is imported lazily: the trainer imports `space` and should not pay for it
    import optuna


# The Optuna user attribute of an infeasible draw, with its reason (read through search.base.attrs).
INFEASIBLE = "infeasible"

# Float grids are computed as low + k * step; rounding keeps 0.1 steps at 0.3, not 0.30000000000000004.
GRID_DIGITS = 10


class Draw(Protocol):
    """Chooses one value per question. `field` is the ArchConfig field; `label` is the name an
    optimizer sees: the field, or a name unique to a filtered subset of its options."""

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any: ...

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int: ...

    def real(self, field: str, label: str, low: float, high: float, step: float | None,
             log: bool) -> float: ...

    def reject(self, reason: str) -> None:
        """The values drawn so far make an invalid point (`reason` says why); it will be redrawn."""


def integer_allowed(value: Any, low: int, high: int, step: int) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and low <= value <= high and (value - low) % step == 0)


def real_allowed(value: Any, low: float, high: float, step: float | None) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        return False
    if step is None:
        return True
    steps = (value - low) / step
    return math.isclose(steps, round(steps), abs_tol=1e-9)


class RandomDraw:
    """Uniform draws from `rng` (log-uniform for log ranges); nothing learns from a rejection."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any:
        return self.rng.choice(list(options))

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int:
        if log:  # as Optuna does: log-uniform over [low - 0.5, high + 0.5], rounded, so the ends get a share
            value = round(math.exp(self.rng.uniform(math.log(low - 0.5), math.log(high + 0.5))))
            return min(max(value, low), high)
        return low + step * self.rng.randrange((high - low) // step + 1)

    def real(self, field: str, label: str, low: float, high: float, step: float | None, log: bool) -> float:
        if log:
            value = math.exp(self.rng.uniform(math.log(low), math.log(high)))
            return min(max(value, low), high)  # exp(log(x)) may land a hair outside the range
        if step is not None:
            return round(low + step * self.rng.randrange(round((high - low) / step) + 1), GRID_DIGITS)
        return self.rng.uniform(low, high)

    def reject(self, reason: str) -> None:
        pass


class OptunaDraw:
    """A draw bound to one asked Optuna trial (`.trial`): every answer is a trial.suggest_* call."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        self.study = study
        self.trial = trial

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any:
        return self.trial.suggest_categorical(label, list(options))

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int:
        return self.trial.suggest_int(label, low, high, step=step, log=log)

    def real(self, field: str, label: str, low: float, high: float, step: float | None, log: bool) -> float:
        return self.trial.suggest_float(label, low, high, step=step, log=log)

    def reject(self, reason: str) -> None:
        # PRUNED rather than FAIL: TPE ranks pruned trials below completed ones, so it learns to
        # avoid infeasible regions; the `infeasible` attribute keeps them out of the search's counts.
        from optuna.trial import TrialState

        self.trial.set_user_attr(INFEASIBLE, reason)
        self.study.tell(self.trial, state=TrialState.PRUNED)


class OptunaDraws:
    """Factory for `SearchSpace.sample`: each call asks `study` for a new trial and draws from it."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def __call__(self) -> OptunaDraw:
        return OptunaDraw(self.study, self.study.ask())


class ReplayDraw:
    """Answers every question with `config`'s own value. Notes how many values each asked field
    could have taken (`.asked`) and the first value the space does not allow (`.reason`)."""

    def __init__(self, config: ArchConfig) -> None:
        self.values = config.to_dict()
        self.asked: dict[str, float] = {}
        self.reason: str | None = None

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any:
        allowed = f"one of {format_list(options)}"
        return self._answer(field, len(options), self.values[field] in options, allowed)

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int:
        count = (high - low) // step + 1
        allowed = f"an integer in [{low}, {high}]" + (f" on steps of {step}" if step > 1 else "")
        return self._answer(field, count, integer_allowed(self.values[field], low, high, step), allowed)

    def real(self, field: str, label: str, low: float, high: float, step: float | None, log: bool) -> float:
        count = math.inf if step is None else round((high - low) / step) + 1
        count = count if high > low else 1
        allowed = f"a number in [{low}, {high}]" + (f" on steps of {step}" if step else "")
        return self._answer(field, count, real_allowed(self.values[field], low, high, step), allowed)

    def reject(self, reason: str) -> None:
        pass

    def _answer(self, field: str, count: float, allowed: bool, what_is_allowed: str) -> Any:
        self.asked[field] = count
        value = self.values[field]
        if not allowed and self.reason is None:
            self.reason = f"{field}: {format_value(value)} is not allowed here; expected {what_is_allowed}"
        return value


class MutationDraw:
    """Draws a value of `target` different from the parent's; keeps every other parent value in
    `kept` (the parent's active fields) while the space still allows it, and draws the rest afresh."""

    def __init__(self, target: str, kept: dict[str, Any], rng: random.Random) -> None:
        self.target = target
        self.kept = kept
        self.fresh = RandomDraw(rng)

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any:
        return self._keep_or_draw(field, lambda: self.fresh.categorical(field, label, options),
                                  lambda value: value in options)

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int:
        return self._keep_or_draw(field, lambda: self.fresh.integer(field, label, low, high, step, log),
                                  lambda value: integer_allowed(value, low, high, step))

    def real(self, field: str, label: str, low: float, high: float, step: float | None, log: bool) -> float:
        return self._keep_or_draw(field, lambda: self.fresh.real(field, label, low, high, step, log),
                                  lambda value: real_allowed(value, low, high, step))

    def reject(self, reason: str) -> None:
        pass

    def _keep_or_draw(self, field: str, draw: Callable[[], Any], allowed: Callable[[Any], bool]) -> Any:
        if field == self.target:
            # `mutate` only targets fields with another value to take, so this loop ends.
            while (value := draw()) == self.kept[field]:
                pass
            return value
        if field in self.kept and allowed(self.kept[field]):
            return self.kept[field]
        return draw()


def format_value(value: Any) -> str:
    """A value as a space file would spell it: true/false, 0.02, rotary."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(float(f"{value:.6g}"))  # 3.0, 0.02, 1e-12, 2.71828
    return str(value)


def format_list(values: Iterable[Any], separator: str = ", ") -> str:
    return "[" + separator.join(format_value(v) for v in values) + "]"
