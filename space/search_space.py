"""A search space in use: `load_space` reads a YAML file, `SearchSpace` draws from it.

    space = load_space(default_space_path("cpu"))
    config = space.sample_random(random.Random(0))               # random search
    config, draw = space.sample(OptunaDraws(study))              # any Optuna sampler; tell draw.trial
    child, change = mutate(space, config, random.Random(0))      # regularized evolution

Everything goes through one walk over the parameters in file order (`SearchSpace.walk`) that asks
a `Draw` for each active one; the draw decides where values come from (see `space.draw`). A point
that ArchConfig refuses or a constraint excludes is rejected to its draw and drawn again. The
grammar and its checks live in `space.grammar`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from space.arch import FIELD_TYPES, ArchConfig, ArchError
from space.draw import Draw, MutationDraw, RandomDraw, ReplayDraw, format_list, format_value
from space.expr import Expr
from space.grammar import DEFAULTS, Param, SpaceError, holds, parse_space, space_error

SPACES_DIR = Path(__file__).parent / "spaces"
PROFILES = {"cpu": "crammed_bert_cpu.yaml", "gpu": "crammed_bert.yaml"}
# Random draws `load_space` spends proving that the space has a valid point.
FEASIBILITY_DRAWS = 2000

__all__ = ["SearchSpace", "SpaceError", "default_space_path", "load_space", "mutate"]


def load_space(path: str | Path) -> SearchSpace:
    """Read, check and return the search space in `path`; every mistake is a one-line SpaceError."""
    path = Path(path)
    if not path.is_file():
        raise space_error(path.name, "file", f"not found at {path.resolve()}",
                          f"pass an existing YAML file, e.g. {default_space_path('cpu')}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e)
        if isinstance(e, yaml.constructor.ConstructorError):  # e.g. !!python/object: safe_load builds no objects
            raise space_error(path.name, where, f"YAML tag not allowed: {problem}",
                              "remove the tag; a space file holds plain values only") from None
        raise space_error(path.name, where, f"YAML syntax error: {problem}", "fix the YAML syntax") from None
    definition = parse_space(data, path.name)
    space = SearchSpace(definition.name, path, definition.fixed, definition.params, definition.constraints,
                        definition.description)
    rng = random.Random(0)  # a space with no valid point fails here, not in the middle of a study
    space.sample(lambda: RandomDraw(rng), max_attempts=FEASIBILITY_DRAWS)
    return space


def default_space_path(profile: str) -> Path:
    """The shipped space of a device profile: "cpu" (a minute per trial on 2 cores) or "gpu"."""
    if profile not in PROFILES:
        raise ValueError(f"profile: unknown {profile!r}; allowed: {', '.join(PROFILES)}")
    return SPACES_DIR / PROFILES[profile]


class SearchSpace:
    """A loaded space: draws members (`sample`), tests membership (`validate`), and hands the
    walk to the `Draw` adapters (random, Optuna, replay, mutation)."""

    def __init__(self, name: str, path: Path, fixed: dict[str, Any], params: dict[str, Param],
                 constraints: tuple[Expr, ...], description: str = "") -> None:
        self.name = name
        self.path = path
        self.description = description
        self.fixed = fixed
        self.params = params
        self.constraints = constraints

    def __repr__(self) -> str:
        return f"SearchSpace({self.name!r}, {len(self.params)} params, {len(self.constraints)} constraints)"

    def sample(self, new_draw: Callable[[], Draw], max_attempts: int = 200) -> tuple[ArchConfig, Draw]:
        """A valid config and the draw that produced it; each attempt gets a fresh `new_draw()`,
        and an invalid point is rejected to its draw (an Optuna trial is told PRUNED) and redrawn."""
        reason = ""
        for _ in range(max_attempts):
            draw = new_draw()
            config, reason = self._draw_point(draw)
            if config is not None:
                return config, draw
            draw.reject(reason)
        key = "constraints" if self.constraints else "params"
        raise space_error(self.path.name, key, f"no valid point in {max_attempts} draws "
                          f"(last reason: {reason})", "relax the constraints or widen the params")

    def sample_random(self, rng: random.Random) -> ArchConfig:
        return self.sample(lambda: RandomDraw(rng))[0]

    def validate(self, config: ArchConfig) -> str | None:
        """Why `config` is not a member of this space, or None when it is."""
        return self._replay(config)[1]

    def contains(self, config: ArchConfig) -> bool:
        return self.validate(config) is None

    def walk(self, draw: Draw) -> tuple[dict[str, Any] | None, str | None]:
        """Ask `draw` for every active parameter in file order. Returns every field's value (fixed,
        drawn, or default for what is not drawn), or None and why no option was left to draw."""
        values = {**DEFAULTS, **self.fixed}
        for param in self.params.values():
            if param.exists_when and not self._holds(param.exists_when, values, f"params.{param.field}.when"):
                continue  # inactive: keeps its default
            if param.kind == "fixed":
                values[param.field] = param.options[0]
            elif param.kind in ("choice", "bool"):
                options = self._options(param, values)
                if not options:
                    return None, (f"{param.field}: no option of {format_list(param.options)} satisfies "
                                  f"{param.when.source!r}")
                # Optuna refuses one name with two distributions, so a filtered subset gets its own.
                subset = len(options) < len(param.options)
                label = f"{param.field}{format_list(options, ',')}" if subset else param.field
                values[param.field] = draw.categorical(param.field, label, options)
            elif param.kind == "int":
                values[param.field] = draw.integer(param.field, param.field, param.low, param.high,
                                                   param.step, param.log)
            else:
                values[param.field] = draw.real(param.field, param.field, param.low, param.high,
                                                param.step, param.log)
        return values, None

    def build(self, values: dict[str, Any]) -> tuple[ArchConfig | None, str | None]:
        """The config of `values`, or None and why it is invalid (ArchError or a violated constraint)."""
        try:
            config = ArchConfig(**values)
        except ArchError as e:
            return None, str(e)
        env = {**config.to_dict(), **config.derived()}
        for index, constraint in enumerate(self.constraints):
            if not self._holds(constraint, env, f"constraints[{index}]"):
                return None, f"violates {constraint.source!r}"
        return config, None

    # ---- internals ----------------------------------------------------------------------------
    def _draw_point(self, draw: Draw) -> tuple[ArchConfig | None, str]:
        values, reason = self.walk(draw)
        if values is not None:
            config, reason = self.build(values)
            if config is not None:
                return config, ""
        return None, reason or ""

    def _replay(self, config: ArchConfig) -> tuple[ReplayDraw, str | None]:
        """Walk with `config`'s own values; the reason it is not a member, if any."""
        replay = ReplayDraw(config)
        values, reason = self.walk(replay)
        if replay.reason or values is None:
            return replay, replay.reason or reason
        for field, value in config.to_dict().items():
            if values[field] != value:  # fixed, inactive or unmentioned fields keep one value
                return replay, f"{field}: {format_value(value)} is not allowed here; the space holds it at " \
                               f"{format_value(values[field])}"
        return replay, self.build(values)[1]

    def _options(self, param: Param, values: dict[str, Any]) -> tuple[Any, ...]:
        if not param.filters_options:
            return param.options
        key = f"params.{param.field}.when"
        return tuple(o for o in param.options if self._holds(param.when, {**values, param.field: o}, key))

    def _holds(self, expr: Expr, env: dict[str, Any], key: str) -> bool:
        return holds(self.path.name, expr, env, key)


def mutate(space: SearchSpace, config: ArchConfig, rng: random.Random,
           max_attempts: int = 100) -> tuple[ArchConfig, str]:
    """A child of `config` with one active searched parameter changed, plus whatever that forces:
    parameters that become active or lose their value are drawn afresh, those that become inactive
    reset. Returns the child and a description like `hidden: 256 -> 192 (heads: 8 -> 4)`."""
    file = space.path.name
    parent, reason = space._replay(config)
    if reason:
        raise space_error(file, "mutation", f"the parent is not in the space ({reason})",
                          "mutate members only")
    kept = {field: getattr(config, field) for field in parent.asked}
    targets = [field for field, count in parent.asked.items() if count > 1]
    if not targets:
        raise space_error(file, "params", "no active parameter has a second value to mutate to",
                          "search at least one parameter with two or more values")
    for _ in range(max_attempts):
        target = rng.choice(targets)
        child, reason = space._draw_point(MutationDraw(target, kept, rng))
        if child is not None:
            return child, _describe_change(config, child, target)
    raise space_error(file, "constraints", f"no valid mutation in {max_attempts} tries "
                      f"(last reason: {reason})", "relax the constraints")


def _describe_change(parent: ArchConfig, child: ArchConfig, target: str) -> str:
    def change(field: str) -> str:
        return f"{field}: {format_value(getattr(parent, field))} -> {format_value(getattr(child, field))}"

    dependents = [change(f) for f in FIELD_TYPES if f != target and getattr(parent, f) != getattr(child, f)]
    return change(target) + (f" ({', '.join(dependents)})" if dependents else "")
