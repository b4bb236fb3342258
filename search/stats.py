"""The Student-t interval that search.confirm's table and the study report both give."""

from __future__ import annotations


def mean_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its Student-t confidence interval (None for a single value)."""
    from scipy import stats  # a second to import: only when an interval is asked for

    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    sem = stats.sem(values)
    if sem == 0:
        return mean, 0.0
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=sem)
    return mean, float(high - low) / 2
