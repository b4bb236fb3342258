"""The Student-t interval, the paired seed-by-seed difference and their wording: the one definition
that search.confirm's table, the study report and the benchmarks' tables all give.

    interval([4.1, 4.3, 4.2]).text()                    4.200 ± 0.248
    interval([4.1, 4.3, 4.2]).text(show_n=True)         4.200 ± 0.248 (n=3)
    interval([4.1]).text()                              4.100
    paired({0: 4.1, 1: 4.3}, {0: 4.9, 1: 5.0}).text()   -0.750 ± 0.635, outside noise
    correlation(x, y, "spearman")                       (rho, low, high): ranks and a bootstrap interval
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


def mean_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float | None]:
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


def plus_minus(mean: float, half: float | None, digits: int = 3, *, scale: float = 1.0, signed: bool = False) -> str:
    """`4.253 ± 0.234` (values times `scale`, `+4.253 ± ...` when `signed`); the mean alone where `half` is None."""
    text = f"{scale * mean:{'+' if signed else ''}.{digits}f}"
    return text if half is None else f"{text} ± {scale * half:.{digits}f}"


@dataclass(frozen=True)
class Interval:
    """The mean of `n` values and the half-width of its 95% Student-t interval (None below two values)."""

    n: int
    mean: float  # NaN for no value
    half: float | None

    @property
    def has_interval(self) -> bool:
        return self.half is not None

    @property
    def low(self) -> float:
        return math.nan if self.half is None else self.mean - self.half

    @property
    def high(self) -> float:
        return math.nan if self.half is None else self.mean + self.half

    def text(self, digits: int = 3, *, scale: float = 1.0, signed: bool = False, show_n: bool = False) -> str:
        """`4.253 ± 0.234`, `4.253 ± 0.234 (n=3)` with `show_n`; one value: `4.253`, `4.253 (n=1)`."""
        return plus_minus(self.mean, self.half, digits, scale=scale, signed=signed) + (f" (n={self.n})" if show_n else "")


def interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of `values` and its Student-t interval (`mean_interval`); no value: n=0, mean NaN."""
    values = list(values)
    if not values:
        return Interval(0, math.nan, None)
    return Interval(len(values), *mean_interval(values, confidence))


def noise_verdict(outside_noise: bool | None) -> str:
    """A paired difference's verdict in words, the same in every table."""
    if outside_noise is None:
        return "noise not measured (one seed)"
    return "outside noise" if outside_noise else "within noise"


@dataclass(frozen=True)
class Difference(Interval):
    """A paired difference, a - b seed by seed, and its interval."""

    @property
    def outside_noise(self) -> bool | None:
        """Whether the 95% interval excludes 0; None below two pairs (no interval)."""
        return None if self.half is None else abs(self.mean) > self.half

    @property
    def verdict(self) -> str:
        return noise_verdict(self.outside_noise)

    def text(self, digits: int = 3, *, scale: float = 1.0, signed: bool = True, show_n: bool = False) -> str:
        """`-0.703 ± 0.317, outside noise`; one pair: `-0.703, noise not measured (one seed)`."""
        return f"{super().text(digits, scale=scale, signed=signed, show_n=show_n)}, {self.verdict}"


def paired(a: Mapping | Sequence[float], b: Mapping | Sequence[float], confidence: float = CONFIDENCE) -> Difference:
    """a - b seed by seed: two mappings seed -> value pair over the seeds both have (in seed order);
    two sequences (seeds in the same order) pair by position, as far as the shorter goes."""
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise TypeError("paired: two mappings seed -> value or two sequences, not one of each")
    if isinstance(a, Mapping):
        differences = [a[seed] - b[seed] for seed in sorted(a.keys() & b.keys())]
    else:
        differences = [x - y for x, y in zip(a, b, strict=False)]
    ci = interval(differences, confidence)
    return Difference(ci.n, ci.mean, ci.half)


def correlation(x: Sequence[float], y: Sequence[float], kind: str, resamples: int = 5000) -> tuple[float, float, float]:
    """Rank correlation (`kind` "spearman" or "kendall") of paired values and its percentile
    bootstrap 95% interval, the pairs resampled (e.g. architectures); seeded, so a table repeats.
    A resample that draws one value for all ranks nothing and is left out of the interval (few
    pairs draw such); `resamples=0`: the correlation alone, NaN bounds."""
    import warnings

    import numpy as np  # scipy's bootstrap: only when a correlation is asked for
    from scipy import stats

    statistic = {"spearman": lambda a, b: stats.spearmanr(a, b)[0], "kendall": lambda a, b: stats.kendalltau(a, b)[0]}[kind]
    with warnings.catch_warnings():  # the one-value resamples, left out below
        warnings.simplefilter("ignore", (stats.ConstantInputWarning, stats.DegenerateDataWarning))
        point = float(statistic(x, y))
        if not resamples:
            return point, math.nan, math.nan
        draws = stats.bootstrap((np.asarray(x), np.asarray(y)), statistic, paired=True, vectorized=False,
                                n_resamples=resamples, method="percentile",
                                random_state=np.random.default_rng(0)).bootstrap_distribution
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return point, math.nan, math.nan
    low, high = np.quantile(draws, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return point, float(low), float(high)
