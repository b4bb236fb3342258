"""A surrogate of real crams: gradient boosting fitted to `benchmarks/cram_table.csv`, the ground
truth `benchmarks/controller_efficiency.py` runs every controller against (NAS-Bench-301, YAHPO).

    python benchmarks/surrogate.py [--table benchmarks/cram_table.csv] [--folds 5] [--repeats 5]

What it fits, and why:
- rows: every cram with a loss (a row with an `error` or no loss is skipped); the target is the
  mean validation loss of each architecture over its seeds (the fingerprint of its fields today), one
  row per architecture, so the few architectures crammed with 3 seeds do not weigh 3 times, and
  cross-validation over these rows is grouped by architecture by construction (no seed of a
  held-out architecture is ever trained on);
- features: every searched field of the space as the model sees it (bools 0/1, numbers and numeric
  choices as their value, named choices one-hot) plus log(params) and log(flops per token), the
  two sizes a FLOP budget trades against each other and that trees cannot rebuild from the fields;
- model: scikit-learn's HistGradientBoostingRegressor and GradientBoostingRegressor are both
  cross-validated (repeated K-fold over architectures) and the one with the lower held-out RMSE is
  kept and named in the output; held-out Kendall tau and Spearman come with percentile-bootstrap
  95% intervals over held-out architectures;
- noise: the pooled seed-to-seed standard deviation of the loss over architectures with 2+ seeds,
  beside the surrogate's held-out RMSE (a surrogate cannot be read closer than this noise);
- importance: permutation importance of the fitted model per field, permuting a field's values
  across the table's architectures and rebuilding each ArchConfig, so that the derived sizes move
  with it (permuting one-hot columns apart would leave log(params) to carry `hidden` and `layers`);
  in-sample (on the rows it was fitted to), in nats of RMSE added. Each field's best value is the
  one with the lowest mean prediction over random members of the space that take it.

`Surrogate.predict(configs)` and `Surrogate.noise_sd` are what the controller benchmark uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from sklearn.ensemble import GradientBoostingRegressor, HistGradientBoostingRegressor
from sklearn.model_selection import KFold
from threadpoolctl import threadpool_limits

from search.analysis.cram_table import TableCram, read_crams
from space import SearchSpace, default_space_path, load_space
from space.arch import ArchConfig, ArchError

DEFAULT_TABLE = Path(__file__).parent / "cram_table.csv"
RANDOM_MEMBERS = 20_000  # random members of the space: best values, and the optimum controllers are read against
BOOTSTRAP = 1000

# Small tables (a few hundred architectures): shallow trees, a slow learning rate and small leaves;
# HistGradientBoosting's defaults (leaves of 20) are made for tens of thousands of rows.
MODELS = {
    "HistGradientBoosting": lambda seed: HistGradientBoostingRegressor(
        learning_rate=0.05, max_iter=300, max_leaf_nodes=8, min_samples_leaf=4, l2_regularization=1.0,
        early_stopping=False, random_state=seed),
    "GradientBoosting": lambda seed: GradientBoostingRegressor(
        learning_rate=0.05, n_estimators=300, max_depth=3, min_samples_leaf=3, subsample=0.8, random_state=seed),
}


# ---- the table (its rows: search.analysis.cram_table) --------------------------------------------

def by_architecture(crams: Sequence[TableCram]) -> tuple[list[ArchConfig], np.ndarray, np.ndarray]:
    """One entry per architecture, in order of first appearance: config, mean loss, seeds crammed."""
    groups: dict[str, list[TableCram]] = defaultdict(list)
    for cram in crams:
        groups[cram.architecture].append(cram)
    configs = [rows[0].config for rows in groups.values()]
    return (configs, np.array([np.mean([r.loss for r in rows]) for rows in groups.values()]),
            np.array([len(rows) for rows in groups.values()]))


def seed_noise(crams: Sequence[TableCram]) -> tuple[float, int]:
    """Pooled seed-to-seed standard deviation over architectures with 2+ seeds, and how many there
    are: sqrt(sum of squared deviations from each architecture's mean / sum of (seeds - 1))."""
    groups: dict[str, list[float]] = defaultdict(list)
    for cram in crams:
        groups[cram.architecture].append(cram.loss)
    repeated = [np.array(losses) for losses in groups.values() if len(losses) >= 2]
    if not repeated:
        return math.nan, 0
    squares = sum(float(((x - x.mean()) ** 2).sum()) for x in repeated)
    return math.sqrt(squares / sum(len(x) - 1 for x in repeated)), len(repeated)


def source_mean(crams: Sequence[TableCram], source: str) -> float | None:
    """The mean loss of the rows from `source` (e.g. hand:sized-cpu), or None without any."""
    losses = [c.loss for c in crams if c.source == source]
    return float(np.mean(losses)) if losses else None


# ---- features ----------------------------------------------------------------------------------

class Features:
    """The matrix a model sees for a list of configs: one block of columns per searched field."""

    def __init__(self, space: SearchSpace) -> None:
        self.fields = [p.field for p in space.params.values() if p.kind != "fixed"]
        self.onehot: dict[str, tuple[Any, ...]] = {}  # named choices only; numeric ones keep their order
        for p in space.params.values():
            if p.kind == "choice" and any(isinstance(o, str) for o in p.options):
                self.onehot[p.field] = p.options
        self.columns = [f"{name}={option}" for name in self.fields for option in self.onehot.get(name, (None,))]
        self.columns = [c.removesuffix("=None") for c in self.columns] + ["log_params", "log_flops_per_token"]

    def __call__(self, configs: Sequence[ArchConfig]) -> np.ndarray:
        rows = []
        for config in configs:
            row: list[float] = []
            for name in self.fields:
                value = getattr(config, name)
                if name in self.onehot:
                    row += [float(value == option) for option in self.onehot[name]]
                else:
                    row.append(float(value))  # bools 0/1; trees only need the order of numbers
            row += [math.log(config.num_params()), math.log(config.flops_per_token())]
            rows.append(row)
        return np.array(rows)


# ---- held-out quality --------------------------------------------------------------------------

def out_of_fold(model: str, X: np.ndarray, y: np.ndarray, folds: int, repeats: int, seed: int) -> np.ndarray:
    """Held-out predictions, (repeats, architectures): each repeat a fresh K-fold split of the
    architectures, each architecture predicted by the model fitted without it."""
    predictions = np.empty((repeats, len(y)))
    for repeat in range(repeats):
        for train, test in KFold(folds, shuffle=True, random_state=seed + repeat).split(X):
            fitted = MODELS[model](seed + repeat).fit(X[train], y[train])
            predictions[repeat, test] = fitted.predict(X[test])
    return predictions


@dataclass
class Quality:
    """Held-out Kendall tau, Spearman (each (mean over repeats, 2.5%, 97.5%)) and RMSE."""

    kendall: tuple[float, float, float]
    spearman: tuple[float, float, float]
    rmse: float


def quality(y: np.ndarray, predictions: np.ndarray, seed: int, boot: int = BOOTSTRAP) -> Quality:
    """Rank agreement of held-out predictions with the measured losses, averaged over the repeats;
    the intervals resample the architectures (percentile bootstrap), which is what varies from
    one table to another of the same size."""
    def both(index: np.ndarray) -> tuple[float, float]:
        taus = [stats.kendalltau(y[index], p[index]).statistic for p in predictions]
        rhos = [stats.spearmanr(y[index], p[index]).statistic for p in predictions]
        return float(np.nanmean(taus)), float(np.nanmean(rhos))

    rng = np.random.default_rng(seed)
    tau, rho = both(np.arange(len(y)))
    draws = np.array([both(rng.integers(0, len(y), len(y))) for _ in range(boot)])
    low, high = np.nanpercentile(draws, [2.5, 97.5], axis=0)
    rmse = float(np.sqrt(np.mean((predictions - y) ** 2)))
    return Quality((tau, low[0], high[0]), (rho, low[1], high[1]), rmse)


# ---- the surrogate -----------------------------------------------------------------------------

@dataclass
class Surrogate:
    """A fitted model of the validation loss of any member of the space, and what was measured
    about it. `predict` is noise-free; `noise_sd` is the seed-to-seed noise to add back."""

    space: SearchSpace
    features: Features
    model_name: str
    model: Any
    noise_sd: float
    noise_architectures: int
    configs: list[ArchConfig]  # the table's architectures
    losses: np.ndarray  # their mean measured loss
    crams: list[TableCram]
    skipped: int
    quality: dict[str, Quality] = field(default_factory=dict)  # by model name; empty when the table is too small
    importance: list[tuple[str, float]] = field(default_factory=list)  # (field, RMSE rise), largest first
    members: list[ArchConfig] = field(default_factory=list)  # random members of the space
    member_predictions: np.ndarray = field(default_factory=lambda: np.empty(0))

    def predict(self, configs: Sequence[ArchConfig]) -> np.ndarray:
        return self.model.predict(self.features(configs))

    def best_value(self, name: str) -> tuple[Any, float, float]:
        """The value of field `name` with the lowest mean prediction over the random members that
        take it: (value, its mean prediction, the spread between the best and worst value's means)."""
        groups: dict[Any, list[float]] = defaultdict(list)
        for config, prediction in zip(self.members, self.member_predictions, strict=True):
            groups[getattr(config, name)].append(prediction)
        means = {value: float(np.mean(p)) for value, p in groups.items()}
        best = min(means, key=means.get)
        return best, means[best], max(means.values()) - means[best]

    def top_fields(self, count: int = 3) -> list[str]:
        return [name for name, _ in self.importance[:count]]

    def optimum(self) -> tuple[float, ArchConfig]:
        """The lowest prediction over the table's architectures and the random members."""
        pool = list(self.configs) + list(self.members)
        values = np.concatenate([self.predict(self.configs), self.member_predictions])
        return float(values.min()), pool[int(values.argmin())]


def permutation_importance(surrogate: Surrogate, repeats: int, seed: int) -> list[tuple[str, float]]:
    """RMSE added, averaged over `repeats` shuffles, when one field's values are shuffled across the
    table's architectures (configs rebuilt, so the derived sizes follow); largest first. A shuffled
    value the architecture cannot take (heads that do not divide hidden) keeps the original."""
    configs, y = surrogate.configs, surrogate.losses
    rng = np.random.default_rng(seed)
    base = math.sqrt(float(np.mean((surrogate.predict(configs) - y) ** 2)))
    rises = []
    for name in surrogate.features.fields:
        rise = 0.0
        for _ in range(repeats):
            donors = rng.permutation(len(configs))
            shuffled = []
            for config, donor in zip(configs, donors, strict=True):
                try:
                    shuffled.append(dataclasses.replace(config, **{name: getattr(configs[donor], name)}))
                except ArchError:
                    shuffled.append(config)
            rise += math.sqrt(float(np.mean((surrogate.predict(shuffled) - y) ** 2))) - base
        rises.append((name, rise / repeats))
    return sorted(rises, key=lambda item: -item[1])


def fit(table: str | Path = DEFAULT_TABLE, space: SearchSpace | None = None, folds: int = 5, repeats: int = 5,
        members: int = RANDOM_MEMBERS, seed: int = 0, boot: int = BOOTSTRAP) -> Surrogate:
    """Fit the surrogate of `table` (see the module's docstring). With fewer than 2 x `folds`
    architectures there is no cross-validation: HistGradientBoosting is kept unchecked and
    `quality` stays empty."""
    space = space or load_space(default_space_path("cpu"))
    crams, skipped = read_crams(table)
    configs, losses, _ = by_architecture(crams)
    if len(configs) < 3:
        raise ValueError(f"{table}: {len(configs)} architectures with a loss; need at least 3 to fit a surrogate")
    features = Features(space)
    X = features(configs)
    scores: dict[str, Quality] = {}
    if len(configs) >= 2 * folds:
        scores = {name: quality(losses, out_of_fold(name, X, losses, folds, repeats, seed), seed, boot)
                  for name in MODELS}
    chosen = min(scores, key=lambda name: scores[name].rmse) if scores else "HistGradientBoosting"
    noise_sd, noise_architectures = seed_noise(crams)
    surrogate = Surrogate(space, features, chosen, MODELS[chosen](seed).fit(X, losses), noise_sd,
                          noise_architectures, configs, losses, crams, skipped, scores)
    rng = random.Random(seed)
    surrogate.members = [space.sample_random(rng) for _ in range(members)]
    surrogate.member_predictions = surrogate.predict(surrogate.members) if members else np.empty(0)
    surrogate.importance = permutation_importance(surrogate, repeats=5, seed=seed)
    return surrogate


# ---- report ------------------------------------------------------------------------------------

def interval(value: tuple[float, float, float]) -> str:
    return f"{value[0]:.3f} [{value[1]:.3f}, {value[2]:.3f}]"


def report(surrogate: Surrogate, table: str | Path, folds: int, repeats: int, top: int) -> str:
    s = surrogate
    _, _, seeds = by_architecture(s.crams)
    lines = [f"## Surrogate of {table}", "",
             "| rows with a loss | rows skipped (failed, no loss) | architectures | with 2+ seeds | model kept |",
             "|---|---|---|---|---|",
             f"| {len(s.crams)} | {s.skipped} | {len(s.configs)} | {int((seeds >= 2).sum())} | {s.model_name} |", ""]
    if s.quality:
        lines += [f"Held-out, {repeats} x {folds}-fold cross-validation over architectures (target: each "
                  "architecture's mean loss over its seeds); 95% percentile-bootstrap intervals over architectures:", "",
                  "| model | Kendall tau | Spearman | RMSE (nats) |", "|---|---|---|---|"]
        lines += [f"| {name}{' (kept: lower RMSE)' if name == s.model_name else ''} | {interval(q.kendall)} | "
                  f"{interval(q.spearman)} | {q.rmse:.4f} |" for name, q in s.quality.items()]
    else:
        lines.append(f"No cross-validation: {len(s.configs)} architectures, fewer than 2 x {folds}; "
                     f"{s.model_name} kept unchecked.")
    rmse = f"{s.quality[s.model_name].rmse:.4f}" if s.quality else "n/a"
    noise = "n/a (no architecture with 2+ seeds)" if not s.noise_architectures else f"{s.noise_sd:.4f}"
    lines += ["", "| seed-to-seed sd (pooled) | architectures with 2+ seeds | surrogate held-out RMSE |",
              "|---|---|---|", f"| {noise} | {s.noise_architectures} | {rmse} |", ""]
    lines += [f"Permutation importance of the kept model (in-sample, over the table's {len(s.configs)} "
              "architectures; RMSE added when the field is shuffled) and each field's best value (lowest mean "
              f"prediction over {len(s.members)} random members of the space):", "",
              "| field | importance (nats) | best value | its mean prediction | best-to-worst spread |",
              "|---|---|---|---|---|"]
    for name, rise in s.importance[:top]:
        best, mean, spread = s.best_value(name) if s.members else ("n/a", math.nan, math.nan)
        lines.append(f"| {name} | {rise:.4f} | {best} | {mean:.4f} | {spread:.4f} |")
    value, config = s.optimum()
    lines += ["", f"Lowest prediction (table + random members): {value:.4f}, {config.describe()}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=DEFAULT_TABLE, help="cram table (default: %(default)s)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the K-fold split")
    parser.add_argument("--members", type=int, default=RANDOM_MEMBERS, help="random members of the space")
    parser.add_argument("--top", type=int, default=10, help="fields shown by importance")
    args = parser.parse_args()
    with threadpool_limits(1):  # one core: the machine crams beside it
        surrogate = fit(args.table, folds=args.folds, repeats=args.repeats, members=args.members)
        print(report(surrogate, args.table, args.folds, args.repeats, args.top))


if __name__ == "__main__":
    main()
