"""The study report and the MLflow UI rendered in headless Chromium, checked and photographed.

One synthetic study (`tests/dashboard_study.py`, no training), one `dashboards.screenshots.capture`
for the module: it writes the report, serves it and the MLflow UI on 127.0.0.1 and takes the
pictures; the tests assert what each page showed. Chromium is Debian's `chromium` package, which
`.ci/run` installs: without it these tests fail (they do not skip), saying how to install it.
"""

from __future__ import annotations

import pytest
from PIL import Image

from dashboards import report, screenshots
from dashboards.data import load_study
from search.study.next_steps import report_path
from tests.dashboard_study import scratch_store, write_study

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STUDY = "browser-study"
PAGES = {"report": "report.png", "runs table": "mlflow-runs.png", "run page": "mlflow-run.png",
         "compare view": "mlflow-compare.png"}
VIEWPORTS = {"report": screenshots.VIEWPORT, "runs table": screenshots.VIEWPORT,
             "run page": screenshots.TALL_VIEWPORT, "compare view": screenshots.COMPARE_VIEWPORT}


@pytest.fixture(scope="module")
def chromium() -> str:
    try:
        return screenshots.chromium_path()
    except screenshots.BrowserMissing as error:
        missing = str(error)
    pytest.fail(f"{missing} (CI's .ci/run installs it)", pytrace=False)


@pytest.fixture(scope="module")
def study():
    # 14 evolution trials: the last ones have parents (a lineage to draw); one failed, one pruned, one repeat.
    with scratch_store("cramnas-browser-") as uri:
        yield write_study(uri, STUDY, 14, failed=(3,), pruned=(5,), repeats=(7,), seed=3)


@pytest.fixture(scope="module")
def shots(chromium, study, tmp_path_factory) -> dict[str, screenshots.Shot]:
    out = tmp_path_factory.mktemp("screenshots")
    taken = screenshots.capture(STUDY, out, study.uri, chromium, log=lambda line: None)
    return {shot.name: shot for shot in taken}


@pytest.fixture(scope="module")
def data(study):
    return load_study(STUDY, study.uri)


def test_every_page_was_photographed_without_leaving_loopback(shots):
    assert set(shots) == set(PAGES)
    for name, shot in shots.items():
        assert shot.path.name == PAGES[name]
        assert shot.blocked == [], f"{name} asked for other hosts: {shot.blocked}"


def test_report_shows_the_study_and_every_plot_drawn(shots):
    shot = shots["report"]
    html = (shot.path.parent / report_path(STUDY)).read_text()
    assert shot.errors == []
    assert STUDY in shot.found["title"]
    assert f"Study {STUDY}" in shot.found["headings"]
    assert [title for _, title, _, _ in report.SECTIONS] == [h for h in shot.found["headings"] if not h.startswith("Study")]
    # plotly marks a figure's div `js-plotly-plot` when it draws it: every figure in the file drew.
    figures = html.count('class="plotly-graph-div"')
    assert figures >= 4  # best so far, Pareto, importance, lineage at least
    assert shot.found["plots"] == shot.found["drawn_plots"] == figures


def test_runs_table_lists_every_trial_with_its_status_and_score(shots, data):
    shot = shots["runs table"]
    # Every trial, best first, then the complete ones down to the worst; unscored ones last.
    names = shot.found["run_names"]
    assert sorted(names) == sorted(data.trials["run_name"])
    score_of = data.trials.dropna(subset=["metrics.probe_average"]).set_index("run_name")["metrics.probe_average"]
    scores = [score_of[name] for name in names[:len(score_of)]]  # KeyError: an unscored trial too early
    assert scores == sorted(scores, reverse=True)  # a repeat ties with its original: compare scores
    for header in ("probe_average", "cramnas.state"):
        assert header in shot.text
    for status in ("complete", "failed", "pruned", "repeat"):
        assert status in shot.text


def test_run_page_shows_the_best_trials_metrics_and_params(shots, data):
    shot = shots["run page"]
    best = data.trials.loc[data.trials["metrics.probe_average"].where(data.trials["state"] == "complete").idxmax()]
    assert shot.found["run_name"] == best["run_name"]
    assert best["run_name"] in shot.text
    # MLflow prints a metric's full value: the page holds this run's score, not another's.
    assert repr(float(best["metrics.probe_average"])) in shot.text
    for param in ("arch.position", "arch.layers", "train.lr"):
        assert param in shot.text
    assert best["params.arch.position"] in shot.text


def test_compare_view_shows_the_top_trials(shots, data):
    shot = shots["compare view"]
    ranked = data.trials[data.trials["state"] == "complete"].sort_values("metrics.probe_average", ascending=False)
    top = ranked[:5]
    assert shot.found["run_names"] == list(top["run_name"])
    for name in shot.found["run_names"]:
        assert name in shot.text
    # "Show diff only" is on: params the top trials differ in are shown, those the whole study
    # never varied (which the parallel-coordinates plot does not pick either) are hidden.
    assert shot.found["diff_only"] >= 1
    params = [c for c in top if c.startswith("params.arch.")]
    shared = [c.removeprefix("params.") for c in params if data.trials[c].nunique() == 1]
    differing = [c.removeprefix("params.") for c in params if top[c].nunique() > 1]
    assert shared and differing
    assert all(name not in shot.text for name in shared)
    assert all(name in shot.text for name in differing)


@pytest.mark.parametrize("name", list(PAGES))
def test_screenshot_is_a_page_not_a_blank(shots, name):
    image = Image.open(shots[name].path).convert("RGB")
    width, height = image.size
    viewport = VIEWPORTS[name]
    assert width == viewport["width"] and height >= viewport["height"]
    colours = sorted(image.getcolors(width * height), reverse=True)
    # Text, charts and icons give thousands of colours; a blank page one, a spinner a handful.
    assert len(colours) > 500
    assert colours[0][0] / (width * height) < 0.95


def test_a_page_that_never_draws_fails_with_a_picture_of_itself(chromium, tmp_path, monkeypatch):
    """The wait is real: a report without its plots fails, naming the page, and leaves what it saw.
    Its script asks 127.0.0.2 (loopback, but not the page's host): the guard refuses and records it."""
    monkeypatch.setattr(screenshots, "PAGE_TIMEOUT_S", 2.0)
    (tmp_path / "report.html").write_text(f"<html><body><h1>Study {STUDY}</h1>"
                                          '<script src="http://127.0.0.2:9/plotly.js"></script></body></html>')
    with screenshots.open_browser(chromium) as browser, screenshots.serve_directory(tmp_path) as base:
        with pytest.raises(screenshots.PageCheckFailed) as failure:
            screenshots.shoot_report(browser, f"{base}/report.html", tmp_path / "report.png", STUDY)
        assert browser.blocked == ["http://127.0.0.2:9/plotly.js"]
    message = str(failure.value)
    assert message.startswith(f"report ({base}/report.html): ") and "js-plotly-plot" in message
    assert message.endswith(str(tmp_path / "report.failed.png")) and len(message.splitlines()) == 1
    assert (tmp_path / "report.failed.png").stat().st_size > 1000
    assert not (tmp_path / "report.png").exists()


def test_cli_without_chromium_says_how_to_install_it(study, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    code = screenshots.main(["--study", STUDY, "--tracking-uri", study.uri, "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and "apt-get install -y chromium" in err


def test_cli_unknown_study_is_one_line_and_exit_2(study, tmp_path, capsys):
    code = screenshots.main(["--study", "nope", "--tracking-uri", study.uri, "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: --study: no study 'nope'") and STUDY in err and len(err.splitlines()) == 1


def test_cli_wrong_chromium_path_is_one_line_and_exit_2(study, tmp_path, capsys):
    code = screenshots.main(["--study", STUDY, "--tracking-uri", study.uri, "--out-dir", str(tmp_path),
                             "--chromium", str(tmp_path / "no-such-browser")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: --chromium ") and len(err.splitlines()) == 1
