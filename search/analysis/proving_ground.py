"""The proving ground's reading of its runs (benchmarks/proving_ground.py runs the studies and
their confirmations): each study's confirmed candidates and the hand-designed baselines, budget by
budget, from MLflow; each study's winner (its candidate of lowest mean validation loss at the long
budget); and the tables: per configuration its loss, nats below the corruption floor and probe
average with 95% intervals over the seeds, each winner against each baseline and the searched
controller's against random's as paired per-seed differences, and whether the trial budget ranks
the candidates as the long budget does."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd

from search.analysis.stats import correlation, interval, paired
from search.base import tags as tag
from search.base.paths import CONFIGS
from search.tracking.params import params_under
from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.regimes import regime_of

COLUMNS = {"validation_loss": "validation loss", "nats_below_floor": "nats below corruption floor",
           "probe_average": "probe average"}
CONTROL = "random"  # the control every searched controller is held against
SEED, BUDGET = tag.column(tag.SEED), tag.column(tag.BUDGET)


class Study(NamedTuple):
    """One study of the proving ground: a controller with one controller seed."""

    controller: str
    seed: int

    @property
    def name(self) -> str:
        return f"pg-{self.controller}-s{self.seed}"


# ---- reading the runs back ------------------------------------------------------------------------

@dataclass
class Configuration:
    """A confirmed candidate or a hand-designed baseline, its finished runs by budget."""

    name: str
    architecture: str
    seeds: dict[str, pd.DataFrame] = field(default_factory=dict)  # budget text -> seed-indexed metrics
    trial: int | None = None  # a candidate's trial number
    trial_loss: float | None = None  # a candidate's trial's own validation loss: one seed, the trial budget

    def loss(self, budget: str) -> float:
        """Mean validation loss under `budget`; infinite without a run there, so never the best."""
        return float(self.seeds[budget]["validation_loss"].mean()) if budget in self.seeds else math.inf


@dataclass
class Results:
    candidates: dict[Study, list[Configuration]]
    baselines: list[Configuration]


def per_seed(frame: pd.DataFrame, keys: list[str]) -> dict[tuple[str, ...], pd.DataFrame]:
    """Finished runs grouped by the columns `keys`, each group as seed-indexed metrics."""
    frame = frame[frame["status"] == "FINISHED"]
    if frame.empty or any(key not in frame for key in keys):
        return {}
    groups = {}
    for names, runs in frame.groupby(keys):
        table = runs.set_index(runs[SEED].astype(int))
        groups[tuple(map(str, names))] = table[[c for c in table if c.startswith("metrics.")]].rename(columns=lambda c: c[8:])
    return groups


def by_budget(groups: dict[tuple[str, ...], pd.DataFrame], make: Callable[[str], Configuration]) -> list[Configuration]:
    """Groups keyed (budget, what ran) as one configuration per what ran, made by `make(what)`."""
    found: dict[str, Configuration] = {}
    for (budget, what), seeds in groups.items():
        if what not in found:
            found[what] = make(what)
        found[what].seeds[budget] = seeds
    return list(found.values())


def read(uri: str, studies: list[Study], baselines_in: str) -> Results:
    """Every study's confirmed candidates and the baselines of `baselines_in`, from MLflow."""
    from search.tracking.tracker import StudyTracker

    groups = per_seed(StudyTracker(uri, baselines_in).baseline_table(), [BUDGET, tag.column(tag.BASELINE_NAME)])
    baselines = by_budget(groups, lambda name: Configuration(
        f"{name} (hand-designed)", describe(load_run_config(CONFIGS / f"{name}.yaml").arch.to_dict())))
    return Results({study: confirmed(uri, study) for study in studies}, baselines)


def confirmed(uri: str, study: Study) -> list[Configuration]:
    """The study's confirmed candidates."""
    from search.tracking.tracker import StudyTracker

    tracker = StudyTracker(uri, study.name)
    trials = tracker.trial_table().set_index("run_id")

    def candidate(run_id: str) -> Configuration:
        trial = trials.loc[run_id]
        return Configuration(f"{study.name} trial {int(trial['trial'])}", describe(params_under(trial.to_dict(), "arch")),
                             trial=int(trial["trial"]), trial_loss=float(trial["metrics.validation_loss"]))

    return by_budget(per_seed(tracker.confirmation_table(), [BUDGET, tag.column(tag.CONFIRMATION_OF)]), candidate)


def winners(results: Results, long: str) -> dict[Study, Configuration]:
    """Each study's candidate of lowest mean validation loss at the long budget (none: not confirmed there)."""
    found = {study: min(configurations, key=lambda c: c.loss(long), default=None)
             for study, configurations in results.candidates.items()}
    return {study: winner for study, winner in found.items() if winner is not None and long in winner.seeds}


def accounted(best: dict[Study, Configuration], long: str, account: str) -> tuple[Study, Configuration]:
    """The study whose winner the accounting takes: the best winner of all (`best`) or of one controller's."""
    eligible = [(study, winner) for study, winner in best.items() if account in ("best", study.controller)]
    if not eligible:
        raise UsageError(f"--account {account}: none of its studies has a candidate confirmed at {long}; see "
                         "the confirmations' logs, then run the same command again")
    return min(eligible, key=lambda pair: pair[1].loss(long))


# ---- the table ----------------------------------------------------------------------------------

def describe(arch: dict) -> str:
    return ArchConfig.from_dict({**ArchConfig().to_dict(), **arch}).describe()


def interval_text(values) -> str:
    values = [float(v) for v in values if pd.notna(v)]
    return interval(values).text() if values else "-"


def paired_text(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> str:
    """a - b over the seeds both have, with its 95% interval and whether it excludes 0."""
    difference = paired(a[metric].astype(float).to_dict(), b[metric].astype(float).to_dict())
    return difference.text(show_n=True) if difference.n >= 2 else "-"


def transfer(pairs: list[tuple[float, float]]) -> str:
    """Whether the trial budget ranks the confirmed candidates as the confirmation budget does: the
    Spearman correlation of (trial loss, confirmed mean loss) with its bootstrap 95% interval."""
    if len(pairs) < 3:
        return f"Transfer from the trial budget to the confirmation budget: {len(pairs)} candidates, too few to rank."
    rho, low, high = correlation(*map(list, zip(*pairs)), "spearman")
    return (f"Transfer from the trial budget to the confirmation budget: Spearman {rho:.2f} (95% bootstrap interval "
            f"{low:.2f} to {high:.2f}) over the {len(pairs)} confirmed candidates, each trial's loss (one seed) against "
            "its confirmed mean.")


def references(results: Results) -> list[str]:
    """The data's reference losses, as the first run recorded them (the same for every run of the data)."""
    configurations = [*(c for found in results.candidates.values() for c in found), *results.baselines]
    first = next((seeds.iloc[0] for c in configurations for seeds in c.seeds.values()), None)
    if first is None or "corruption_floor" not in first:
        return []
    return [f"References (trainer/references.py): corruption floor {first['corruption_floor']:.3f} (frequencies + "
            f"copying: learned nothing), two-neighbour count model {first['context_reference']:.3f}, unigram floor "
            f"{first['unigram_floor']:.3f}.", ""]


def configuration_table(configurations: list[Configuration], budget: str) -> list[str]:
    lines = ["| configuration | architecture | seeds | " + " | ".join(COLUMNS.values()) + " | regime | tokens/s | params |",
             "|---|---|---|---|---|---|---|---|---|"]
    for configuration in sorted((c for c in configurations if budget in c.seeds), key=lambda c: c.loss(budget)):
        seeds = configuration.seeds[budget]
        cells = [interval_text(seeds[m]) if m in seeds else "-" for m in COLUMNS]
        mean = seeds.mean(numeric_only=True).to_dict()
        lines.append(f"| {configuration.name} | {configuration.architecture} | {len(seeds)} | {' | '.join(cells)} | "
                     f"{regime_of(mean) or '-'} | {seeds['tokens_per_s'].mean():,.0f} | {seeds['params'].mean() / 1e6:.2f}M |")
    return lines


def comparisons(results: Results, best: dict[Study, Configuration], budget: str) -> list[str]:
    """Controller seed by controller seed: each study's winner against each baseline, then the
    searched controller's winner against random's, all under `budget`."""
    pairs = []
    for seed in dict.fromkeys(study.seed for study in results.candidates):
        found = [(study, best[study]) for study in results.candidates if study.seed == seed and study in best]
        pairs += [(winner, baseline) for _, winner in found for baseline in results.baselines]
        searched = [winner for study, winner in found if study.controller != CONTROL]
        control = [winner for study, winner in found if study.controller == CONTROL]
        pairs += [(a, b) for a in searched for b in control]
    lines = ["| comparison (paired by seed: first minus second) | validation loss | nats below corruption floor |",
             "|---|---|---|"]
    for a, b in pairs:
        if budget in a.seeds and budget in b.seeds:
            lines.append(f"| {a.name} vs {b.name} | {paired_text(a.seeds[budget], b.seeds[budget], 'validation_loss')} | "
                         f"{paired_text(a.seeds[budget], b.seeds[budget], 'nats_below_floor')} |")
    return lines


def table(results: Results, budgets: dict[str, str]) -> str:
    """The markdown tables of `budgets` (text -> its name, the long budget first, which crowns each
    study's winner)."""
    long = next(iter(budgets))
    best = winners(results, long)
    configurations = [*(c for found in results.candidates.values() for c in found), *results.baselines]
    lines = references(results)
    for budget, label in budgets.items():
        lines += [f"## Under {budget} ({label})", "", *configuration_table(configurations, budget), "",
                  f"Each study's winner is its candidate of lowest mean validation loss under {long}.", "",
                  *comparisons(results, best, budget), ""]
    pairs = [(c.trial_loss, c.loss(long)) for found in results.candidates.values() for c in found if long in c.seeds]
    return "\n".join([*lines, transfer(pairs)])


def budget_names(trial: Budget, long: str) -> dict[str, str]:
    """The long budget and the trial budget (once, where they are the same), each with its name."""
    other = Budget.parse(long)
    factor = f"{other.amount / trial.amount:g}x the trial budget" if other.kind == trial.kind else "the long budget"
    return {long: factor, trial.text: "1x, the trial budget"}
