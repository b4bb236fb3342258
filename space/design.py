"""Designs over a space: a first draw that trains every value of every choice, and a space-filling
table of many points.

    rows = covering_design(space, random.Random(0))            # every choice and bool value at least once
    table = covering_design(space, random.Random(0), rows=300) # balanced over choices, Latin over ranges
    params = optuna_params(space, config)                      # the labels an Optuna trial of it draws

A design walks the space like any draw (`SearchSpace.walk`), so conditions, option filters and
constraints hold for every row. Categorical parameters (choices and bools) are balanced: each
row takes, among the options the walk allows, one that the rows so far drew least (ties at random),
so `n` rows give each of a parameter's `k` values about `n / k` rows, and `k` rows cover it. Ranges
(int and float) are Latin: row `i` of `n` falls in its own one of `n` equal strata, in an order
shuffled per parameter. `covering_size` is the number of rows that covers every value: the largest
option count of any choice or bool, a number that follows from the space, not a constant.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from space.arch import ArchConfig
from space.draw import GRID_DIGITS, ReplayDraw
from space.search_space import SearchSpace

# Attempts at one row before the design gives up: constraints reject a row, which is drawn again.
MAX_ROW_ATTEMPTS = 200


def categorical_params(space: SearchSpace) -> dict[str, tuple[Any, ...]]:
    """The searched choices and bools with two or more options: what a first draw must cover."""
    return {p.field: p.options for p in space.params.values() if p.kind in ("choice", "bool") and len(p.options) > 1}


def covering_size(space: SearchSpace) -> int:
    """Rows that can hold every value of every choice and bool: the largest option count (1 for a
    space that searches none)."""
    return max((len(options) for options in categorical_params(space).values()), default=1)


class _BalancedDraw:
    """Answers a categorical with its least used allowed option, a range with the row's stratum."""

    def __init__(self, counts: dict[str, Counter], strata: dict[str, float], rng: random.Random) -> None:
        self.counts, self.strata, self.rng = counts, strata, rng

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any:
        used = self.counts.setdefault(field, Counter())
        fewest = min(used[o] for o in options)
        return self.rng.choice([o for o in options if used[o] == fewest])

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int:
        values = (high - low) // step + 1
        return low + step * min(int(self._unit(field, log, low - 0.5, high + 0.5, values)), values - 1)

    def real(self, field: str, label: str, low: float, high: float, step: float | None, log: bool) -> float:
        if step is not None:
            values = round((high - low) / step) + 1
            return round(low + step * min(int(self._unit(field, False, 0, 1, values)), values - 1), GRID_DIGITS)
        if log:
            return min(max(math.exp(math.log(low) + self._stratum(field) * (math.log(high) - math.log(low))), low), high)
        return low + self._stratum(field) * (high - low)

    def reject(self, reason: str) -> None:
        pass

    def _stratum(self, field: str) -> float:
        """A point in (0, 1) inside this row's stratum of `field`."""
        return self.strata.get(field, self.rng.random())

    def _unit(self, field: str, log: bool, low: float, high: float, values: int) -> float:
        """The row's stratum mapped onto `values` grid cells (an index in [0, values))."""
        u = self._stratum(field)
        if log:  # as Optuna's log-int: uniform in log over [low - 0.5, high + 0.5], as cells
            return (math.exp(math.log(low) + u * (math.log(high) - math.log(low))) - low) / (high - low) * values
        return u * values


def covering_design(space: SearchSpace, rng: random.Random, rows: int | None = None) -> list[ArchConfig]:
    """`rows` members of `space` (default `covering_size`), balanced over every choice and bool and
    Latin over every range, distinct by fingerprint where the space allows. With the default size
    every value of every choice and bool that its conditions let be drawn appears at least once."""
    rows = covering_size(space) if rows is None else rows
    ranges = [p.field for p in space.params.values() if p.kind in ("int", "float")]
    order = {field: rng.sample(range(rows), rows) for field in ranges}  # Latin: one stratum per row
    counts: dict[str, Counter] = {}
    design: list[ArchConfig] = []
    seen: set[str] = set()
    for row in range(rows):
        strata = {field: (order[field][row] + rng.random()) / rows for field in ranges}
        config = None
        for _ in range(MAX_ROW_ATTEMPTS):
            draw = _BalancedDraw({f: Counter(c) for f, c in counts.items()}, strata, rng)
            config, _reason = space._draw_point(draw)
            if config is not None and config.fingerprint() not in seen:
                break
            strata = {field: rng.random() for field in ranges}  # a rejected row: anywhere in range
        if config is None:
            continue
        seen.add(config.fingerprint())
        design.append(config)
        for field, options in categorical_params(space).items():
            value = getattr(config, field)
            if value in options:
                counts.setdefault(field, Counter())[value] += 1
    return design


def uncovered(space: SearchSpace, configs: Sequence[ArchConfig]) -> dict[str, list[Any]]:
    """The values of each choice and bool that no config in `configs` has."""
    missing = {}
    for field, options in categorical_params(space).items():
        had = {getattr(config, field) for config in configs}
        left = [option for option in options if option not in had]
        if left:
            missing[field] = left
    return missing


class _LabelDraw(ReplayDraw):
    """A replay that also notes the label each answer goes under (what an Optuna trial stores)."""

    def __init__(self, config: ArchConfig) -> None:
        super().__init__(config)
        self.params: dict[str, Any] = {}

    def categorical(self, field: str, label: str, options: Sequence[Any]) -> Any:
        self.params[label] = value = super().categorical(field, label, options)
        return value

    def integer(self, field: str, label: str, low: int, high: int, step: int, log: bool) -> int:
        self.params[label] = value = super().integer(field, label, low, high, step, log)
        return value

    def real(self, field: str, label: str, low: float, high: float, step: float | None, log: bool) -> float:
        self.params[label] = value = super().real(field, label, low, high, step, log)
        return value


def optuna_params(space: SearchSpace, config: ArchConfig) -> dict[str, Any]:
    """The parameters, by the labels the walk asks Optuna for, that make a trial draw `config`
    (for `optuna.Study.enqueue_trial`); a config outside the space raises its SpaceError."""
    from space.grammar import space_error

    reason = space.validate(config)
    if reason:
        raise space_error(space.path.name, "params", f"{config.describe()} is not a member ({reason})",
                          "widen the space to hold it, or leave it out")
    draw = _LabelDraw(config)
    space.walk(draw)
    return draw.params
