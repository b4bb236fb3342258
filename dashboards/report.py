"""`python -m dashboards.report --study NAME`: one self-contained HTML report of a study.

The file carries plotly.js inline, so it opens offline and can be mailed around; it is also logged
as an artifact of the study's MLflow run. Sections: the screen of a screened study
(`dashboards.screen`), best so far (by trial and by device-hours), Pareto fronts, parameter
importance, the ablation table, the lineage tree (evolution), failures, compute accounting, the top
trials with links into the MLflow UI, the confirmation runs (`search.confirm`), their loss against
the budget when they ran under two budgets or more (a promotion ladder, `search.confirm --ladder`)
and search against hand design (`search.confirm --baselines`). The statistics are
`dashboards.analysis`; this module only lays them out.
"""

from __future__ import annotations

import sys
import time
from functools import cached_property
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import plotly.graph_objects as go
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from dashboards import analysis
from dashboards.analysis import BELOW_CORRUPTION, BELOW_FLOOR, LOSS, Score
from dashboards.data import StudyData, load_study
from dashboards.importance import MIN_TRIALS, param_importance
from dashboards.page import (
    COLOURS,
    CSS,
    architecture,
    esc,
    figure_html,
    human,
    interval,
    link,
    num,
    plural,
    readable_range,
    table,
)
from dashboards.screen import screen_of, screen_section
from dashboards.ui import DEFAULT_PORT, LOOPBACK, run_url, runs_url
from search.base import attrs
from search.base import tags as tag
from search.base.states import COMPLETE, FAILED, PRUNED, STATES
from search.export import budgets_by_preference
from search.study.next_steps import StudyFlags, baselines, report_path
from search.study.warm_start import COVER, search_verdict
from search.tracking.retry import first_line
from search.tracking.stores import study_storage
from space.errors import CramnasError
from trainer.budget import Budget, BudgetError
from trainer.console import CliParser, one_line_on_ctrl_c

TOP_K = 10
# How each kind of budget (trainer.budget) reads on an axis.
BUDGET_UNITS = {"seconds": "seconds", "tokens": "tokens", "flops": "FLOPs", "refs": "reference-core seconds"}


def first_draw_mark(row) -> str:
    """` (warm start sized-cpu)` or ` (cover)` for a run of the study's first draw, from its tags."""
    warm, first = row.get(tag.column(tag.WARM_START)), row.get(tag.column(tag.FIRST_DRAW))
    if isinstance(warm, str):
        return f" (warm start {warm})"
    return f" ({first})" if isinstance(first, str) else ""


def axis_title(score: Score) -> str:
    return f"{score.label} ({'higher' if score.higher_is_better else 'lower'} is better)"


# ---- sections -----------------------------------------------------------------------------------

class Report:
    def __init__(self, data: StudyData, ui_url: str, top: int = TOP_K, storage: str | None = None) -> None:
        self.data, self.ui_url, self.top = data, ui_url.rstrip("/"), top
        self.score = data.score
        self.trials = data.trials
        self.storage = storage
        # The commands the report suggests, with the study's store and data flags (search.study.next_steps).
        self.flags = StudyFlags.of_run(data.name, data.uri, data.study_run, storage)

    def run_link(self, run_id, text) -> str:
        return link(run_url(self.ui_url, self.data.experiment_id, run_id), text) if isinstance(run_id, str) else esc(text)

    @cached_property
    def screen_data(self) -> StudyData | None:
        """The screen this study's trials were promoted from (search.study.screen); None for a study without one."""
        return screen_of(self.data)

    def screen(self) -> str:
        return screen_section(self.data, self.screen_data, self.run_link, self.flags)

    def no_complete(self) -> str:
        return '<p class="muted">No complete trial yet: nothing to show here.</p>'

    def progress(self) -> str:
        rows = analysis.best_so_far(self.trials, self.score)
        if rows["best"].isna().all():
            return self.no_complete()
        fig = make_subplots(rows=1, cols=2, subplot_titles=("by trial number", "by device-hours spent"),
                            horizontal_spacing=0.08)
        for col, x in ((1, "trial"), (2, "hours")):
            seen = rows.dropna(subset=["value"])
            fig.add_trace(go.Scatter(x=seen[x], y=seen["value"], mode="markers", name="complete trial",
                                     marker={"color": COLOURS["point"], "size": 6}, showlegend=col == 1,
                                     text=[f"trial {t}" for t in seen["trial"]]), row=1, col=col)
            fig.add_trace(go.Scatter(x=rows[x], y=rows["best"], mode="lines", line_shape="hv", name="best so far",
                                     line={"color": COLOURS["best"], "width": 2.5}, showlegend=col == 1),
                          row=1, col=col)
        fig.update_xaxes(title_text="trial", row=1, col=1)
        fig.update_xaxes(title_text="device-hours (all trials, cumulative)", row=1, col=2)
        fig.update_yaxes(title_text=axis_title(self.score), row=1, col=1)
        return figure_html(fig)

    def pareto(self) -> str:
        rows = analysis.scored(self.trials, self.score)
        if rows.empty:
            return self.no_complete()
        fig = make_subplots(rows=1, cols=2, subplot_titles=("against throughput", "against model size"),
                            horizontal_spacing=0.08)
        panels = ((1, "metrics.tokens_per_s", True, "tokens/s (higher is better)", 1.0),
                  (2, "metrics.params", False, "parameters, millions (fewer is better)", 1e-6))
        for col, column, higher, title, scale in panels:
            points = rows.dropna(subset=[column])
            if points.empty:
                continue
            front = points[analysis.pareto_mask(points[column], points[self.score.column], higher,
                                                self.score.higher_is_better)].sort_values(column)
            for subset, name, colour, mode in ((points, "complete trial", COLOURS["point"], "markers"),
                                               (front, "Pareto front", COLOURS["front"], "lines+markers")):
                fig.add_trace(go.Scatter(
                    x=subset[column] * scale, y=subset[self.score.column], mode=mode, name=name,
                    marker={"color": colour, "size": 7 if mode == "markers" else 9}, line={"color": colour},
                    showlegend=col == 1, hovertext=[f"trial {r['trial']}: {architecture(r)}" for _, r in subset.iterrows()],
                    hoverinfo="text+x+y"), row=1, col=col)
            fig.update_xaxes(title_text=title, row=1, col=col, **readable_range(points[column] * scale))
            fig.update_yaxes(row=1, col=col, **readable_range(points[self.score.column]))
        fig.update_yaxes(title_text=axis_title(self.score), row=1, col=1)
        return figure_html(fig)

    def importance(self) -> str:
        result = param_importance(self.data.name, self.storage, self.trials, self.score)
        source = f"<p>Computed from {esc(result.source)}, on {plural(result.trials, 'complete trial')}.</p>"
        if not result.values:
            return source + f'<p class="muted">No importances: {esc(result.note)}.</p>'
        names, values = list(result.values)[::-1], list(result.values.values())[::-1]
        fig = go.Figure(go.Bar(x=values, y=names, orientation="h", marker_color=COLOURS["front"],
                               text=[f"{v:.3f}" for v in values], textposition="outside"))
        fig.update_xaxes(title_text="fANOVA importance (share of explained variance)", range=[0, max(values) * 1.15])
        chart = figure_html(fig, height=max(260, 60 + 26 * len(names)))
        if result.reliable:
            return source + chart
        warning = (f'<p class="note">Too few trials to rank parameters: {plural(result.trials, "complete trial")} '
                   f"for {plural(len(names), 'parameter')}, fewer than the {MIN_TRIALS} these shares need to be more "
                   "than noise. Shown greyed; run more trials before reading it.</p>")
        return source + warning + f'<div class="greyed" title="too few trials">{chart}</div>'

    def ablation(self) -> str:
        table_ = analysis.ablation(self.trials, self.score)
        if table_.empty:
            return self.no_complete() if analysis.scored(self.trials, self.score).empty else \
                '<p class="muted">No architecture parameter took more than one value among the complete trials.</p>'
        with_loss = self.score.column != LOSS  # a loss-ranked study shows its score once
        headers = ["choice", "trials", f"{self.score.label}: mean ± 95% CI"]
        headers += ["validation MLM loss: mean ± 95% CI"] if with_loss else []
        headers += ["against the best choice"]
        rows: list = []
        for param, group in table_.groupby("param", sort=False):
            rows.append(f'<tr class="group"><td colspan="{len(headers)}">{esc(param)}</td></tr>')
            for r in group.itertuples():
                if r.best:
                    verdict = '<span class="best">best</span>'
                elif r.overlaps_best is None:
                    verdict = '<span class="muted">n=1 on one side: no interval to compare</span>'
                elif r.overlaps_best:
                    verdict = '<span class="muted">not distinguishable (intervals overlap)</span>'
                else:
                    verdict = '<span class="apart">distinguishable: worse (intervals apart)</span>'
                cells = [esc(r.choice), str(r.n), interval(r.score_mean, r.score_low, r.score_high)]
                cells += [interval(r.loss_mean, r.loss_low, r.loss_high)] if with_loss else []
                rows.append([*cells, verdict])
        return table(headers, rows, numeric=(1, 2, 3) if with_loss else (1, 2))

    def lineage(self) -> str:
        edges = analysis.lineage_edges(self.trials)
        if edges.empty:
            if self.data.controller == "evolution":
                return '<p class="muted">No lineage yet: regularized evolution samples its first population ' \
                       'at random and breeds from parents after that.</p>'
            return f'<p class="muted">No lineage (controller {esc(self.data.controller)}): only regularized ' \
                   f'evolution breeds trials from parents.</p>'
        nodes = analysis.tree_layout(self.trials).merge(
            self.trials[["trial", "state", self.score.column]].rename(columns={self.score.column: "score"}), on="trial")
        where = nodes.set_index("trial")[["x", "y"]]
        known = edges[edges["parent"].isin(where.index)]
        fig = go.Figure()
        ex, ey = [], []
        for e in known.itertuples():
            ex += [where.at[e.parent, "x"], where.at[e.child, "x"], None]
            ey += [where.at[e.parent, "y"], where.at[e.child, "y"], None]
        fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": COLOURS["edge"], "width": 1},
                                 hoverinfo="skip", showlegend=False))
        mid_x = [(where.at[e.parent, "x"] + where.at[e.child, "x"]) / 2 for e in known.itertuples()]
        mid_y = [(where.at[e.parent, "y"] + where.at[e.child, "y"]) / 2 for e in known.itertuples()]
        labels = [f"{e.parent} → {e.child}: {e.mutation}" for e in known.itertuples()]
        few = len(known) <= 40  # beyond that, labels would cover the tree: hover instead
        fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="text" if few else "markers",
                                 text=[str(e.mutation) for e in known.itertuples()] if few else None,
                                 textfont={"size": 10, "color": "#57606a"}, marker={"size": 5, "color": COLOURS["edge"]},
                                 hovertext=labels, hoverinfo="text", showlegend=False))
        scored = nodes["state"].eq(COMPLETE) & np.isfinite(nodes["score"].astype(float))
        for subset, name, marker in (
                (nodes[scored], COMPLETE, {"size": 11, "color": nodes.loc[scored, "score"],
                                             "colorscale": "Viridis", "reversescale": not self.score.higher_is_better,
                                             "colorbar": {"title": {"text": self.score.label}, "thickness": 14},
                                             "line": {"width": 1, "color": "#fff"}}),
                (nodes[~scored], "failed, pruned or repeat", {"size": 9, "color": COLOURS["point"], "symbol": "x"})):
            fig.add_trace(go.Scatter(x=subset["x"], y=subset["y"], mode="markers", name=name, marker=marker,
                                     hovertext=[f"trial {r.trial} ({r.state}): {num(r.score)}"
                                                for r in subset.itertuples()], hoverinfo="text"))
        last = int(nodes["x"].max())
        fig.update_xaxes(title_text="generation", range=[-0.5, last + 0.5], dtick=1 if last <= 30 else None)
        fig.update_yaxes(visible=False)
        widest = int(nodes.groupby("x").size().max())
        return figure_html(fig, height=min(1400, max(420, 24 * widest + 120)))

    def failures(self) -> str:
        rows = analysis.failures(self.trials)
        if rows.empty:
            return '<p class="muted">No failed or pruned trials.</p>'
        body = [[self.run_link(r.run_id, r.trial), esc(r.state), esc(r.reason)] for r in rows.itertuples()]
        return table(["trial", "status", "reason"], body, classes={2: "reason"})

    def compute(self) -> str:
        accounts = analysis.compute_accounting(self.trials)
        total = accounts.iloc[-1]
        lost = accounts[accounts["state"].isin([FAILED, PRUNED])]["device_hours"].sum()
        share = (f" ({100 * lost / total['device_hours']:.2g}% of it on failed or pruned trials)"
                 if total["device_hours"] else "")
        sentence = (f"<p>{plural(int(total['trials']), 'trial')} used {num(total['device_hours'], 3)} device-hours{share} and "
                    f"trained {human(total['tokens'])} tokens.</p>")
        body = [[esc(r.state), str(r.trials), num(r.device_hours, 3), human(r.tokens)] for r in accounts.itertuples()]
        return sentence + self.first_draw_sentence() + table(["status", "trials", "device-hours", "tokens trained"], body,
                                                             numeric=(1, 2, 3))

    def first_draw_sentence(self) -> str:
        """What the study trained before its controller took over, and what that cost."""
        marks = self.trials.apply(first_draw_mark, axis=1) if not self.trials.empty else pd.Series(dtype=str)
        first = self.trials[marks != ""]
        if first.empty:
            return ""
        warm = [m[len(" (warm start "):-1] for m in marks[marks.str.startswith(" (warm start")]]
        covering = int((marks == f" ({COVER})").sum())
        parts = ([f"{plural(len(warm), 'warm start')} ({', '.join(warm)})"] if warm else []) + \
                ([f"a covering design of {plural(covering, 'trial')} (every value of every choice)"] if covering else [])
        return (f"<p>First draw, before the controller took over: {esc(' and '.join(parts))}; "
                f"{num(first['spent_s'].sum() / 3600, 3)} device-hours, counted above.</p>")

    def top_table(self) -> str:
        rows = analysis.top_k(self.trials, self.score, self.top)
        if rows.empty:
            return self.no_complete()
        # The loss gets its own column unless it is the score already; beside it, how far below the
        # corruption floor it is (the unigram floor for a study logged before the references) and its regime.
        floor, floor_label = ((BELOW_CORRUPTION, "nats below corruption floor") if rows[BELOW_CORRUPTION].notna().any()
                              else (BELOW_FLOOR, "nats below unigram floor"))
        columns = [self.score.column] + ([LOSS] if self.score.column != LOSS else []) + [floor]
        labels = [self.score.label] + (["val. MLM loss"] if self.score.column != LOSS else []) + [floor_label]
        regimes = analysis.regime_column(rows)
        body = []
        for rank, (index, r) in enumerate(rows.iterrows(), start=1):
            body.append([str(rank), self.run_link(r["run_id"], r["trial"]), *(num(r[c]) for c in columns),
                         esc(regimes[index] or "n/a"), num(r["metrics.tokens_per_s"]), human(r["metrics.params"]),
                         esc(architecture(r) + first_draw_mark(r)),
                         self.run_link(r["run_id"], r.get("run_name", r["run_id"]))])
        headers = ["rank", "trial", *labels, "regime", "tokens/s", "params", "architecture", "MLflow run"]
        ranked = self.score.sort(analysis.scored(self.trials, self.score))
        verdict = search_verdict([(int(r["trial"]), float(r[self.score.column]), first_draw_mark(r))
                                  for _, r in ranked.iterrows()], self.score.label)
        numeric = tuple(range(len(columns) + 2)) + tuple(range(len(columns) + 3, len(columns) + 5))
        return (f"<p>{esc(verdict[0].upper() + verdict[1:])}.</p>" if verdict else "") + table(headers, body, numeric=numeric)

    def confirmation(self) -> str:
        runs = self.data.confirmations
        if runs.empty:
            return (f'<p class="muted">No confirmation runs yet. Re-train the top trials with new seeds: '
                    f'<code>{esc(self.flags.confirm())}</code></p>')
        shown = ""
        if "params.budget" in runs and runs["params.budget"].nunique() > 1:
            # One budget at a time: a mean over rungs of a ladder would mix losses of different compute.
            # The one export picks from: the highest where a seed completed; the ladder plot shows the others.
            for budget in budgets_by_preference(runs):
                ranking = analysis.confirmation_ranking(runs[runs["params.budget"] == budget], self.trials, self.score)
                if np.isfinite(ranking["mean"].astype(float)).any():
                    break
            runs = runs[runs["params.budget"] == budget]
            shown = (f"<p>Under {esc(budget)}, the highest budget of the confirmations where a seed completed (the "
                     "one <code>search.export</code> picks from); the loss against budget below shows the others.</p>")
        ranking = analysis.confirmation_ranking(runs, self.trials, self.score)
        body = [[str(r.rank), self.run_link(r.run_id, r.trial), num(r.original), interval(r.mean, r.low, r.high),
                 interval(r.below_mean, r.below_low, r.below_high), str(r.n), str(r.failed)]
                for r in ranking.itertuples()]
        parts = [shown, table(["rank", "trial", f"search {self.score.label}", "confirmed mean ± 95% CI",
                        "nats below floor ± 95% CI", "seeds", "failed seeds"], body, numeric=(0, 1, 2, 3, 4, 5, 6))]
        noise = analysis.lead_within_noise(ranking)
        if noise is None:
            parts.append("<p>Fewer than two configurations have an interval (two or more complete seeds each): "
                         "the winner's lead cannot be judged yet.</p>")
        else:
            first, second = ranking.iloc[0], ranking.iloc[1]
            verdict = ("is within noise: its interval overlaps the runner-up's, so more seeds (or a longer budget) "
                       "are needed to call it" if noise else
                       "holds: its interval does not overlap the runner-up's")
            parts.append(f"<p><b>Trial {first['trial']}</b> leads trial {second['trial']} by "
                         f"{num(abs(first['mean'] - second['mean']), 3)}; the lead {verdict}.</p>")
        budgets = set(runs.get("params.budget", pd.Series(dtype=object)).dropna())
        search_budget = self.data.setting(attrs.BUDGET)
        if budgets and budgets != {search_budget}:
            corr = analysis.rank_correlation(ranking)
            parts.append(
                f"<p>The confirmation budget ({esc(', '.join(sorted(budgets)))}) differs from the search budget "
                f"({esc(search_budget)}). Rank agreement between the search score and the confirmed mean over "
                f"{corr.n} configurations: Spearman ρ = {num(corr.spearman, 3)} (p = {num(corr.spearman_p, 3)}), "
                f"Kendall τ = {num(corr.kendall, 3)} (p = {num(corr.kendall_p, 3)}).</p>")
        else:
            parts.append(f"<p>The confirmations ran under the search budget ({esc(search_budget)}): no cross-budget "
                         f"rank correlation to give.</p>")
        finite = ranking[np.isfinite(ranking["mean"].astype(float))]
        if not finite.empty:
            fig = go.Figure(go.Scatter(
                x=finite["original"], y=finite["mean"], mode="markers+text", text=[f"t{t}" for t in finite["trial"]],
                textposition="top center", marker={"size": 10, "color": COLOURS["front"]},
                error_y={"type": "data", "array": (finite["high"] - finite["mean"]).fillna(0),
                         "arrayminus": (finite["mean"] - finite["low"]).fillna(0)}))
            fig.update_xaxes(title_text=f"search {self.score.label}", **readable_range(finite["original"]))
            fig.update_yaxes(title_text="confirmed mean, 95% CI")
            parts.append(figure_html(fig, height=380))
        return "".join(parts)

    @cached_property
    def budget_curves(self) -> pd.DataFrame:
        """`analysis.budget_curves` over budgets of the kind of the study's own."""
        try:
            kind = Budget.parse(self.data.setting(attrs.BUDGET) or "").kind
        except BudgetError:  # not recorded, or unreadable: the kind of most runs
            kind = None
        return analysis.budget_curves(self.data.confirmations, self.data.baselines, self.trials, kind)

    def has_ladder(self) -> bool:
        """Whether confirmations ran under two budgets or more: a loss-against-budget plot to draw."""
        curves = self.budget_curves
        return curves.loc[curves["kind"] == "search", "budget"].nunique() >= 2

    def ladder(self) -> str:
        curves = self.budget_curves
        budgets = list(dict.fromkeys(curves.loc[curves["kind"] == "search", "budget"]))  # lowest first
        return (f"<p>Confirmations under {plural(len(budgets), 'budget')} ({esc(', '.join(budgets))}): a line per "
                "configuration over the budgets it ran under (on a ladder, up to the rung that did not promote it); "
                f"baselines dashed.</p>{self.ladder_pick(budgets)}{figure_html(self.ladder_figure(curves), height=460)}")

    def ladder_pick(self, budgets: list[str]) -> str:
        """The best confirmed configuration, as search.export picks it: at the highest budget where
        one completed a seed."""
        for top in reversed(budgets):
            runs = self.data.confirmations[self.data.confirmations["params.budget"] == top]
            ranking = analysis.confirmation_ranking(runs, self.trials, self.score)
            ranking = ranking[np.isfinite(ranking["mean"].astype(float))]
            if not ranking.empty:
                best = ranking.iloc[0]
                return (f"<p>At {esc(top)}, the highest budget where a configuration completed a seed, the best by "
                        f"{esc(self.score.label)}: <b>trial {best['trial']}</b>, "
                        f"{interval(best['mean'], best['low'], best['high'])} over {plural(int(best['n']), 'seed')}; "
                        f"<code>{esc(self.flags.export())}</code> exports it.</p>")
        return ""

    def ladder_figure(self, curves: pd.DataFrame) -> go.Figure:
        fig = go.Figure()
        groups = curves.groupby(["configuration", "kind"], sort=False)
        for (configuration, kind), rows in sorted(groups, key=lambda group: group[0][1] == "baseline"):  # search first
            fig.add_trace(go.Scatter(
                x=rows["amount"], y=rows["mean"], mode="lines+markers", name=configuration,
                line={"dash": "dash" if kind == "baseline" else "solid"},  # the references, told apart
                error_y={"type": "data", "array": (rows["high"] - rows["mean"]).fillna(0),
                         "arrayminus": (rows["mean"] - rows["low"]).fillna(0)},
                hovertext=[f"{configuration} under {r.budget}: {interval(r.mean, r.low, r.high)}, {plural(r.n, 'seed')}"
                           for r in rows.itertuples()], hoverinfo="text"))
        for label, key in REFERENCES[:2]:  # the corruption floor and the two-neighbour count model
            if value := self.data.setting(key):
                fig.add_hline(y=float(value), line_dash="dot", line_color=COLOURS["point"],
                              annotation_text=f"{label} {float(value):.3f}", annotation_position="top left")
        kind = Budget.parse(curves["budget"].iloc[0]).kind  # budget_curves keeps budgets that parse, of one kind
        fig.update_xaxes(type="log", title_text=f"budget per run, {BUDGET_UNITS[kind]} (log scale)")
        fig.update_yaxes(title_text="validation MLM loss (mean, 95% CI over seeds)")
        return fig

    def hand_design(self) -> str:
        if self.data.baselines.empty:
            return (f'<p class="muted">No baseline runs yet. Train hand-designed configurations with the seeds and '
                    f'budget of the confirmations: <code>{esc(self.flags.confirm("--baselines", baselines("cpu")))}'
                    f'</code> (on a GPU: {esc(baselines("gpu"))}; any trainer/configs/ name).</p>')
        result = analysis.hand_design(self.data.confirmations, self.data.baselines, self.trials, self.score)
        first = {c: result.runs[result.runs["configuration"] == c].iloc[0] for c in result.table["configuration"]}
        # Columns: the score unless it is the loss or the probe average, which have their own.
        extra = self.score.column not in (LOSS, analysis.PROBE)
        body = []
        for r in result.table.itertuples():
            name = esc(r.configuration) if r.kind == "baseline" else f"<b>{esc(r.configuration)}</b>"
            cells = [str(r.rank), name, esc(architecture(first[r.configuration]))]
            cells += [interval(r.score_mean, r.score_low, r.score_high)] if extra else []
            body.append([*cells, interval(r.loss_mean, r.loss_low, r.loss_high),
                         interval(r.below_mean, r.below_low, r.below_high), interval(r.probe_mean, r.probe_low, r.probe_high),
                         num(r.tokens_per_s), human(r.params), str(r.n), str(r.failed)])
        headers = ["rank", "configuration", "architecture"] + ([f"{self.score.label} ± 95% CI"] if extra else [])
        headers += ["validation MLM loss ± 95% CI", "nats below floor ± 95% CI", "probe average ± 95% CI", "tokens/s",
                    "params", "seeds", "failed seeds"]
        parts = [f"<p>Every run under {esc(result.budget)}, with the same seeds; search configurations in bold, "
                 f"ranked by {esc(self.score.label)}.</p>",
                 # The intervals may wrap: ten columns of them and numbers would not fit the card.
                 table(headers, body, numeric=(0, *range(len(headers) - 4, len(headers))),
                       classes=dict.fromkeys(range(3, len(headers) - 4), "ci"))]
        if result.paired.empty:
            parts.append(f"<p>No confirmed configuration under {esc(result.budget)} to set against the baselines: "
                         f"run <code>{esc(self.flags.confirm('--budget', result.budget))}</code> with the --seeds "
                         "the baselines had.</p>")
            return "".join(parts)
        rows = []
        for r in result.paired.itertuples():
            style = "apart" if r.outside_noise else "muted"
            verdict = f'<span class="{style}">{esc(analysis.paired_verdict(r, self.score))}</span>'
            rows.append([esc(r.best), esc(r.baseline), str(r.n), interval(r.mean, r.low, r.high, signed=True), verdict])
        parts.append(f"<p>The best confirmed configuration against each baseline: its {esc(self.score.label)} minus "
                     f"the baseline's, seed by seed, with a 95% interval of the mean difference.</p>")
        parts.append(table(["search", "baseline", "paired seeds", "difference ± 95% CI", "verdict"], rows,
                           numeric=(2, 3)))
        return "".join(parts)


SECTIONS = (  # id, heading, one sentence of what it shows, method
    ("progress", "Best so far", ("The best score among complete trials, against the trial number and against the "
     "device-hours spent on all trials (failed and pruned ones included)."), "progress"),
    ("pareto", "Pareto fronts", ("Score against throughput and against model size; the highlighted trials are "
     "not beaten on both axes by any other."), "pareto"),
    ("importance", "Parameter importance", ("How much of the score's variance each searched parameter explains "
     "(Optuna's fANOVA, on complete trials that are not repeats)."), "importance"),
    ("ablation", "Ablation", ("Every choice of every searched architecture parameter: mean score over the complete "
     "trials that made it, with a 95% Student-t interval. Overlapping intervals mean the data cannot tell a choice "
     "from the best one (a conservative test)."), "ablation"),
    ("lineage", "Lineage", ("Which trial each evolved trial was mutated from, by generation; nodes are coloured by "
     "score, edges carry the mutation."), "lineage"),
    ("failures", "Failures and pruned trials", "Trials that did not finish, with the recorded reason.", "failures"),
    ("compute", "Compute", "Trials by status, the device-hours they took and the tokens they trained.", "compute"),
    ("top", "Top trials", "The best complete trials, linked to their MLflow runs.", "top_table"),
    ("confirmation", "Confirmation", ("The top configurations re-trained with new seeds (search.confirm), ranked by "
     "their mean score."), "confirmation"),
    ("hand-design", "Search vs hand design", ("The confirmed configurations and the hand-designed baselines "
     "(search.confirm --baselines) under the same budget and seeds, and the best of the search against each "
     "baseline, paired by seed."), "hand_design"),
)


# Shown first, only for a screened study (`Report.screen_data`).
SCREEN = ("screen", "Screen", ("The screen this study's trials were promoted from (search.study.screen): what its two "
          "stages trained, whether the screen's budget orders the promoted architectures as this study's does, and "
          "each promoted trial's place in the screen (1: its best complete trial)."), "screen")

# Shown after the confirmation, only when `Report.has_ladder`.
LADDER = ("ladder", "Loss against budget", ("Each confirmed configuration's validation loss at every budget it "
          "ran under (search.confirm --ladder: the best of each rung go up to the next), with its 95% interval over "
          "seeds, against the corruption floor and the two-neighbour count model."), "ladder")


def sections(report: Report) -> tuple[tuple[str, str, str, str], ...]:
    """`SECTIONS`, with `SCREEN` first for a screened study and `LADDER` after the confirmation when
    there is a ladder to draw."""
    shown = SECTIONS if report.screen_data is None else (SCREEN, *SECTIONS)
    if not report.has_ladder():
        return shown
    after = [key for key, _, _, _ in shown].index("confirmation") + 1
    return (*shown[:after], LADDER, *shown[after:])


# The references of a study's header (trainer/references.py): label, study setting.
REFERENCES = (("corruption floor", "corruption_floor"), ("two-neighbour count model", "context_reference"),
              ("unigram floor", "unigram_floor"))


def render(data: StudyData, ui_url: str = f"http://{LOOPBACK}:{DEFAULT_PORT}", top: int = TOP_K,
           storage: str | None = None) -> str:
    """The report as one HTML document (plotly.js inline)."""
    report = Report(data, ui_url, top, storage)
    shown = sections(report)
    counts = data.trials["state"].value_counts()
    facts = {"controller": data.controller, "objective": data.setting(attrs.OBJECTIVE) or "unknown",
             "budget per trial": data.setting(attrs.BUDGET) or "unknown",
             # The references every loss is read against (trainer/references.py); older studies lack them.
             **{label: f"{float(value):.3f} nats" if (value := data.setting(key)) else "n/a" for label, key in REFERENCES},
             "trials": ", ".join(f"{counts[s]} {s}" for s in STATES if s in counts) or "none",
             "ranked by": axis_title(data.score)}
    head = (f"<header><h1>Study {esc(data.name)}</h1>"
            f'<div class="facts">{"".join(f"<span>{esc(k)}: <b>{esc(v)}</b></span>" for k, v in facts.items())}</div>'
            f'<p class="muted">MLflow {esc(data.uri)}, experiment {esc(data.experiment_id)}: '
            f'{link(runs_url(report.ui_url, data.experiment_id), "runs table")} · generated '
            f'{time.strftime("%Y-%m-%d %H:%M %Z")}</p>'
            + (f'<p class="note">{esc(data.score.note)}</p>' if data.score.note else "")
            + (f'<p class="note">{esc(warning)}</p>' if (warning := analysis.plateau_warning(data.trials)) else "")
            + "<nav>" + "".join(f'<a href="#{key}">{esc(title)}</a>' for key, title, _, _ in shown) + "</nav></header>")
    bodies = [f'<section id="{key}"><h2>{esc(title)}</h2><p class="lead">{esc(lead)}</p>'
              f"{getattr(report, method)()}</section>" for key, title, lead, method in shown]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>cramnas study {esc(data.name)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style>'
            f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
            f"<body><main>{head}{''.join(bodies)}</main></body></html>")


def write_report(study: str | StudyData, out: str | Path | None = None, uri: str | None = None,
                 ui_url: str = f"http://{LOOPBACK}:{DEFAULT_PORT}", top: int = TOP_K, log_artifact: bool = True,
                 storage: str | None = None) -> Path:
    """Render the report of `study` (a name, read from the store at `uri`, or a study already read)
    to `out` (default: `report-<study>.html`) and (by default) log it to the study's MLflow run."""
    data = study if isinstance(study, StudyData) else load_study(study, uri)
    out = Path(out or report_path(data.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data, ui_url, top, storage or study_storage(data.uri)), encoding="utf-8")
    if log_artifact and data.study_run is not None:
        try:
            MlflowClient(tracking_uri=data.uri).log_artifact(data.study_run.info.run_id, str(out))
        except (MlflowException, OSError) as error:
            raise ArtifactError(f"wrote {out}, but could not log it to the study run "
                                f"{data.study_run.info.run_id}: {first_line(error)}; pass --no-log to skip") from None
    return out


class ArtifactError(RuntimeError):
    pass


def build_parser() -> CliParser:
    """The command line of `python -m dashboards.report` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m dashboards.report", description=__doc__)
    parser.add_argument("--study", required=True, help="the study to report (its MLflow experiment)")
    parser.add_argument("--out", help="default: report-<study>.html, so each study keeps its own")
    parser.add_argument("--tracking-uri", help="default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    parser.add_argument("--storage", help="the Optuna study store (default: optuna.db beside a SQLite MLflow store)")
    parser.add_argument("--ui-url", default=f"http://{LOOPBACK}:{DEFAULT_PORT}",
                        help="where the MLflow UI is served, for run links (default: %(default)s)")
    parser.add_argument("--top", type=int, default=TOP_K, help="rows of the top-trials table (default: %(default)s)")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to the study's MLflow run")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.top < 1:
        print(f"error: --top: expected a positive number of rows, got {args.top}", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per in-memory importance study
    started = time.perf_counter()
    try:
        out = write_report(args.study, args.out, args.tracking_uri, args.ui_url, args.top, not args.no_log, args.storage)
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ArtifactError, OSError) as error:
        print(f"error: {first_line(error)}", file=sys.stderr)
        return 1
    logged = "" if args.no_log else ", logged to the study's MLflow run"
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s{logged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
