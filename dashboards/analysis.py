"""The statistics behind the study report, as plain functions on pandas frames of runs. The frames
and the statistics the search shares (the score, confirmations, hand design, regimes) are in
search/analysis/run_frames.py; the rest is here.

Frames are what `search.tracking.tracker.StudyTracker.trial_table` returns (one row per run: `trial`,
`run_id`, `status`, `start_time`, `end_time`, `params.*`, `metrics.*`, `tags.*`); `prepare` adds
the few derived columns every view needs. Nothing here reads a store or draws anything, so each
function is tested against scipy on hand-built frames. Parameter importance, which needs an Optuna
study, lives in `dashboards.importance`.

Which trials count: only `complete` ones (the `cramnas.state` tag, `search.base.states`) enter best-so-far, the Pareto
fronts, the ablation table and the rankings. Repeats copy an earlier trial's result (the search's
de-duplication), so counting them would weigh that architecture twice; pruned and failed trials
have no final score. Every trial, whatever its fate, counts towards compute spent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import pandas as pd

# The frames and the statistics the search shares (search/analysis/run_frames.py), read here as analysis.X too.
from search.analysis.run_frames import (  # noqa: F401 - re-exported for dashboards.report
    BELOW_CORRUPTION,
    BELOW_FLOOR,
    CONFIDENCE,
    FALLBACK_OBJECTIVE,
    LOSS,
    PROBE,
    REFERENCE_COLUMNS,
    STATE_COLUMN,
    HandDesign,
    Interval,
    RankCorrelation,
    Score,
    choose_score,
    configuration_table,
    confirmation_ranking,
    counted,
    hand_design,
    lead_within_noise,
    mean_ci,
    original_trials,
    overlap,
    paired_differences,
    paired_verdict,
    plateau_warning,
    prepare,
    rank_correlation,
    regime_column,
    scored,
)
from search.base import tags as tag
from search.base.states import COMPLETE, FAILED, PRUNED, REPEAT, STATES
from trainer.budget import Budget, BudgetError

# A parameter with more distinct values than this is a range, not a set of choices to ablate.
MAX_CHOICES = 10


# ---- progress and fronts ----------------------------------------------------------------------

def best_so_far(frame: pd.DataFrame, score: Score) -> pd.DataFrame:
    """One row per trial in trial order: `trial`, `value` (the score if the trial counts, else NaN),
    `best` (best counted value up to that trial) and `hours` (device hours spent up to and
    including it, over every trial)."""
    rows = frame.sort_values("trial")
    value = rows[score.column].astype(float).where(rows["state"] == COMPLETE)
    value = value.where(np.isfinite(value))
    best = value.cummax() if score.higher_is_better else value.cummin()
    return pd.DataFrame({"trial": rows["trial"].to_numpy(), "value": value.to_numpy(),
                         "best": best.ffill().to_numpy(), "hours": rows["spent_s"].cumsum().to_numpy() / 3600})


def pareto_mask(x: Iterable[float], y: Iterable[float], x_higher: bool = True, y_higher: bool = True) -> np.ndarray:
    """True for points no other point dominates (at least as good on both axes, better on one)."""
    xs = np.asarray(list(x), dtype=float) * (1 if x_higher else -1)
    ys = np.asarray(list(y), dtype=float) * (1 if y_higher else -1)
    at_least = (xs[None, :] >= xs[:, None]) & (ys[None, :] >= ys[:, None])
    better = (xs[None, :] > xs[:, None]) | (ys[None, :] > ys[:, None])
    return ~(at_least & better).any(axis=1)


# ---- ablation -----------------------------------------------------------------------------------

def _sort_key(value: str):
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def ablation_params(frame: pd.DataFrame, max_choices: int = MAX_CHOICES) -> list[str]:
    """`params.arch.*` columns that took between 2 and `max_choices` values among counted trials."""
    rows = counted(frame)
    return [column for column in sorted(c for c in frame.columns if c.startswith("params.arch."))
            if 2 <= rows[column].dropna().nunique() <= max_choices]


def ablation(frame: pd.DataFrame, score: Score, max_choices: int = MAX_CHOICES) -> pd.DataFrame:
    """For each choice of each searched architecture parameter: trial count, mean score and mean
    validation loss with 95% intervals, which choice is best (by mean score), and `overlaps_best`:
    whether its score interval overlaps the best choice's (None when either has n < 2). An
    overlap means the data cannot tell the two apart; no overlap is a conservative sign they differ."""
    rows = scored(frame, score)
    records = []
    for column in ablation_params(frame, max_choices):
        choices = sorted(rows[column].dropna().unique(), key=_sort_key)
        group = [(choice, mean_ci(rows.loc[rows[column] == choice, score.column].astype(float)),
                  mean_ci(rows.loc[rows[column] == choice, LOSS].astype(float))) for choice in choices]
        means = pd.Series([ci.mean for _, ci, _ in group], dtype=float)
        best_index = score.best(means)
        best_ci = group[best_index][1] if best_index is not None else None
        for index, (choice, score_ci, loss_ci) in enumerate(group):
            is_best = index == best_index
            records.append({
                "param": column.removeprefix("params.arch."), "choice": choice, "n": score_ci.n,
                "score_mean": score_ci.mean, "score_low": score_ci.low, "score_high": score_ci.high,
                "loss_mean": loss_ci.mean, "loss_low": loss_ci.low, "loss_high": loss_ci.high,
                "best": is_best,
                "overlaps_best": None if is_best or best_ci is None else overlap(score_ci, best_ci),
            })
    columns = ["param", "choice", "n", "score_mean", "score_low", "score_high", "loss_mean", "loss_low",
               "loss_high", "best", "overlaps_best"]
    return pd.DataFrame(records, columns=columns)


# ---- lineage ------------------------------------------------------------------------------------

def _int_tag(frame: pd.DataFrame, name: str) -> pd.Series:
    column = tag.column(name)
    if column not in frame:
        return pd.Series(pd.NA, index=frame.index, dtype="Int64")
    return pd.to_numeric(frame[column], errors="coerce").astype("Int64")


def lineage_edges(frame: pd.DataFrame) -> pd.DataFrame:
    """Parent -> child edges of an evolution study: `parent`, `child` (trial numbers), `mutation`,
    `parent_run_id`, `child_run_id`, in child order."""
    parents = _int_tag(frame, tag.PARENT_TRIAL)
    rows = frame[parents.notna()]
    absent = pd.Series(None, index=rows.index, dtype=object)
    edges = pd.DataFrame({"parent": parents[parents.notna()].astype(int), "child": rows["trial"].astype(int),
                          "mutation": rows.get(tag.column(tag.MUTATION), absent),
                          "parent_run_id": rows.get(tag.column(tag.PARENT_RUN_ID), absent), "child_run_id": rows["run_id"]})
    return edges.sort_values("child", ignore_index=True)


def tree_layout(frame: pd.DataFrame) -> pd.DataFrame:
    """Node positions for a lineage tree: `trial`, `x` = generation, `y` = slot within the
    generation. Generation 0 is in trial order; later generations are ordered by their parent's
    slot, so children sit near their parents and few edges cross."""
    generation = _int_tag(frame, tag.GENERATION)
    parent = _int_tag(frame, tag.PARENT_TRIAL)
    nodes = pd.DataFrame({"trial": frame["trial"].astype(int).to_numpy(),
                          "generation": generation.to_numpy(), "parent": parent.to_numpy()})
    nodes = nodes.sort_values("trial", ignore_index=True)
    known = dict(zip(nodes["trial"], nodes["generation"], strict=True))
    for index, row in nodes.iterrows():  # a missing generation tag: one more than the parent's
        if pd.isna(row["generation"]):
            parent_generation = known.get(row["parent"]) if pd.notna(row["parent"]) else None
            known[row["trial"]] = 0 if parent_generation is None or pd.isna(parent_generation) else parent_generation + 1
            nodes.loc[index, "generation"] = known[row["trial"]]
    slot: dict[int, float] = {}
    for _, members in nodes.groupby("generation", sort=True):
        order = sorted(members.itertuples(), key=lambda r: (slot.get(r.parent, -1.0) if pd.notna(r.parent) else -1.0,
                                                             r.trial))
        offset = (len(order) - 1) / 2  # centre each generation on y = 0
        for position, row in enumerate(order):
            slot[row.trial] = position - offset
    nodes["x"] = nodes["generation"].astype(int)
    nodes["y"] = nodes["trial"].map(slot).astype(float)
    return nodes[["trial", "x", "y"]]


# ---- accounting -------------------------------------------------------------------------------

def compute_accounting(frame: pd.DataFrame) -> pd.DataFrame:
    """Trials, device hours and tokens trained by state, plus a `total` row. A repeat trains
    nothing: its tokens are its original's."""
    records = []
    for state in [*STATES, *sorted(set(frame["state"]) - set(STATES))]:
        rows = frame[frame["state"] == state]
        if rows.empty:
            continue
        tokens = 0.0 if state == REPEAT else float(rows["metrics.tokens"].fillna(0).sum())
        records.append({"state": state, "trials": len(rows), "device_hours": rows["spent_s"].sum() / 3600,
                        "tokens": tokens})
    table = pd.DataFrame(records, columns=["state", "trials", "device_hours", "tokens"])
    total = {"state": "total", "trials": int(table["trials"].sum()),
             "device_hours": float(table["device_hours"].sum()), "tokens": float(table["tokens"].sum())}
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    """Failed and pruned trials with their reasons, in trial order."""
    rows = frame[frame["state"].isin([FAILED, PRUNED])].sort_values("trial")
    reason = rows.get(tag.column(tag.FAILURE_REASON), pd.Series(np.nan, index=rows.index, dtype=object))
    return pd.DataFrame({"trial": rows["trial"], "state": rows["state"], "reason": reason,
                         "run_id": rows["run_id"]}).reset_index(drop=True)


def top_k(frame: pd.DataFrame, score: Score, k: int = 10) -> pd.DataFrame:
    return score.sort(scored(frame, score)).head(k)


# ---- loss against budget (search.confirm --ladder) ------------------------------------------------

def budget_curves(confirmations: pd.DataFrame, baselines: pd.DataFrame, trials: pd.DataFrame,
                  kind: str | None = None) -> pd.DataFrame:
    """Each configuration's validation loss at each budget it was confirmed under (a promotion
    ladder's rungs, `search.analysis.ladder`), over budgets that count `kind` (a `trainer.budget` kind; by
    default that of most runs): seconds and FLOPs share no axis. One row per (configuration,
    budget), lowest budget first: `configuration` ("trial 7", or a baseline's name), `kind` (search
    or baseline), `budget` (as recorded), `amount`, `n` complete seeds with a loss, `mean`, `low`,
    `high` (its 95% interval over seeds)."""
    frames = []
    if not confirmations.empty:
        named = original_trials(confirmations, trials).map(lambda number: f"trial {int(number)}" if pd.notna(number) else None)
        frames.append(confirmations.assign(kind="search", configuration=named))
    if not baselines.empty:
        frames.append(baselines.assign(kind="baseline", configuration=baselines["baseline"]))
    runs = pd.concat([f for f in frames if "params.budget" in f], ignore_index=True) if frames else pd.DataFrame()
    columns = ["configuration", "kind", "budget", "amount", "n", "mean", "low", "high"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    budgets = {text: _budget(text) for text in runs["params.budget"].dropna().unique()}
    if kind is None:
        kinds = Counter(budgets[text].kind for text in runs["params.budget"].dropna() if budgets[text] is not None)
        kind = kinds.most_common(1)[0][0] if kinds else None
    records = []
    for (configuration, run_kind, text), group in runs.groupby(["configuration", "kind", "params.budget"], sort=False):
        budget = budgets[text]
        if budget is None or budget.kind != kind:
            continue
        ci = mean_ci(group.loc[group["state"] == COMPLETE, LOSS].astype(float))
        records.append({"configuration": configuration, "kind": run_kind, "budget": text, "amount": budget.amount,
                        "n": ci.n, "mean": ci.mean, "low": ci.low, "high": ci.high})
    return pd.DataFrame(records, columns=columns).sort_values(["amount", "configuration"], ignore_index=True)


def _budget(text: str) -> Budget | None:
    """A recorded budget, or None for one this version cannot read."""
    try:
        return Budget.parse(text)
    except BudgetError:
        return None
