"""dashboards: the statistics against scipy, the report on synthetic studies, the MLflow UI server.

Studies are written straight to a temporary MLflow store (and the Optuna store beside it) by
`tests/dashboard_study.py`: no training. The store lives on tmpfs where there is one, since
SQLite commits dominate the time to write 200 trials.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pytest
import requests
from mlflow import MlflowClient
from scipy import stats

from dashboards import analysis, report, ui
from dashboards.analysis import Score
from dashboards.data import load_study
from dashboards.importance import param_importance
from dashboards.page import interval, num
from dashboards.screen import screen_of
from search.base.objectives import OBJECTIVES
from search.tracking.stores import study_storage
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from tests.dashboard_study import CHOICES, FIXED, TRAIN, UNIGRAM_FLOOR, scratch_store, write_confirmations, write_study
from tests.helpers import free_port

SECTION_HEADINGS = [title for _, title, _, _ in report.SECTIONS]
PROBE_SCORE, LOSS_SCORE = Score(OBJECTIVES["probe"]), Score(OBJECTIVES["mlm"])


@pytest.fixture(scope="module")
def store():
    with scratch_store("cramnas-dashboards-") as uri:
        yield uri


@pytest.fixture(scope="module")
def big(store):
    """200 evolution trials with 2 failed, 3 pruned and 2 repeats; no Optuna study (writing one would
    double the setup time), so its importances come from the MLflow params. Its tests are `slow`."""
    return write_study(store, "big", 200, failed=(5, 50), pruned=(7, 8, 90), repeats=(30, 60), seed=1,
                       optuna_store=False)


@pytest.fixture(scope="module")
def small(store):
    """12 evolution trials (one failed, one repeat) and confirmations of four of them under another budget."""
    study = write_study(store, "small", 12, failed=(3,), repeats=(9,), seed=2)
    seeds = {0: [0.70, 0.72, 0.71], 1: [0.60, 0.66, 0.62], 2: [0.69, 0.70], 4: [0.55, 0.56, 0.5]}
    write_confirmations(study, seeds, budget="120s", failed=((1, 3),))
    return study


def ttest_interval(values):
    """The 95% interval by another scipy route than `analysis.mean_ci`'s t.interval."""
    interval = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    return interval.low, interval.high


def frame_of(rows: list[dict]) -> pd.DataFrame:
    """A prepared frame of runs as `StudyTracker.trial_table` returns them, from short dicts."""
    start = pd.Timestamp("2026-01-01", tz="UTC")
    records = []
    for number, row in enumerate(rows):
        record = {"trial": number, "run_id": f"run{number}", "run_name": f"t{number}",
                  "status": "FINISHED", "start_time": start, "end_time": start + pd.Timedelta(seconds=60),
                  "tags.cramnas.state": row.get("state", "complete")}
        record.update({f"params.arch.{k}": str(v) for k, v in row.get("arch", {}).items()})
        record.update({f"metrics.{k}": v for k, v in row.get("metrics", {}).items()})
        records.append(record)
    return analysis.prepare(pd.DataFrame(records))


# ---- statistics ---------------------------------------------------------------------------------

def test_mean_ci_agrees_with_scipy():
    values = [0.61, 0.64, 0.59, 0.66, 0.62]
    ci = analysis.mean_ci(values)
    low, high = ttest_interval(values)
    assert ci.n == 5 and ci.mean == pytest.approx(np.mean(values))
    assert (ci.low, ci.high) == (pytest.approx(low), pytest.approx(high))
    one = analysis.mean_ci([0.5, float("nan")])  # NaN is no value
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.low) and not one.has_interval
    same = analysis.mean_ci([0.3, 0.3, 0.3])
    assert (same.low, same.high) == (0.3, 0.3)


def test_the_report_writes_an_interval_as_search_confirm_does():
    values = [4.1, 4.3, 4.2]
    ci = analysis.mean_ci(values)
    assert interval(ci.mean, ci.low, ci.high) == ci.text() == "4.200 ± 0.248"
    assert interval(-0.75, -1.385, -0.115, signed=True) == "-0.750 ± 0.635"
    assert interval(4.1, math.nan, math.nan) == "4.100 (n=1)" and interval(None, None, None) == "–"


def test_ablation_marks_choices_the_data_cannot_tell_apart():
    scores = {"rotary": [0.70, 0.71, 0.72], "alibi": [0.69, 0.70, 0.715], "learned": [0.50, 0.51, 0.52], "none": [0.6]}
    rows = [{"arch": {"position": position, "layers": 2}, "metrics": {"probe_average": s, "validation_loss": 5 - s}}
            for position, values in scores.items() for s in values]
    rows.append({"arch": {"position": "learned", "layers": 2}, "metrics": {"probe_average": 0.99}, "state": "repeat"})
    table = analysis.ablation(frame_of(rows), PROBE_SCORE).set_index("choice")
    assert set(table["param"]) == {"position"}  # layers never varied
    assert table.loc["rotary", "best"] and table["best"].sum() == 1
    assert table.loc["alibi", "overlaps_best"] is True
    assert table.loc["learned", "overlaps_best"] is False
    assert table.loc["none", "overlaps_best"] is None and table.loc["none", "n"] == 1
    assert table.loc["learned", "n"] == 3  # the repeat copies a result: not counted
    low, high = ttest_interval(scores["learned"])
    assert (table.loc["learned", "score_low"], table.loc["learned", "score_high"]) == (
        pytest.approx(low), pytest.approx(high))
    low, high = ttest_interval([5 - s for s in scores["alibi"]])
    assert table.loc["alibi", "loss_low"] == pytest.approx(low) and table.loc["alibi", "loss_high"] == pytest.approx(high)
    # Ranked by loss, lower is better: the same data, the same winner.
    by_loss = analysis.ablation(frame_of(rows), LOSS_SCORE).set_index("choice")
    assert by_loss.loc["rotary", "best"] and by_loss.loc["learned", "overlaps_best"] is False


def test_best_so_far_counts_every_trials_compute_and_only_complete_scores():
    rows = [{"metrics": {"validation_loss": 5.0, "seconds": 60}},
            {"metrics": {"seconds": 30}, "state": "failed"},
            {"metrics": {"validation_loss": 4.0, "seconds": 60}, "state": "repeat"},
            {"metrics": {"validation_loss": 4.5, "seconds": 90}},
            {"metrics": {"validation_loss": 4.8, "seconds": 60}}]
    progress = analysis.best_so_far(frame_of(rows), LOSS_SCORE)
    assert progress["best"].tolist() == [5.0, 5.0, 5.0, 4.5, 4.5]
    # A repeat is charged its own wall time (60 s here), not its original's `seconds`.
    assert progress["hours"].tolist() == pytest.approx(np.cumsum([60, 30, 60, 90, 60]) / 3600)


def test_pareto_mask():
    throughput = [100, 200, 300, 150, 300]
    score = [0.9, 0.8, 0.5, 0.7, 0.4]
    assert analysis.pareto_mask(throughput, score).tolist() == [True, True, True, False, False]
    # Fewer parameters is better: the smallest model and the best score are both on the front.
    assert analysis.pareto_mask([10, 20, 30], [0.5, 0.7, 0.6], x_higher=False).tolist() == [True, True, False]


def test_confirmation_ranking_and_rank_correlation_agree_with_scipy(small):
    data = load_study("small", small.uri)
    ranking = analysis.confirmation_ranking(data.confirmations, data.trials, data.score)
    complete = {0: [0.70, 0.72, 0.71], 1: [0.60, 0.66], 2: [0.69, 0.70], 4: [0.55, 0.56, 0.5]}  # (1, 3) failed
    assert ranking["trial"].tolist() == [0, 2, 1, 4]  # by mean, best first
    assert ranking["rank"].tolist() == [1, 2, 3, 4]
    for row in ranking.itertuples():
        assert row.mean == pytest.approx(np.mean(complete[row.trial]))
        assert (row.low, row.high) == tuple(pytest.approx(v) for v in ttest_interval(complete[row.trial]))
        assert row.original == pytest.approx(small.trials[row.trial].metrics["probe_average"])
        assert row.run_id == small.trials[row.trial].run_id
    assert ranking.set_index("trial").loc[1, "failed"] == 1
    assert analysis.lead_within_noise(ranking) is True  # 0.71 +- 0.025 against 0.695 +- 0.064
    original = [small.trials[t].metrics["probe_average"] for t in ranking["trial"]]
    means = [np.mean(complete[t]) for t in ranking["trial"]]
    corr = analysis.rank_correlation(ranking)
    rho, tau = stats.spearmanr(original, means), stats.kendalltau(original, means)
    assert corr.n == 4
    assert (corr.spearman, corr.spearman_p) == (pytest.approx(rho.statistic), pytest.approx(rho.pvalue))
    assert (corr.kendall, corr.kendall_p) == (pytest.approx(tau.statistic), pytest.approx(tau.pvalue))
    apart = pd.DataFrame({"n": [3, 3], "mean": [0.9, 0.5], "low": [0.85, 0.45], "high": [0.95, 0.55]})
    assert analysis.lead_within_noise(apart) is False


@pytest.mark.slow
def test_importance_finds_the_parameter_that_matters(small, big):
    data = load_study("small", small.uri)
    stored = param_importance("small", study_storage(small.uri), data.trials, data.score)
    assert "Optuna study store" in stored.source
    assert set(stored.values) == set(CHOICES)
    assert next(iter(stored.values)) == "position"  # the synthetic score's largest effect
    assert sum(stored.values.values()) == pytest.approx(1.0)
    # No Optuna study for `big`: rebuilt from the MLflow runs' params, which hold every arch field.
    data = load_study("big", big.uri)
    rebuilt = param_importance("big", study_storage(big.uri), data.trials, data.score)
    assert "no study 'big'" in rebuilt.source and "MLflow" in rebuilt.source
    assert set(rebuilt.values) == set(CHOICES)  # only the fields that varied
    assert next(iter(rebuilt.values)) == "position"


@pytest.mark.slow
def test_lineage_edges_are_what_was_recorded(big):
    data = load_study("big", big.uri)
    edges = analysis.lineage_edges(data.trials)
    recorded = {(t.parent, t.number, t.mutation) for t in big.trials if t.parent is not None}
    assert len(recorded) > 100
    assert set(zip(edges["parent"], edges["child"], edges["mutation"], strict=True)) == recorded
    run_of = {t.number: t.run_id for t in big.trials}
    assert all(edges["parent_run_id"] == edges["parent"].map(run_of))
    layout = analysis.tree_layout(data.trials).set_index("trial")
    assert all(layout.loc[t.number, "x"] == (t.generation or 0) for t in big.trials)  # repeats: no lineage, x=0
    # Within a generation, slots are distinct.
    assert not layout.duplicated(["x", "y"]).any()


# ---- the report ---------------------------------------------------------------------------------

def check_sections(page: str, study: str) -> None:
    assert f"Study {study}" in page
    for heading in SECTION_HEADINGS:
        assert f"<h2>{heading}</h2>" in page
    assert 'src="http' not in page  # self-contained: plotly.js is inline, nothing is fetched


@pytest.mark.slow
def test_report_of_200_trials_is_complete_and_logged(big, tmp_path):
    out = report.write_report("big", tmp_path / "big.html", big.uri, ui_url="http://ui.example:5055")
    page = out.read_text()
    check_sections(page, "big")
    assert page.count('class="plotly-graph-div"') == 4  # progress, Pareto, importance, lineage; nothing confirmed
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # the library itself is in the page
    best = max(big.by_state("complete"), key=lambda t: t.metrics["probe_average"])
    assert f"http://ui.example:5055/#/experiments/{big.experiment_id}/runs/{best.run_id}" in page
    assert "RuntimeError: injected fault in trial 50" in page and "stopped early by ASHA" in page
    assert "No confirmation runs yet" in page
    artifacts = MlflowClient(big.uri).list_artifacts(big.study_run_id)
    assert [a.path for a in artifacts] == ["big.html"]


def test_report_with_one_trial(store, tmp_path):
    write_study(store, "one", 1, controller="tpe", objective="mlm", optuna_store=False, floor=False)
    page = report.write_report("one", tmp_path / "one.html", store, log_artifact=False).read_text()
    check_sections(page, "one")
    assert "unigram floor: <b>n/a</b>" in page  # recorded before the floor was: said, not a failure
    assert "No lineage (controller tpe)" in page
    assert "needs at least 2 complete trials, has 1" in page and "on 1 complete trial." in page
    assert "No architecture parameter took more than one value" in page
    assert "1 trial used" in page  # not "1 trials"


def test_importance_on_too_few_trials_is_greyed_with_its_count(store, small, tmp_path):
    write_study(store, "few", 6, controller="random", failed=(2,))
    data = load_study("few", store)
    result = param_importance("few", study_storage(store), data.trials, data.score)
    assert result.trials == 5 and result.values and not result.reliable
    page = report.write_report("few", tmp_path / "few.html", store, log_artifact=False).read_text()
    section = page.split('id="importance"')[1].split("</section>")[0]
    assert "on 5 complete trials" in section
    assert f"Too few trials to rank parameters: 5 complete trials for {len(result.values)} parameters" in section
    assert '<div class="greyed"' in section and section.count('class="plotly-graph-div"') == 1  # drawn, greyed
    # The 10 complete trials of `small` are enough: no warning, nothing greyed.
    page = report.write_report("small", tmp_path / "small.html", small.uri, log_artifact=False).read_text()
    section = page.split('id="importance"')[1].split("</section>")[0]
    assert "on 10 complete trials" in section and "greyed" not in section and "Too few" not in section


@pytest.mark.parametrize("values, expected", [
    ([19587.4], [19587.4 * 0.95, 19587.4 * 1.05]),  # one point: 5% either side, round ticks
    ([19587.4, 19587.9], [19587.65 * 0.95, 19587.65 * 1.05]),  # a spread of nothing: the same
    ([0.0], [-1.0, 1.0]),
    ([6.8, 7.2], None),  # a real spread: plotly's own range
    ([float("nan")], None),
])
def test_pareto_axes_of_a_single_point_get_a_readable_range(values, expected):
    settings = report.readable_range(pd.Series(values))
    assert settings.get("range") == (pytest.approx(expected) if expected else None)


def test_report_with_failures_only(store, tmp_path):
    write_study(store, "doomed", 3, controller="random", failed=(0, 2), pruned=(1,))
    page = report.write_report("doomed", tmp_path / "doomed.html", store, log_artifact=False).read_text()
    check_sections(page, "doomed")
    assert page.count("No complete trial yet") == 4  # best so far, Pareto, ablation, top trials
    assert "no complete trial has a probe average (GLUE) score" in page  # the probe study says what stands in
    assert "injected fault in trial 2" in page and "3 trials used" in page


def test_report_confirmation_section(small, tmp_path):
    page = report.write_report("small", tmp_path / "small.html", small.uri, log_artifact=False).read_text()
    assert "the lead is within noise" in page
    assert f"unigram floor: <b>{UNIGRAM_FLOOR:.3f} nats</b>" in page
    best = max(small.by_state("complete"), key=lambda t: t.metrics["probe_average"])
    top = page.split('id="top"')[1].split("</section>")[0]
    # A study logged before the references: the loss beside the unigram floor, the regime unknown.
    assert "nats below unigram floor" in top and num(best.metrics["nats_below_unigram"]) in top
    confirmed = page.split('id="confirmation"')[1].split("</section>")[0]
    below = [UNIGRAM_FLOOR - (7.0 - 4.0 * score) for score in (0.70, 0.72, 0.71)]  # trial 0's seeds
    ci = analysis.mean_ci(below)  # checked against scipy above
    # Written as search.confirm's table writes an interval.
    assert "nats below floor ± 95% CI" in confirmed and ci.text() in confirmed
    assert "confirmation budget (120s) differs from the search budget (60s)" in page
    assert 'id="ladder"' not in page and 'href="#ladder"' not in page  # one budget: no loss-against-budget plot
    data = load_study("small", small.uri)
    corr = analysis.rank_correlation(analysis.confirmation_ranking(data.confirmations, data.trials, PROBE_SCORE))
    assert f"Spearman ρ = {num(corr.spearman, 3)}" in page


# A screened study (search.study.screen): its screen's trials at 5e11flops, by validation loss (trial 5
# failed; trial 8 repeats trial 3), and the loss at 2e12flops of the trials promoted from it, in the
# order they were promoted (the screen's best four: screen trial -> loss).
SCREEN_LOSSES = [5.6, 5.2, 5.9, 5.0, 5.4, None, 5.1, 5.7]
PROMOTED = {3: 4.6, 6: 4.4, 1: 4.5, 4: 4.9}
FLOPS_PER_TOKEN = 5e5


def write_stage(uri: str, name: str, budget: str, trials: list[tuple[dict, str, dict, dict]]) -> None:
    """One stage of a screened study as search.run logs it: a study run, then one trial run per
    (architecture, state, metrics, tags)."""
    tracker = StudyTracker(uri, name)
    tracker.start_study({"controller": "gp", "objective": "mlm", "budget": budget, "train": TRAIN})
    for number, (arch, state, metrics, tags) in enumerate(trials):
        run_id = tracker.open_trial_run(number, arch, TRAIN, ArchConfig.from_dict(arch).fingerprint(), tags)
        tracker.finish_run(run_id, state, metrics)
    tracker.finish_study()


def crammed(loss: float | None, flops: float) -> dict:
    """The metrics of a trial that trained `flops` FLOPs and ended at `loss` (None: failed, no loss)."""
    return {"tokens": flops / FLOPS_PER_TOKEN, "flops_per_token": FLOPS_PER_TOKEN, "seconds": 60.0,
            **({"validation_loss": loss} if loss is not None else {})}


def write_screened(uri: str, name: str) -> None:
    """Study `name` and its screen `name`-screen: `SCREEN_LOSSES`, then `PROMOTED`."""
    archs = [ArchConfig(**FIXED, layers=layers, hidden=hidden, position=position).to_dict()
             for layers, hidden, position in itertools.product(CHOICES["layers"], CHOICES["hidden"], CHOICES["position"])]
    screen = [(archs[n], "complete" if loss else "failed", crammed(loss, 5e11 if loss else 1e11), {})
              for n, loss in enumerate(SCREEN_LOSSES)]
    screen.append((archs[3], "repeat", crammed(SCREEN_LOSSES[3], 5e11), {"repeat_of": 3}))
    write_stage(uri, f"{name}-screen", "5e11flops", screen)
    write_stage(uri, name, "2e12flops", [(archs[s], "complete", crammed(loss, 2e12), {"promoted_from": s})
                                          for s, loss in PROMOTED.items()])


def cells(section: str) -> list[list[str]]:
    """The text of each body row's cells of the tables in `section`."""
    rows = re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>", 1)[1])
    return [[re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)] for row in rows]


def test_report_of_a_screened_study_shows_its_screen(store, small, tmp_path):
    write_screened(store, "pilot")
    page = report.write_report("pilot", tmp_path / "pilot.html", store, log_artifact=False).read_text()
    assert page.index('href="#screen"') < page.index('href="#progress"')  # first, before best so far
    section = page.split('<section id="screen">')[1].split("</section>")[0]
    assert "<h2>Screen</h2>" in section
    assert ("Study pilot-screen screened 9 trials, each crammed whole at 5e11flops; 4 of them were promoted "
            "to this study's budget of 2e12flops.") in section
    # 7 complete screen trials and a failed one (1e11), the repeat trained nothing; 4 promoted at 2e12.
    screened, promoted = 7 * 5e11 + 1e11, 4 * 2e12
    assert f"trained {screened + promoted:.3g} FLOPs" in section
    assert f"{(screened + promoted) / (4 * screened):.0%} of the {4 * screened:.3g}" in section
    rho = stats.spearmanr([SCREEN_LOSSES[s] for s in PROMOTED], list(PROMOTED.values())).statistic
    assert f"over 4 promoted trials: Spearman ρ = {num(rho, 3)}" in section and num(rho, 3) == "0.4"
    assert section.count('class="plotly-graph-div"') == 1
    # Best first here; the place in the screen counts its complete trials, the repeat of its best not.
    assert [row[:5] for row in cells(section)] == [["1", "6", "2", "5.1", "4.4"], ["2", "1", "3", "5.2", "4.5"],
                                                   ["0", "3", "1", "5", "4.6"], ["3", "4", "4", "5.4", "4.9"]]
    assert f"python -m dashboards.report --study pilot-screen --tracking-uri {store}" in section
    # Without a screen in the store, promoted trials are not enough; an unscreened study has no section.
    write_stage(store, "orphan", "2e12flops", [(ArchConfig(**FIXED).to_dict(), "complete", crammed(4.5, 2e12),
                                                {"promoted_from": 0})])
    assert screen_of(load_study("orphan", store)) is None
    page = report.write_report("small", tmp_path / "small.html", small.uri, log_artifact=False).read_text()
    assert 'id="screen"' not in page and "<h2>Screen</h2>" not in page


# ---- the UI ---------------------------------------------------------------------------------------

def test_ui_says_what_it_counted_when_there_is_nothing_to_compare(store, small):
    # One complete trial, a pruned, a failed and a repeat one, and three confirmation runs: the
    # MLflow UI shows six finished runs (study run, trials, confirmations), none a second complete trial.
    study = write_study(store, "lonely", 4, controller="random", failed=(0,), pruned=(1,), repeats=(3,))
    write_confirmations(study, {2: [0.7, 0.71, 0.72]}, budget="60s")
    data = load_study("lonely", store)
    line = ui.compare_line(data, ui.urls_of(data, "http://127.0.0.1:5055"))
    assert line.startswith("nothing to compare yet: 1 complete trial with a probe average (GLUE) ")
    assert "trial runs: 1 complete, 1 repeat, 1 pruned, 1 failed" in line
    assert "the experiment's 3 confirmation runs are not trials" in line
    data = load_study("small", small.uri)
    assert ui.compare_line(data, ui.urls_of(data, "http://127.0.0.1:5055")).startswith("top 5 trials compared: http")


def test_ui_urls_point_at_the_study(small):
    urls = ui.study_urls(small.uri, "small", "http://127.0.0.1:5055")
    assert urls.experiment_id == MlflowClient(small.uri).get_experiment_by_name("small").experiment_id
    assert urls.runs == f"http://127.0.0.1:5055/#/experiments/{urls.experiment_id}/runs?workflowType=machine_learning"
    complete = sorted(small.by_state("complete"), key=lambda t: -t.metrics["probe_average"])
    assert list(urls.top_run_ids) == [t.run_id for t in complete[:5]]
    query = unquote(urls.compare.split("#/compare-runs?", 1)[1])
    fields = dict(part.split("=", 1) for part in query.split("&"))
    assert json.loads(fields["runs"]) == list(urls.top_run_ids)
    assert json.loads(fields["experiments"]) == [urls.experiment_id]
    assert fields["workflowType"] == "machine_learning"  # else MLflow 3 opens its GenAI view


@pytest.mark.slow
@pytest.mark.subprocess
def test_ui_server_serves_the_study_and_stops(small):
    port = free_port()
    with ui.serve(small.uri, port) as server:
        assert server.url == f"http://127.0.0.1:{port}"
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
        reply = requests.post(f"{server.url}/api/2.0/mlflow/runs/search",
                              json={"experiment_ids": [small.experiment_id], "max_results": 1000}, timeout=30)
        listed = {run["info"]["run_id"] for run in reply.json()["runs"]}
        assert {t.run_id for t in small.trials} | {small.study_run_id} <= listed
        process = server.process
    assert process.poll() is not None  # stopped with the block
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


# ---- bad input ----------------------------------------------------------------------------------

def test_unknown_study_or_store_is_one_line_and_exit_2(small, capsys, tmp_path):
    for main in (report.main, ui.main):
        assert main(["--study", "nope", "--tracking-uri", small.uri]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "--study: no study 'nope'" in err and "known studies:" in err and "small" in err
    missing = f"sqlite:///{tmp_path}/absent/mlflow.db"
    assert report.main(["--study", "small", "--tracking-uri", missing]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tracking-uri: no MLflow store" in err
    assert not (tmp_path / "absent").exists()  # nothing created on the way
