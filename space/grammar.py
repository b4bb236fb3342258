"""The search-space grammar: checks a parsed YAML document, key by key, into `Param`s.

    name: crammed-bert-cpu                     # required
    description: ...                           # optional
    fixed: {max_seq_len: 128, vocab_size: 8192}
    params:                                    # drawn in file order
      hidden:     {choice: [128, 192, 256]}
      heads:      {choice: [2, 4, 8], when: "hidden % heads == 0"}   # names itself: option filter
      layers:     {int: [2, 6]}                                      # modifiers: step, log
      ffn_mult:   {float: [2.0, 4.0], step: 0.5}                     # modifiers: step, log
      qkv_bias:   {bool}                                             # true or false
      final_norm: {bool, when: "norm_placement != 'post'"}           # existence condition
      vocab_size: {fixed: 8192}                                      # fixed works here too
    constraints:
      - "params_millions <= 8"

Every key is an ArchConfig field. A `when` may name fixed fields, parameters drawn earlier and,
as an option filter (choice and bool only), the parameter itself. Constraints may name every
ArchConfig field and `ArchConfig.derived()`. Every mistake is a one-line `SpaceError`:
`<file>: <key>: <problem>; <fix>`.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from space.arch import CHOICES, FIELD_TYPES, ArchConfig, ArchError, yaml_number_hint
from space.draw import format_list, format_value
from space.errors import CramnasError
from space.expr import ALLOWED, Expr, ExprError

TOP_LEVEL_KEYS = ("name", "description", "fixed", "params", "constraints")
KINDS = ("choice", "int", "float", "bool", "fixed")
MODIFIERS = {"choice": ("when",), "bool": ("when",), "fixed": ("when",),
             "int": ("step", "log", "when"), "float": ("step", "log", "when")}
KIND_HINT = {"bool": "{bool}", "int": "{int: [low, high]} or {choice: [...]}",
             "float": "{float: [low, high]} or {choice: [...]}", "str": "{choice: [...]}"}
TYPE_WORDS = {"bool": "true or false", "int": "integers", "float": "numbers", "str": "one of"}

DEFAULTS = ArchConfig().to_dict()
DERIVED = tuple(ArchConfig().derived())
# Option filters are proven to always leave an option by enumerating at most this many
# combinations of the values they name.
MAX_FILTER_COMBINATIONS = 10_000


class SpaceError(CramnasError):
    """A search space that cannot be used; one line: `<file>: <key>: <problem>; <fix>`."""


def space_error(file: str, key: str, problem: str, fix: str) -> SpaceError:
    return SpaceError(" ".join(f"{file}: {key}: {problem}; {fix}".split()))  # always one line


def did_you_mean(word: Any, allowed: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(allowed), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def holds(file: str, expr: Expr, env: dict[str, Any], key: str) -> bool:
    """Whether `expr` is true in `env`; an expression that cannot be evaluated is the file's fault."""
    try:
        return bool(expr.evaluate(env))
    except ExprError as e:
        raise space_error(file, key, str(e), "make the expression valid for every value drawn") from None


@dataclass(frozen=True)
class Param:
    """One entry under `params`. `options` holds a choice's values, (True, False) for bool, and the
    one value of fixed; `low`/`high`/`step`/`log` describe int and float ranges."""

    field: str
    kind: str
    options: tuple[Any, ...] = ()
    low: float = 0
    high: float = 0
    step: float | None = None
    log: bool = False
    when: Expr | None = None
    filters_options: bool = False  # `when` names the param itself: keep only options where it holds

    @property
    def exists_when(self) -> Expr | None:
        return None if self.filters_options else self.when


@dataclass(frozen=True)
class SpaceDefinition:
    """A checked document: what `SearchSpace` is built from."""

    name: str
    description: str
    fixed: dict[str, Any]
    params: dict[str, Param]
    constraints: tuple[Expr, ...]


def parse_space(data: Any, file: str) -> SpaceDefinition:
    """Check the document `yaml.safe_load` read from `file`; raise a SpaceError at the first mistake."""
    return _Parser(file).space(data)


class _Parser:
    """Checks one parsed document key by key; `fail` names the file and the key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, problem: str, fix: str) -> SpaceError:
        return space_error(self.file, key, problem, fix)

    def space(self, data: Any) -> SpaceDefinition:
        if not isinstance(data, dict):
            raise self.fail("top level", f"expected a mapping, got {_kind_of(data)}",
                            f"write the keys {', '.join(TOP_LEVEL_KEYS)}")
        for key in data:
            if key not in TOP_LEVEL_KEYS:
                raise self.fail(str(key), "unknown top-level key",
                                f"{did_you_mean(key, TOP_LEVEL_KEYS)}allowed: {', '.join(TOP_LEVEL_KEYS)}")
        for key in ("name", "params"):
            if data.get(key) is None:
                raise self.fail(key, "missing", "every space has a name (a string) and params (a mapping)")
        if not isinstance(data["name"], str):
            raise self.fail("name", f"expected a string, got {_kind_of(data['name'])}",
                            "write name: my-space")
        description = data.get("description") or ""
        if not isinstance(description, str):
            raise self.fail("description", f"expected a string, got {_kind_of(description)}", "write text")
        fixed = self.fixed(data.get("fixed") or {})
        params = self.params(data["params"], fixed)
        self.check_fixed_together(fixed, params)
        constraints = self.constraints(data.get("constraints") or [])
        return SpaceDefinition(data["name"], description, fixed, params, constraints)

    # ---- fixed -------------------------------------------------------------------------------
    def fixed(self, fixed: Any) -> dict[str, Any]:
        if not isinstance(fixed, dict):
            raise self.fail("fixed", f"expected a mapping of fields to values, got {_kind_of(fixed)}",
                            "write fixed: {vocab_size: 8192}")
        for field in fixed:
            self.check_field(field, f"fixed.{field}", "unknown field")
        return {field: self.value(field, value, f"fixed.{field}") for field, value in fixed.items()}

    def check_fixed_together(self, fixed: dict[str, Any], params: dict[str, Param]) -> None:
        """Report what ArchConfig refuses in the fixed values, unless a searched field is involved:
        `fixed: {heads: 5}` must not fail on the default hidden=768 when hidden is searched."""
        try:
            ArchConfig(**fixed)
        except ArchError as e:
            involved = set(re.findall(r"\w+", str(e))) & set(FIELD_TYPES)
            if not involved & set(params):
                field, _, message = str(e).partition(": ")
                problem, _, fix = message.partition("; ")  # ArchError may already say what to do
                key = f"fixed.{field}" if field in fixed else "fixed"
                raise self.fail(key, problem, fix or "choose values ArchConfig accepts") from None

    # ---- params ------------------------------------------------------------------------------
    def params(self, params: Any, fixed: dict[str, Any]) -> dict[str, Param]:
        if not isinstance(params, dict) or not params:
            got = "an empty one" if params == {} else _kind_of(params)
            raise self.fail("params", f"expected a mapping of fields to specs, got {got}",
                            "write params: {layers: {int: [2, 6]}}")
        parsed: dict[str, Param] = {}
        for field, spec in params.items():
            key = f"params.{field}"
            self.check_field(field, key, "unknown parameter")
            if field in fixed:
                raise self.fail(key, "is also under fixed", "a field is either fixed or searched; remove one")
            param = self.param(field, spec, key)
            if param.when is not None:
                param = self.condition(param, key, fixed, parsed, params)
            parsed[field] = param
        return parsed

    def param(self, field: str, spec: Any, key: str) -> Param:
        kinds_help = ("write one of {choice: [...]}, {int: [low, high]}, {float: [low, high]}, {bool}, "
                      "{fixed: value}")
        if not isinstance(spec, dict):
            raise self.fail(key, f"expected a mapping, got {_kind_of(spec)} {spec!r}", kinds_help)
        every_key = KINDS + ("step", "log", "when")
        for name in spec:
            if name not in every_key:
                raise self.fail(f"{key}.{name}", "unknown key",
                                f"{did_you_mean(name, every_key)}allowed: {', '.join(every_key)}")
        kinds = [name for name in spec if name in KINDS]
        if len(kinds) != 1:
            problem = "no kind" if not kinds else f"two kinds ({', '.join(kinds)})"
            raise self.fail(key, problem, f"give exactly one kind: {kinds_help}")
        kind = kinds[0]
        for name in spec:
            if name != kind and name not in MODIFIERS[kind]:
                raise self.fail(f"{key}.{name}", f"does not apply to {kind}",
                                f"{kind} takes {', '.join(MODIFIERS[kind])}")
        field_type = FIELD_TYPES[field]
        if kind in ("bool", "int", "float") and field_type != kind:
            raise self.fail(f"{key}.{kind}", f"{kind} does not fit {field}",
                            f"{field} takes {TYPE_WORDS[field_type]}: write {KIND_HINT[field_type]}")
        when = self.expression(spec["when"], f"{key}.when") if "when" in spec else None
        if kind == "fixed":
            return Param(field, kind, (self.value(field, spec[kind], f"{key}.fixed"),), when=when)
        if kind == "bool":
            if spec[kind] is not None:
                raise self.fail(f"{key}.bool", f"takes no value, got {spec[kind]!r}",
                                "write {bool} to search true and false")
            return Param(field, kind, (True, False), when=when)
        if kind == "choice":
            return Param(field, kind, self.choice(field, spec[kind], f"{key}.choice"), when=when)
        return self.range(field, kind, spec, key, when)

    def choice(self, field: str, options: Any, key: str) -> tuple[Any, ...]:
        if not isinstance(options, list) or not options:
            raise self.fail(key, f"expected a non-empty list, got {options!r}", "write choice: [a, b, c]")
        values = tuple(self.value(field, option, key) for option in options)
        duplicates = sorted({format_value(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise self.fail(key, f"{', '.join(duplicates)} listed twice", "list each option once")
        return values

    def range(self, field: str, kind: str, spec: dict[str, Any], key: str, when: Expr | None) -> Param:
        bounds, step, log = spec[kind], spec.get("step"), spec.get("log", False)
        number = (int,) if kind == "int" else (int, float)
        if (not isinstance(bounds, list) or len(bounds) != 2
                or any(isinstance(b, bool) or not isinstance(b, number) for b in bounds)):
            raise self.fail(f"{key}.{kind}", f"expected [low, high] of two {TYPE_WORDS[kind]}, "
                            f"got {bounds!r}", f"write {kind}: [low, high]")
        low, high = bounds
        if not all(math.isfinite(b) for b in bounds):
            raise self.fail(f"{key}.{kind}", f"bounds must be finite, got {bounds!r}", "write finite numbers")
        if low > high:
            raise self.fail(f"{key}.{kind}", f"low {low} is above high {high}", f"write [{high}, {low}]")
        if not isinstance(log, bool):
            raise self.fail(f"{key}.log", f"expected true or false, got {log!r}", "write log: true")
        if log and low <= 0:
            raise self.fail(f"{key}.log", f"a log range needs low > 0, got {low}", "raise low or drop log")
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, number) or step <= 0:
                raise self.fail(f"{key}.step", f"expected a positive {kind}, got {step!r}", "write step: 2")
            if log and (kind == "float" or step > 1):  # Optuna refuses both
                raise self.fail(f"{key}.step", "step and log together", "use one of step and log")
            steps = (high - low) / step
            if not math.isclose(steps, round(steps), abs_tol=1e-9):
                raise self.fail(f"{key}.step", f"{step} does not divide the range [{low}, {high}]",
                                "choose high = low + a whole number of steps")
        if kind == "int":
            return Param(field, kind, low=low, high=high, step=step or 1, log=log, when=when)
        step = None if step is None else float(step)
        return Param(field, kind, low=float(low), high=float(high), step=step, log=log, when=when)

    def condition(self, param: Param, key: str, fixed: dict[str, Any],
                  earlier: dict[str, Param], every_param: dict[str, Any]) -> Param:
        """Check what a `when` may name; naming the param itself makes it an option filter."""
        known = [*fixed, *earlier, param.field]
        for name in sorted(param.when.names):
            if name in known:
                continue
            if name in every_param:
                raise self.fail(f"{key}.when", f"names {name!r}, which is drawn later",
                                f"move {name} above {param.field} in params")
            if name in FIELD_TYPES:
                raise self.fail(f"{key}.when", f"names {name!r}, which is neither fixed nor a parameter",
                                f"add {name} to fixed or to params above {param.field}")
            raise self.fail(f"{key}.when", f"unknown name {name!r}",
                            f"{did_you_mean(name, known)}allowed: {', '.join(known)}")
        if param.field not in param.when.names:
            return param
        if param.kind not in ("choice", "bool"):
            raise self.fail(f"{key}.when", f"names {param.field} itself: an option filter, but "
                            f"{param.kind} has no options to filter",
                            "filter choice or bool params only, or drop the self-reference")
        param = dataclasses.replace(param, filters_options=True)
        self.check_filter(param, fixed, earlier, key)
        return param

    def check_filter(self, param: Param, fixed: dict[str, Any], earlier: dict[str, Param], key: str) -> None:
        """Fail when some value combination of what the filter names leaves no option. Skipped for
        conditional, filtered, float or large ranges: their reachable values are not known here."""
        names = sorted(param.when.names - {param.field})
        value_lists = [[fixed[n]] if n in fixed else _enumerable(earlier[n]) for n in names]
        if any(v is None for v in value_lists) or math.prod(map(len, value_lists)) > MAX_FILTER_COMBINATIONS:
            return
        for combination in itertools.product(*value_lists):
            env = {**DEFAULTS, **fixed, **dict(zip(names, combination))}
            if not any(holds(self.file, param.when, {**env, param.field: option}, f"{key}.when")
                       for option in param.options):
                where = ", ".join(f"{n}={format_value(v)}" for n, v in zip(names, combination))
                raise self.fail(key, f"no choice of {format_list(param.options)} satisfies "
                                f"{param.when.source!r} when {where}",
                                f"allow an option that holds there, or drop that value of {' / '.join(names)}")

    # ---- constraints ---------------------------------------------------------------------------
    def constraints(self, constraints: Any) -> tuple[Expr, ...]:
        if not isinstance(constraints, list):
            raise self.fail("constraints", f"expected a list of expressions, got {_kind_of(constraints)}",
                            'write constraints: ["params_millions <= 8"]')
        known = [*FIELD_TYPES, *DERIVED]
        parsed = []
        for index, source in enumerate(constraints):
            key = f"constraints[{index}]"
            expr = self.expression(source, key)
            unknown = sorted(expr.names - set(known))
            if unknown:
                raise self.fail(key, f"unknown name {unknown[0]!r}", f"{did_you_mean(unknown[0], known)}"
                                f"allowed: ArchConfig fields and {', '.join(DERIVED)}")
            parsed.append(expr)
        return tuple(parsed)

    # ---- pieces -------------------------------------------------------------------------------
    def check_field(self, field: Any, key: str, problem: str) -> None:
        if field not in FIELD_TYPES:
            raise self.fail(key, problem,
                            f"{did_you_mean(field, FIELD_TYPES)}allowed: {', '.join(FIELD_TYPES)}")

    def value(self, field: str, value: Any, key: str) -> Any:
        """`value` converted to `field`'s type, or a SpaceError saying what the field takes."""
        field_type = FIELD_TYPES[field]
        if field_type == "str":
            if value not in CHOICES[field]:
                raise self.fail(key, f"{value!r} is not a {field}", f"{did_you_mean(value, CHOICES[field])}"
                                f"{field} takes one of {', '.join(CHOICES[field])}")
            return value
        if field_type == "bool":
            if not isinstance(value, bool):
                raise self.fail(key, f"{value!r} is not true or false", f"{field} takes true or false")
            return value
        if field_type == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(key, f"{value!r} is not an integer", f"{field} takes integers")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"{value!r} is not a finite number",
                            f"{field} takes numbers{yaml_number_hint(value)}")
        return float(value)

    def expression(self, source: Any, key: str) -> Expr:
        if not isinstance(source, str):
            raise self.fail(key, f"expected an expression string, got {source!r}",
                            'write "hidden % heads == 0"')
        try:
            return Expr(source)
        except ExprError as e:
            raise self.fail(key, str(e), ALLOWED) from None


def _enumerable(param: Param) -> list[Any] | None:
    """Every value an unconditional param can take, if it is a short list; else None."""
    if param.when is not None or param.kind == "float":
        return None
    if param.kind in ("choice", "bool", "fixed"):
        return list(param.options)
    grid = range(param.low, param.high + 1, param.step)  # int ranges hold ints
    return list(grid) if len(grid) <= MAX_FILTER_COMBINATIONS else None


def _kind_of(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing"}.get(
        type(value), type(value).__name__)
