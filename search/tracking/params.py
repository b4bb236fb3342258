"""How settings become MLflow params and come back: `arch.<field>`, `train.<field>`, `budget`,
all strings (`str(value)`), and `param_value`, the one way to read one back."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"train": {"lr": 1e-3}}` -> `{"train.lr": 1e-3}`: the dotted names MLflow's compare view shows."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat



def trial_params(arch: Mapping[str, Any], train: Mapping[str, Any], budget: Any = None) -> dict[str, str]:
    """Params of a trial run: `arch.<field>`, `train.<field>` and `budget`, as MLflow strings."""
    params = {**flatten(arch, "arch."), **flatten(train, "train.")}
    if budget is not None:
        params["budget"] = budget
    return {name: str(value) for name, value in params.items()}


def param_value(text: str) -> Any:
    """An MLflow param back to the value it was logged from (`str(value)`): `1e-12`, `True`,
    `[0.9, 0.98]`, `None`; names such as `geglu` stay strings. The one way params are read back."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def params_under(params: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """`{"train.lr": "0.002"}` -> `{"lr": 0.002}` for `prefix="train"`, values parsed back. Keys may
    carry a `params.` column prefix (a row of `StudyTracker.trial_table`); a param the run lacks
    (NaN in such a row) is left out."""
    out = {}
    for key, value in params.items():
        name = key.removeprefix("params.")
        if name.startswith(prefix + ".") and isinstance(value, str):
            out[name[len(prefix) + 1:]] = param_value(value)
    return out

