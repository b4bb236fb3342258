"""Recorded runs as pandas frames, and the statistics that both the search and its dashboards read
from them: the score a study ranks by, the confirmations' ranking with 95% intervals, the search
against hand design seed by seed (`search.export` prefers a confirmed winner by them;
`dashboards.report` draws them), and the regimes of trainer/regimes.py.

Frames are what `search.tracking.tracker.StudyTracker.trial_table` returns (one row per run: `trial`,
`run_id`, `status`, `start_time`, `end_time`, `params.*`, `metrics.*`, `tags.*`); `prepare` adds
the few derived columns every view needs. Nothing here reads a store or draws anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from search.analysis.stats import CONFIDENCE, Interval, interval, noise_verdict, paired
from search.base import tags as tag
from search.base.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, Objective
from search.base.states import COMPLETE, FAILED, REPEAT, state_of_status
from trainer.regimes import PLATEAU_MARGIN, regime_of

STATE_COLUMN = tag.column(tag.STATE)
LOSS = "metrics.validation_loss"  # what the search logs (trainer.cram's CramResult name)
PROBE = "metrics.probe_average"  # the GLUE probe score (search.study.report.trial_metrics); NaN for a study without the probe
# How far below the unigram floor the loss ended (trainer/unigram.py): what a trial learned beyond
# token frequencies. NaN for runs logged before the floor was.
BELOW_FLOOR = "metrics.nats_below_unigram"
# How far below the corruption floor (trainer/references.py): beyond frequencies and copying. NaN for
# runs logged before the references were; `regime_column` reads the regime from the same metrics.
BELOW_CORRUPTION = "metrics.nats_below_floor"
REFERENCE_COLUMNS = ("metrics.validation_loss", "metrics.corruption_floor", "metrics.context_reference")


@dataclass(frozen=True)
class Score:
    """The number a study ranks by: its objective's ranking metric, as a column of the frame."""

    objective: Objective
    note: str = ""  # why this metric, when it is not the study's own objective

    @property
    def column(self) -> str:
        return f"metrics.{self.objective.rank_metric}"

    @property
    def label(self) -> str:
        return self.objective.label

    @property
    def higher_is_better(self) -> bool:
        return self.objective.higher_is_better

    def best(self, values: pd.Series):
        """Index of the best finite value (None when there is none)."""
        finite = values[np.isfinite(values.astype(float))]
        if finite.empty:
            return None
        return finite.idxmax() if self.higher_is_better else finite.idxmin()

    def sort(self, frame: pd.DataFrame, column: str | None = None) -> pd.DataFrame:
        return frame.sort_values(column or self.column, ascending=not self.higher_is_better,
                                 na_position="last", kind="stable")


# What stands in when the study's metric was never logged.
FALLBACK_OBJECTIVE = OBJECTIVES["mlm"]


def choose_score(objective: str | None, frame: pd.DataFrame) -> Score:
    """The study's score: its objective's ranking metric (`search.base.objectives`). A study with an
    unknown objective is ranked by the probe; one whose complete trials never logged the metric
    by the validation MLM loss; either way the score says so in its note."""
    name = (objective or "").strip()
    chosen = OBJECTIVES.get(name, OBJECTIVES[DEFAULT_OBJECTIVE])
    note = "" if name in OBJECTIVES else f"objective {name or 'unknown'}: ranked by the {chosen.label}"
    score = Score(chosen, note)
    column = counted(frame)[score.column] if score.column in frame else pd.Series(dtype=float)
    if chosen is FALLBACK_OBJECTIVE or np.isfinite(column.astype(float)).any():
        return score
    return Score(FALLBACK_OBJECTIVE, f"no complete trial has a {chosen.label} score, so the "
                                     f"{FALLBACK_OBJECTIVE.label} stands in for it")


# ---- the frame --------------------------------------------------------------------------------

def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy with `state` (`search.base.states`; from the MLflow status for a run without the tag),
    every objective's metric column (NaN where not logged), and `spent_s`: the device seconds a run cost, its
    `seconds` metric, else its wall time. A repeat's `seconds` is its original's copy, so a repeat
    is charged its own (tiny) wall time."""
    frame = frame.copy()
    state = frame[STATE_COLUMN] if STATE_COLUMN in frame else pd.Series(np.nan, index=frame.index, dtype=object)
    frame["state"] = state.fillna(frame["status"].map(state_of_status)).astype(str)
    metrics = {f"metrics.{key}" for objective in OBJECTIVES.values() for key in objective.metrics}
    for column in sorted(metrics | {LOSS, BELOW_FLOOR, BELOW_CORRUPTION, *REFERENCE_COLUMNS, "metrics.seconds",
                                    "metrics.tokens", "metrics.tokens_per_s", "metrics.params"}):
        if column not in frame:
            frame[column] = np.nan
    # A running trial has no end time (NaT): it has cost nothing yet that we can count.
    wall = (pd.to_datetime(frame["end_time"], utc=True) - pd.to_datetime(frame["start_time"], utc=True)).dt.total_seconds()
    seconds = frame["metrics.seconds"].where(frame["state"] != REPEAT)
    frame["spent_s"] = seconds.fillna(wall).fillna(0.0).astype(float)
    return frame


def counted(frame: pd.DataFrame) -> pd.DataFrame:
    """The trials statistics count: complete, not repeats."""
    if "state" not in frame:
        frame = prepare(frame)
    return frame[frame["state"] == COMPLETE]


def scored(frame: pd.DataFrame, score: Score) -> pd.DataFrame:
    """Counted trials with a finite score."""
    rows = counted(frame)
    return rows[np.isfinite(rows[score.column].astype(float))]


# ---- confidence intervals -----------------------------------------------------------------------

def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and Student-t confidence interval of the finite `values` (a frame's column):
    `search.analysis.stats.interval`, so that the report and search.confirm's table give the same interval."""
    return interval([float(v) for v in values if v is not None and math.isfinite(v)], confidence)


def overlap(a, b) -> bool | None:
    """Whether two intervals (anything with `low` and `high`: an `Interval`, a row of a ranking)
    overlap; None when either has none (NaN bounds: n < 2)."""
    if any(math.isnan(bound) for bound in (a.low, a.high, b.low, b.high)):
        return None
    return bool(a.low <= b.high and b.low <= a.high)


# ---- confirmation -------------------------------------------------------------------------------

def confirmation_ranking(confirmations: pd.DataFrame, trials: pd.DataFrame, score: Score) -> pd.DataFrame:
    """One row per confirmed configuration, best mean first: `trial` (the original), `run_id`
    (its trial run), `original` (its search score), `n` complete seeds, `failed` seeds, `mean`,
    `low`, `high` (95% interval over seeds), `below_mean`, `below_low`, `below_high` (the same for
    the nats below the unigram floor), `rank`."""
    runs = prepare(confirmations) if "state" not in confirmations else confirmations
    runs = runs.assign(original_trial=original_trials(runs, trials))
    records = []
    for number, group in runs.dropna(subset=["original_trial"]).groupby("original_trial"):
        trial = trials[trials["trial"] == int(number)]
        complete = group[group["state"] == COMPLETE]
        ci = mean_ci(complete[score.column].astype(float))
        below = mean_ci(complete[BELOW_FLOOR].astype(float))
        records.append({"trial": int(number), "run_id": trial["run_id"].iloc[0] if len(trial) else None,
                        "original": float(trial[score.column].iloc[0]) if len(trial) else math.nan,
                        "n": ci.n, "failed": int((group["state"] == FAILED).sum()),
                        "mean": ci.mean, "low": ci.low, "high": ci.high,
                        "below_mean": below.mean, "below_low": below.low, "below_high": below.high})
    table = pd.DataFrame(records, columns=["trial", "run_id", "original", "n", "failed", "mean", "low", "high",
                                           "below_mean", "below_low", "below_high"])
    table = score.sort(table, "mean").reset_index(drop=True)
    table["rank"] = np.arange(1, len(table) + 1)
    return table


def original_trials(runs: pd.DataFrame, trials: pd.DataFrame) -> pd.Series:
    """The trial each confirmation run re-trained. It is named twice: by run id
    (`cramnas.confirmation_of`, which survives renumbering) and by number (`cramnas.original_trial`,
    the reader's `trial` column)."""
    by_run = dict(zip(trials["run_id"], trials["trial"], strict=True))
    of_run = runs.get(tag.column(tag.CONFIRMATION_OF), pd.Series(np.nan, index=runs.index, dtype=object)).map(by_run)
    return of_run.fillna(pd.to_numeric(runs["trial"], errors="coerce"))


def lead_within_noise(ranking: pd.DataFrame) -> bool | None:
    """Whether the winner's interval overlaps the runner-up's (None: fewer than two configurations
    with an interval to compare)."""
    ranked = ranking[np.isfinite(ranking["mean"].astype(float))]
    if len(ranked) < 2:
        return None
    first, second = ranked.head(2).itertuples()
    return overlap(first, second)


@dataclass(frozen=True)
class RankCorrelation:
    n: int
    spearman: float
    spearman_p: float
    kendall: float
    kendall_p: float


def rank_correlation(ranking: pd.DataFrame) -> RankCorrelation:
    """Spearman's rho and Kendall's tau (with p-values) between the search score and the confirmed
    mean of each configuration: do the two budgets order architectures alike? NaN below 2 pairs."""
    pairs = ranking[np.isfinite(ranking["original"].astype(float)) & np.isfinite(ranking["mean"].astype(float))]
    if len(pairs) < 2:
        return RankCorrelation(len(pairs), math.nan, math.nan, math.nan, math.nan)
    rho = stats.spearmanr(pairs["original"], pairs["mean"])
    tau = stats.kendalltau(pairs["original"], pairs["mean"])
    return RankCorrelation(len(pairs), float(rho.statistic), float(rho.pvalue), float(tau.statistic),
                           float(tau.pvalue))


# ---- search vs hand design ----------------------------------------------------------------------

@dataclass(frozen=True)
class HandDesign:
    """Confirmed candidates against the baselines (`search.confirm --baselines`) under one budget."""

    budget: str | None  # the latest baseline run's: search and hand design are compared there only
    runs: pd.DataFrame  # both kinds' runs under it: `configuration` ("trial 7" or the config name), `kind`, `seed`
    table: pd.DataFrame  # `configuration_table`
    paired: pd.DataFrame  # `paired_differences` of the best confirmed candidate against each baseline


def hand_design(confirmations: pd.DataFrame, baselines: pd.DataFrame, trials: pd.DataFrame, score: Score) -> HandDesign:
    """Every confirmed candidate and every baseline trained under the baselines' budget, side by
    side; then the best candidate (by mean score) against each baseline, seed by seed."""
    budget = None
    if not baselines.empty and "params.budget" in baselines:
        recorded = baselines.dropna(subset=["params.budget"]).sort_values("start_time", kind="stable")
        budget = str(recorded["params.budget"].iloc[-1]) if len(recorded) else None
    frames = []
    if not confirmations.empty:
        runs = prepare(confirmations) if "state" not in confirmations else confirmations
        original = original_trials(runs, trials)
        frames.append(runs.assign(kind="search", configuration=original.map(
            lambda number: f"trial {int(number)}" if pd.notna(number) else None)))
    if not baselines.empty:
        runs = prepare(baselines) if "state" not in baselines else baselines
        frames.append(runs.assign(kind="baseline", configuration=runs["baseline"]))
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["configuration", "kind"])
    if "params.budget" not in runs:
        runs["params.budget"] = None
    runs = runs[(runs["params.budget"] == budget) & runs["configuration"].notna()].copy()
    runs["seed"] = pd.to_numeric(runs.get(tag.column(tag.SEED), pd.Series(np.nan, index=runs.index)), errors="coerce")
    table = configuration_table(runs, score)
    searched = table[(table["kind"] == "search") & np.isfinite(table["score_mean"].astype(float))]
    best = searched["configuration"].iloc[0] if len(searched) else None  # the table is sorted best first
    paired = paired_differences(runs, best, list(table.loc[table["kind"] == "baseline", "configuration"]), score)
    return HandDesign(budget, runs, table, paired)


def configuration_table(runs: pd.DataFrame, score: Score) -> pd.DataFrame:
    """One row per configuration of `hand_design`'s runs, best mean score first: `configuration`,
    `kind`, `n` complete seeds, `failed`, then mean, low and high (95% interval over complete seeds)
    of the `score`, the validation `loss`, the nats `below` the unigram floor and the `probe`
    average, mean `tokens_per_s` and `params`, and `rank`."""
    records = []
    for (configuration, kind), group in runs.groupby(["configuration", "kind"], sort=False):
        complete = group[group["state"] == COMPLETE]
        record = {"configuration": configuration, "kind": kind, "failed": int((group["state"] == FAILED).sum())}
        for name, column in (("score", score.column), ("loss", LOSS), ("below", BELOW_FLOOR), ("probe", PROBE)):
            ci = mean_ci(complete[column].astype(float))
            record |= {f"{name}_mean": ci.mean, f"{name}_low": ci.low, f"{name}_high": ci.high}
        record |= {"n": int(np.isfinite(complete[score.column].astype(float)).sum()),
                   "tokens_per_s": float(complete["metrics.tokens_per_s"].astype(float).mean()),
                   "params": float(complete["metrics.params"].astype(float).mean())}
        records.append(record)
    columns = ["configuration", "kind", "n", "failed"] + [f"{name}_{part}" for name in ("score", "loss", "below", "probe")
                                                          for part in ("mean", "low", "high")]
    table = pd.DataFrame(records, columns=[*columns, "tokens_per_s", "params"])
    table = score.sort(table, "score_mean").reset_index(drop=True)
    table["rank"] = np.arange(1, len(table) + 1)
    return table


def paired_differences(runs: pd.DataFrame, best: str | None, baselines: list[str], score: Score) -> pd.DataFrame:
    """`best` minus each baseline on the score, paired by seed (both complete with a finite score):
    `baseline`, `best`, `n` pairs, `mean`, `low`, `high` (95% interval of the mean difference),
    `best_ahead` (the mean difference favours `best`) and `outside_noise` (the interval excludes 0;
    None below two pairs). Pairing removes what the seeds share (data order, masking), so it can
    tell apart configurations whose own intervals overlap."""
    columns = ["baseline", "best", "n", "mean", "low", "high", "best_ahead", "outside_noise"]
    if best is None:
        return pd.DataFrame(columns=columns)
    valid = runs[(runs["state"] == COMPLETE) & np.isfinite(runs[score.column].astype(float)) & runs["seed"].notna()]

    def by_seed(configuration: str) -> pd.Series:
        rows = valid[valid["configuration"] == configuration]
        return rows.groupby("seed")[score.column].mean().astype(float)  # one run per seed; mean guards duplicates

    ours = by_seed(best)
    records = []
    for baseline in baselines:
        difference = paired(ours.to_dict(), by_seed(baseline).to_dict())
        ahead = None if not difference.n else bool(difference.mean > 0 if score.higher_is_better else difference.mean < 0)
        records.append({"baseline": baseline, "best": best, "n": difference.n, "mean": difference.mean,
                        "low": difference.low, "high": difference.high, "best_ahead": ahead,
                        "outside_noise": difference.outside_noise})
    return pd.DataFrame(records, columns=columns)


def paired_verdict(row, score: Score) -> str:
    """A row of `paired_differences` in words: which side won, by how much and whether beyond the
    noise, e.g. `search better by 1.99 nats, outside noise (the 95% interval excludes 0)`."""
    if not row.n:
        return "no seed trained by both: nothing to compare"
    amount = f"{abs(row.mean):.3g} nats" if score.column == LOSS else f"{abs(row.mean):.3g} in {score.label}"
    lead = "a tie" if row.mean == 0 else f"{'search' if row.best_ahead else 'baseline'} better by {amount}"
    why = {None: "", True: " (the 95% interval excludes 0)", False: " (the 95% interval contains 0)"}[row.outside_noise]
    return f"{lead}, {noise_verdict(row.outside_noise)}{why}"


def regime_column(frame: pd.DataFrame) -> pd.Series:
    """Each run's regime (trainer/regimes.py), None where its references were not logged."""
    def one(row) -> str | None:
        values = {column[len("metrics."):]: row[column] for column in REFERENCE_COLUMNS if pd.notna(row[column])}
        return regime_of(values)

    return frame.apply(one, axis=1) if len(frame) else pd.Series(dtype=object)


def plateau_warning(trials: pd.DataFrame) -> str | None:
    """A sentence when most complete trials never left the plateau: the study then ranks how fast
    architectures leave it, not how well they model language."""
    complete = trials[trials["state"] == COMPLETE]
    regimes = regime_column(complete).dropna()
    plateau = int((regimes == "plateau").sum())
    if not len(regimes) or plateau * 2 <= len(regimes):
        return None
    return (f"{plateau} of {len(regimes)} complete trials ended in the plateau (within {PLATEAU_MARGIN} nats of the "
            "corruption floor: frequencies and copying, no context): this study ranks how fast architectures leave "
            "the plateau, not how well they model language. A longer budget per trial reads them better.")
