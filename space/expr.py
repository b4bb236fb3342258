"""Safe expressions for search-space `when` conditions and constraints.

A space file is data, so its expressions must not run code: they are parsed with
`ast.parse(mode="eval")` and compiled into small closures by a walker that accepts a short
whitelist of node types (names, constants, arithmetic, comparisons, boolean logic, `x if c else y`,
list/tuple literals, and calls to min/max/abs/round). Anything else fails when the expression is
compiled, that is when the space is loaded, long before a trial runs.

    expr = Expr("hidden % heads == 0")
    expr.names                               # frozenset({'hidden', 'heads'})
    expr.evaluate({"hidden": 256, "heads": 8})  # True
"""

from __future__ import annotations

import ast
import difflib
import operator
from collections.abc import Callable, Mapping
from typing import Any

from space.errors import CramnasError

# One line for error messages: what an expression may contain.
ALLOWED = ("allowed: names, numbers, strings, true/false/None, + - * / // % **, comparisons "
           "(== != < <= > >= in, not in), and/or/not, `a if c else b`, [lists], min/max/abs/round")

# YAML users write true/false; Python's True/False/None arrive as constants anyway.
CONSTANT_NAMES = {"true": True, "false": False}
FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs, "round": round}
# `2 ** 10 ** 10` would hang the loader; no sane condition needs a larger exponent than this.
MAX_EXPONENT = 64

Evaluator = Callable[[Mapping[str, Any]], Any]


class ExprError(CramnasError):
    """An expression that cannot be compiled or evaluated; the message is one line."""


def _power(base: Any, exponent: Any) -> Any:
    if isinstance(exponent, (int, float)) and abs(exponent) > MAX_EXPONENT:
        raise ExprError(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    return base ** exponent


BINARY_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _power,
}
UNARY_OPERATORS: dict[type, Callable[[Any], Any]] = {
    ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_,
}
COMPARISONS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
CONSTANT_TYPES = (bool, int, float, str, type(None))


class Expr:
    """A compiled expression: `.source`, `.names` (the free names it reads) and `.evaluate(env)`."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as e:  # offset 0 means "at the end": the expression stops too early
            where = f", column {e.offset}" if e.offset else ", at the end"
            raise ExprError(f"{source!r} is not a valid expression ({e.msg}{where})") from None
        names: set[str] = set()
        self._run = _compile(tree.body, names, source)
        self.names = frozenset(names)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """The value of the expression with its names looked up in `env`."""
        missing = sorted(self.names - env.keys())
        if missing:
            hint = difflib.get_close_matches(missing[0], list(env), n=1)
            suggestion = f"did you mean {hint[0]!r}? " if hint else ""
            raise ExprError(f"{self.source!r} names {missing[0]!r}, which is not defined here; "
                            f"{suggestion}known: {', '.join(sorted(env))}")
        try:
            return self._run(env)
        except ExprError as e:
            raise ExprError(f"cannot evaluate {self.source!r}: {e}") from None
        except (ArithmeticError, TypeError, ValueError) as e:
            raise ExprError(f"cannot evaluate {self.source!r}: {type(e).__name__}: {e}") from None

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"


def _compile(node: ast.AST, names: set[str], source: str) -> Evaluator:
    """Turn a whitelisted AST node into a closure over `env`; collect the free names it reads."""

    def sub(child: ast.AST) -> Evaluator:
        return _compile(child, names, source)

    def refuse(what: str) -> ExprError:
        return ExprError(f"{source!r} uses {what}, which is not allowed")

    match node:
        case ast.Constant(value=value) if isinstance(value, CONSTANT_TYPES):
            return lambda env: value
        case ast.Name(id=name) if name in CONSTANT_NAMES:
            constant = CONSTANT_NAMES[name]
            return lambda env: constant
        case ast.Name(id=name) if name.startswith("__"):
            raise refuse(f"the dunder name {name!r}")
        case ast.Name(id=name):
            names.add(name)
            return lambda env: env[name]
        case ast.UnaryOp(op=op, operand=operand) if type(op) in UNARY_OPERATORS:
            apply, value = UNARY_OPERATORS[type(op)], sub(operand)
            return lambda env: apply(value(env))
        case ast.BinOp(left=left, op=op, right=right) if type(op) in BINARY_OPERATORS:
            apply, lhs, rhs = BINARY_OPERATORS[type(op)], sub(left), sub(right)
            return lambda env: apply(lhs(env), rhs(env))
        case ast.BoolOp(op=ast.And(), values=values):
            terms = [sub(v) for v in values]
            return lambda env: _all_of(terms, env)
        case ast.BoolOp(op=ast.Or(), values=values):
            terms = [sub(v) for v in values]
            return lambda env: _any_of(terms, env)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            unknown = [op for op in ops if type(op) not in COMPARISONS]
            if unknown:
                raise refuse(f"the comparison {type(unknown[0]).__name__}")
            return _chain(sub(left), [COMPARISONS[type(op)] for op in ops], [sub(c) for c in comparators])
        case ast.IfExp(test=test, body=body, orelse=orelse):
            condition, then, otherwise = sub(test), sub(body), sub(orelse)
            return lambda env: then(env) if condition(env) else otherwise(env)
        case ast.List(elts=elements) | ast.Tuple(elts=elements):
            if any(isinstance(e, ast.Starred) for e in elements):
                raise refuse("*unpacking")
            items = [sub(e) for e in elements]
            return lambda env: tuple(item(env) for item in items)
        case ast.Call(func=ast.Name(id=name), args=args, keywords=[]) if name in FUNCTIONS:
            if any(isinstance(a, ast.Starred) for a in args):
                raise refuse("*unpacking")
            function, arguments = FUNCTIONS[name], [sub(a) for a in args]
            return lambda env: function(*(argument(env) for argument in arguments))
        case ast.Call():
            raise refuse(f"a call to {ast.unparse(node.func)!r} (only {', '.join(FUNCTIONS)} may be called)")
        case _:
            raise refuse(f"{ast.unparse(node)!r} ({type(node).__name__})")


def _all_of(terms: list[Evaluator], env: Mapping[str, Any]) -> Any:
    value: Any = True
    for term in terms:  # Python's `and`: stop at the first falsy value and return it
        value = term(env)
        if not value:
            return value
    return value


def _any_of(terms: list[Evaluator], env: Mapping[str, Any]) -> Any:
    value: Any = False
    for term in terms:  # Python's `or`: stop at the first truthy value and return it
        value = term(env)
        if value:
            return value
    return value


def _chain(first: Evaluator, tests: list[Callable[[Any, Any], bool]], rest: list[Evaluator]) -> Evaluator:
    """`a < b <= c` holds when every adjacent pair does; later operands are only read if needed."""

    def run(env: Mapping[str, Any]) -> bool:
        left = first(env)
        for test, operand in zip(tests, rest):
            right = operand(env)
            if not test(left, right):
                return False
            left = right
        return True

    return run
