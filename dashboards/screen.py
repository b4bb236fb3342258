"""The report's section on a screened study (search.study.screen): the study NAME holds only the few
trials promoted from its screen NAME-screen, so its report says where they came from, what the two
stages spent against cramming every screen trial whole, and whether the screen's order held at the
whole budget. Both studies are read from the MLflow store; the Optuna store is not needed.

Both columns of scores are the study's own score (`StudyData.score`): the two stages rank by one objective.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards import analysis
from dashboards.data import StudyData, load_study
from dashboards.page import COLOURS, architecture, esc, figure_html, num, plural, readable_range, table
from search.analysis.stats import correlation
from search.base import attrs
from search.base import tags as tag
from search.base.states import COMPLETE, REPEAT
from search.study.next_steps import StudyFlags
from search.study.screen import screen_name
from space.errors import UsageError
from trainer.budget import Budget, BudgetError

PROMOTED_FROM = tag.column(tag.PROMOTED_FROM)
MIN_PAIRS = 3  # fewer promoted trials rank nothing worth a correlation


def screen_of(study: StudyData) -> StudyData | None:
    """The screen `study`'s trials were promoted from, read from the same store; None when none of
    its trials was promoted or the store holds no experiment NAME-screen."""
    if PROMOTED_FROM not in study.trials or study.trials[PROMOTED_FROM].isna().all():
        return None
    try:
        return load_study(screen_name(study.name), study.uri)
    except UsageError:  # no such experiment: the screen was deleted, or never logged to this store
        return None


def promotions(study: StudyData, screen: StudyData) -> pd.DataFrame:
    """One row per promoted trial, best first by its score here (a trial that did not complete last):
    `trial`, `run_id`, `screen_trial`, `place` (1: the screen's best complete trial), `screen_score`,
    `score` and `architecture`."""
    score = study.score
    ranked = score.sort(analysis.scored(screen.trials, score))
    places = pd.Series(np.arange(1, len(ranked) + 1), index=ranked["trial"].to_numpy())
    screen_scores = ranked.set_index("trial")[score.column]
    rows = study.trials[study.trials[PROMOTED_FROM].notna()]
    screen_trial = rows[PROMOTED_FROM].astype(int)
    frame = pd.DataFrame({"trial": rows["trial"], "run_id": rows["run_id"], "screen_trial": screen_trial,
                          "place": screen_trial.map(places), "screen_score": screen_trial.map(screen_scores),
                          "score": rows[score.column].where(rows["state"] == COMPLETE),
                          "architecture": [architecture(r) for _, r in rows.iterrows()]})
    return score.sort(frame, "score")


def trained_flops(trials: pd.DataFrame) -> float:
    """The FLOPs the trials trained: tokens x FLOPs per token of their MLflow metrics, as
    `search.study.screen.flops` counts them from Optuna (a repeat trained nothing; a run that did
    not record FLOPs per token counts none)."""
    trained = trials[trials["state"] != REPEAT]
    return float((trained["metrics.tokens"] * trained.get("metrics.flops_per_token", np.nan)).fillna(0.0).sum())


def budget_ratio(study: StudyData, screen: StudyData) -> float | None:
    """How many screen trials' budgets one trial of the study gets (4 for a screen at a quarter); None
    when either budget is unrecorded or unreadable, or the two count different things."""
    try:
        whole, part = (Budget.parse(data.setting(attrs.BUDGET) or "") for data in (study, screen))
    except BudgetError:
        return None
    return whole.amount / part.amount if whole.kind == part.kind else None


def spent(study: StudyData, screen: StudyData, promoted: int) -> str:
    """How many trials each stage crammed at which budget, and the FLOPs both trained against those
    of the screen's trials each crammed whole at this study's budget: the saving screening is for."""
    said = (f"Study {esc(screen.name)} screened {plural(len(screen.trials), 'trial')}, each crammed whole at "
            f"{esc(screen.setting(attrs.BUDGET))}; {promoted} of them were promoted to this study's budget of "
            f"{esc(study.setting(attrs.BUDGET))}.")
    screened, here = trained_flops(screen.trials), trained_flops(study.trials)
    if not screened:  # runs of before the FLOPs per token were recorded
        return f"<p>{said}</p>"
    ratio = budget_ratio(study, screen)
    whole = (f", {(screened + here) / (screened * ratio):.0%} of the {screened * ratio:.3g} the screen's trials would "
             f"have trained each crammed whole at {esc(study.setting(attrs.BUDGET))}") if ratio else ""
    return (f"<p>{said} The two stages trained {screened + here:.3g} FLOPs (the screen {screened:.3g}, this "
            f"study {here:.3g}){whole}.</p>")


def agreement(study: StudyData, screen: StudyData, rows: pd.DataFrame) -> str:
    """Whether the screen's budget orders the promoted architectures as the whole budget does: the
    Spearman rank correlation of their two scores, and the scatter of them."""
    label = study.score.label
    pairs = rows[np.isfinite(rows["screen_score"].astype(float)) & np.isfinite(rows["score"].astype(float))]
    if len(pairs) < MIN_PAIRS:
        return (f"<p>Spearman rank correlation between the screen's {esc(label)} and this study's: not computed, "
                f"{plural(len(pairs), 'promoted trial')} with both (it needs {MIN_PAIRS}).</p>")
    rho = correlation(pairs["screen_score"], pairs["score"], "spearman", resamples=0)[0]
    fig = go.Figure(go.Scatter(
        x=pairs["screen_score"], y=pairs["score"], mode="markers+text", text=[f"t{t}" for t in pairs["trial"]],
        textposition="top center", marker={"size": 10, "color": COLOURS["front"]}, hoverinfo="text+x+y",
        hovertext=[f"trial {r.trial} (screen trial {r.screen_trial}): {r.architecture}" for r in pairs.itertuples()]))
    fig.update_xaxes(title_text=f"{label} in the screen, at {screen.setting(attrs.BUDGET)}",
                     **readable_range(pairs["screen_score"]))
    fig.update_yaxes(title_text=f"{label} here, at {study.setting(attrs.BUDGET)}", **readable_range(pairs["score"]))
    return (f"<p>Rank agreement between the screen's {esc(label)} and this study's over "
            f"{plural(len(pairs), 'promoted trial')}: Spearman ρ = {num(rho, 3)}.</p>{figure_html(fig, height=380)}")


def promoted_table(rows: pd.DataFrame, label: str, run_link: Callable[[object, object], str]) -> str:
    body = [[run_link(r.run_id, r.trial), str(r.screen_trial), num(r.place), num(r.screen_score), num(r.score),
             esc(r.architecture)] for r in rows.itertuples()]
    return table(["trial", "screen trial", "place in the screen", f"screen {label}", f"{label} here", "architecture"],
                 body, numeric=(0, 1, 2, 3, 4))


def screen_section(study: StudyData, screen: StudyData, run_link: Callable[[object, object], str], flags: StudyFlags) -> str:
    """The report's Screen section: what was spent, the agreement of the two budgets, the promoted
    trials (`run_link`: a trial's link into the MLflow UI) and the command of the screen's own report
    (`flags`: the study's, so that it reads the same stores)."""
    rows = promotions(study, screen)
    command = dataclasses.replace(flags, study=screen.name).report()
    return (spent(study, screen, len(rows)) + agreement(study, screen, rows)
            + promoted_table(rows, study.score.label, run_link)
            + f"<p>The screen itself, every trial it crammed: <code>{esc(command)}</code></p>")
