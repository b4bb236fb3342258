"""`python -m dashboards.screenshots --study NAME`: a study's report and MLflow UI, seen in a browser.

Writes the study's HTML report, serves it and the MLflow UI on 127.0.0.1, renders both in headless
Chromium (the system's: Debian's `chromium` package) and saves PNGs in `--out-dir`:

- `report.png`: the whole report page, once every plotly figure has drawn;
- `mlflow-runs.png`: the study's runs table, best trial first, with the study's score, the last
  training loss, a few other metrics and each trial's state as columns;
- `mlflow-run.png`: the best trial's run page (metrics, params, tags);
- `mlflow-compare.png`: the top trials side by side (when there are two complete ones).

Each page is checked before its picture is taken: the script waits until the page shows what it
must (plots drawn, trial names listed) and fails with one line naming the page and what never
appeared, leaving `<name>.failed.png` of what the browser did show. Tests use the same pieces.

Playwright drives the browser rather than the chromium command line (`--screenshot --dump-dom
--virtual-time-budget`). The command line does render the MLflow UI, but a fixed time budget is a
guess where Playwright waits for the very elements a page must show and names the one that never
came; and a fresh profile needs setting up that the command line cannot do: MLflow's assistant
panel, open on first load, covers a third of the page unless localStorage says otherwise; the runs
table's metric columns come from localStorage; the compare page's "Show diff only" is a click.
Only Playwright's Python package is used (its own browser builds are never downloaded), and every
request to a host other than 127.0.0.1 is blocked and recorded.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

import pandas as pd
from playwright.sync_api import BrowserContext, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from dashboards import ui
from dashboards.analysis import STATE_COLUMN, top_k
from dashboards.data import StudyData, load_study
from dashboards.report import write_report
from dashboards.ui import LOOPBACK
from search.base.objectives import OBJECTIVES
from search.study.next_steps import report_path
from search.tracking.retry import first_line
from space.errors import CramnasError, UsageError
from trainer.console import CliParser, one_line_on_ctrl_c

INSTALL_HINT = "install Debian's package: apt-get update && apt-get install -y chromium"
# Flags for a quiet headless Chromium (docs/stack.md); Playwright adds --headless, --no-sandbox (off by
# default for a root user) and a fresh --user-data-dir itself.
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}
# MLflow pages scroll inside a pane, which a full-page screenshot does not unroll: make them tall.
TALL_VIEWPORT = {"width": 1400, "height": 1250}
COMPARE_VIEWPORT = {"width": 1400, "height": 2100}  # the plot and the differing params, metrics, tags
PAGE_TIMEOUT_S = 60.0
TRIAL_NAME = re.compile(r"^t\d{4} ")  # `t0007 4x256/4h geglu pre-norm rotary` (search.base.tags.trial_run_name)
# Metrics worth a column in the runs table, after the study's own score: every objective's.
TABLE_METRICS = (*dict.fromkeys(f"metrics.{key}" for objective in OBJECTIVES.values() for key in objective.metrics),
                 "metrics.params")
TABLE_COLUMNS = 4
# A trial's last reported training loss: the one number a pruned trial, which has no score, is judged by.
LAST_LOSS = "metrics.train_loss"


class BrowserMissing(RuntimeError):
    """No Chromium to drive; the message says how to install it."""


class PageCheckFailed(RuntimeError):
    """A page never showed what it must; the message names the page and what was missing."""


@dataclass
class Shot:
    """One screenshot and what its page showed when it was taken."""

    name: str
    url: str
    path: Path
    text: str  # the page's visible text (`innerText` of the body)
    found: dict = field(default_factory=dict)  # page-specific findings (plot counts, run names, ...)
    blocked: list[str] = field(default_factory=list)  # requests to other hosts, refused
    errors: list[str] = field(default_factory=list)  # uncaught JavaScript errors


# ---- the browser --------------------------------------------------------------------------------

def chromium_path(explicit: str | None = None) -> str:
    """The Chromium binary: `explicit`, else the first of Debian's and other usual names on PATH."""
    if explicit:
        if (found := shutil.which(explicit)) is None:
            raise UsageError(f"--chromium {explicit}: not an executable; pass Chromium's path, or {INSTALL_HINT}")
        return found
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    raise BrowserMissing(f"no Chromium on PATH (looked for chromium, chromium-browser, google-chrome); {INSTALL_HINT}")


# MLflow 3 opens a chat panel on first load in a fresh profile, which would cover the right third
# of every picture; these are the UI's own localStorage switches for "already shown, closed".
MLFLOW_PANEL_CLOSED = {"mlflow.assistant.panelOpen_v1": "false",
                       "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true"}


class Browser:
    """A headless Chromium session whose pages may only reach 127.0.0.1."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.blocked: list[str] = []
        context.route("**/*", self._guard)

    def _guard(self, route) -> None:
        host = urlsplit(route.request.url).hostname
        if host in (LOOPBACK, "localhost") or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            # Nothing outside this machine may be asked for (and a self-contained report needs nothing).
            self.blocked.append(route.request.url)
            route.abort()

    def set_local_storage(self, items: dict[str, str]) -> None:
        """Set localStorage entries before any page script runs, on every page opened afterwards."""
        self.context.add_init_script(
            "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in items.items()))

    @contextlib.contextmanager
    def page(self, name: str, url: str, path: Path, viewport: dict | None = None) -> Iterator[tuple[Page, Shot]]:
        """Open `url`; the block waits for the page and fills `shot.found`; on leaving it the
        screenshot is taken. A check that fails leaves `<name>.failed.png` and raises PageCheckFailed."""
        page = self.context.new_page()
        page.set_viewport_size(viewport or VIEWPORT)
        page.set_default_timeout(PAGE_TIMEOUT_S * 1000)
        shot = Shot(name, url, path, "")
        page.on("pageerror", lambda error: shot.errors.append(str(error)))
        blocked_before = len(self.blocked)
        try:
            page.goto(url)
            yield page, shot
            # A clicked control shows a focus ring and may have scrolled its pane: undo both.
            page.evaluate("""() => {
                document.activeElement && document.activeElement.blur();
                document.querySelectorAll('*').forEach(e => { if (e.scrollTop) e.scrollTop = 0; });
            }""")
            shot.text = page.inner_text("body")
            page.screenshot(path=str(path), full_page=True)
        except PlaywrightTimeout as error:
            failed = path.with_suffix(".failed.png")
            with contextlib.suppress(PlaywrightError):
                page.screenshot(path=str(failed), full_page=True)
            # Playwright's first line says which call timed out, its call log what it waited for.
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            waited = " ".join(dict.fromkeys([lines[0], *[line for line in lines if "waiting for" in line][:1]]))
            raise PageCheckFailed(f"{name} ({url}): {waited}; what the browser showed: {failed}") from None
        finally:
            shot.blocked = self.blocked[blocked_before:]
            page.close()


@contextlib.contextmanager
def open_browser(executable: str | None = None) -> Iterator[Browser]:
    path = chromium_path(executable)
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        except PlaywrightError as error:  # not a Chromium (`--chromium /bin/true`), or a broken one
            raise BrowserMissing(f"{path} did not start as a headless Chromium ({first_line(error)}); pass "
                                 f"Chromium's path with --chromium, or {INSTALL_HINT}") from None
        try:
            yield Browser(browser.new_context(viewport=VIEWPORT))
        finally:
            browser.close()


# ---- serving a file -----------------------------------------------------------------------------

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass  # one line per request would drown the script's own output


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """Serve `directory` over HTTP on 127.0.0.1 (a free port) from a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# ---- the pages ----------------------------------------------------------------------------------

def shoot_report(browser: Browser, url: str, path: Path, study: str) -> Shot:
    """The report, full page, once the study's name shows and every plotly figure has drawn."""
    with browser.page("report", url, path) as (page, shot):
        page.get_by_text(study).first.wait_for()
        page.locator(".js-plotly-plot").first.wait_for()
        # A figure has drawn when plotly has put its SVG layers into it.
        page.wait_for_function("""() => {
            const plots = document.querySelectorAll('.js-plotly-plot');
            return plots.length > 0 && [...plots].every(p => p.querySelector('.main-svg'));
        }""")
        shot.found = {
            "title": page.title(),
            "headings": [h.strip() for h in page.locator("h1, h2, h3").all_inner_texts()],
            "plots": page.locator(".js-plotly-plot").count(),
            "drawn_plots": page.locator(".js-plotly-plot .main-svg").evaluate_all(
                "svgs => new Set(svgs.map(s => s.closest('.js-plotly-plot'))).size"),
        }
    return shot


def _mlflow_column(column: str) -> str:
    """`metrics.probe_average` -> MLflow's column key "metrics.`probe_average`"."""
    kind, _, name = column.partition(".")
    return f"{kind}.`{name}`"


def table_metrics(data: StudyData) -> list[str]:
    """Metric columns worth showing for the study's trials: its score first, the last training loss
    (a pruned trial's only measure), then a few others that the trials logged."""
    frame = data.trials
    metrics = [c for c in dict.fromkeys((data.score.column, LAST_LOSS, *TABLE_METRICS))
               if c in frame and frame[c].notna().any()]
    return metrics[:TABLE_COLUMNS]


def table_columns(data: StudyData) -> list[str]:
    """The runs table's extra columns: `table_metrics` and the trial state tag."""
    return [_mlflow_column(c) for c in table_metrics(data)] + [_mlflow_column(STATE_COLUMN)]


def shoot_runs_table(browser: Browser, url: str, path: Path, data: StudyData) -> Shot:
    """The study's runs table sorted by its score, best first, once trial names are listed.

    Sorted by a metric, MLflow lists trials flat rather than under the collapsed study run, and in a
    study of hundreds the first page of 100 holds the best ones. `found["run_names"]` is in table order.
    """
    # The runs table's saved view: the columns to show (MLflow merges it with its defaults).
    key = f'MLflowLocalStorage-1.1-ExperimentPage-["{data.experiment_id}"]-ReactComponentState'
    browser.set_local_storage({key: json.dumps({"selectedColumns": table_columns(data)})})
    order = urlencode({"orderByKey": _mlflow_column(data.score.column),
                       "orderByAsc": "false" if data.score.higher_is_better else "true"}, quote_via=quote)
    with browser.page("runs table", f"{url}&{order}", path) as (page, shot):
        trial_links = page.get_by_role("link", name=TRIAL_NAME)
        trial_links.first.wait_for()
        # ag-grid places rows by their `row-index`, not by their order in the DOM.
        rows = trial_links.evaluate_all(
            "links => links.map(a => [Number(a.closest('[row-index]').getAttribute('row-index')), a.innerText])")
        shot.found = {"run_names": [name for _, name in sorted(rows)]}
    return shot


def shoot_run_page(browser: Browser, url: str, path: Path, run_name: str, metrics: list[str]) -> Shot:
    """A trial's run page, once its name and its metrics table show."""
    with browser.page("run page", url, path, TALL_VIEWPORT) as (page, shot):
        page.get_by_text(run_name).first.wait_for()
        for metric in metrics:
            page.get_by_text(metric, exact=True).first.wait_for()
        shot.found = {"run_name": run_name, "metrics": metrics}
    return shot


def shoot_compare(browser: Browser, url: str, path: Path, run_names: list[str]) -> Shot:
    """MLflow's compare view of the top trials, once each is named and its plot has drawn."""
    with browser.page("compare view", url, path, COMPARE_VIEWPORT) as (page, shot):
        for name in run_names:
            page.get_by_text(name).first.wait_for()
        page.locator(".js-plotly-plot .main-svg").first.wait_for()
        # Top trials share most settings: the "Show diff only" switches (params, metrics, tags) keep
        # the rows where they differ, which is what a reader compares.
        switches = page.get_by_role("switch")
        for index in range(switches.count()):
            switches.nth(index).click()
        shot.found = {"run_names": run_names, "diff_only": switches.count()}
    return shot


# ---- the study ----------------------------------------------------------------------------------

def capture(study: str, out_dir: Path, tracking_uri: str | None = None, chromium: str | None = None,
            log=print) -> list[Shot]:
    """Write the report and take the screenshots of `study`; return them, each page checked."""
    data = load_study(study, tracking_uri)  # UsageError for a missing store or study, before anything starts
    executable = chromium_path(chromium)
    out_dir.mkdir(parents=True, exist_ok=True)
    port = ui.free_port()  # chosen now, so that the report's run links point at the UI started below
    # Not logged to the study run: taking pictures of a study must not change it.
    report = write_report(data, out_dir / report_path(study), ui_url=f"http://{LOOPBACK}:{port}", log_artifact=False)
    log(f"wrote {report}")
    shots = []
    with open_browser(executable) as browser:
        with serve_directory(report.parent) as base:
            shots.append(shoot_report(browser, f"{base}/{report.name}", out_dir / "report.png", study))
        log("starting the MLflow UI (10-20 s) ...")
        with ui.serve(data.uri, port=port) as server:
            urls = ui.urls_of(data, server.url)
            browser.set_local_storage(MLFLOW_PANEL_CLOSED)
            shots.append(shoot_runs_table(browser, urls.runs, out_dir / "mlflow-runs.png", data))
            best = _best_trial(data)
            if best is not None:
                url = ui.run_url(server.url, data.experiment_id, best["run_id"])
                # The run's own metrics among the table's (a failed trial logged few).
                metrics = [c.removeprefix("metrics.") for c in table_metrics(data) if pd.notna(best[c])]
                shots.append(shoot_run_page(browser, url, out_dir / "mlflow-run.png", best["run_name"], metrics))
            if urls.compare is not None:
                names = list(data.trials.set_index("run_id").loc[list(urls.top_run_ids), "run_name"])
                shots.append(shoot_compare(browser, urls.compare, out_dir / "mlflow-compare.png", names))
    return shots


def _best_trial(data: StudyData) -> pd.Series | None:
    """The row of the study's best trial by its score; its first trial when none has a score."""
    if data.trials.empty:
        return None
    best = top_k(data.trials, data.score, 1)
    return best.iloc[0] if not best.empty else data.trials.iloc[0]


# ---- CLI ----------------------------------------------------------------------------------------

def build_parser() -> CliParser:
    """The command line of `python -m dashboards.screenshots` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m dashboards.screenshots", description=__doc__)
    parser.add_argument("--study", required=True, help="the study's name (its MLflow experiment)")
    parser.add_argument("--out-dir", default="screenshots",
                        help="where the PNGs and report-<study>.html go (default screenshots/)")
    parser.add_argument("--tracking-uri", help="default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    parser.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        shots = capture(args.study, Path(args.out_dir), args.tracking_uri, args.chromium)
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (BrowserMissing, PageCheckFailed, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for shot in shots:
        print(f"{shot.path}  {shot.name}: {shot.url}")
        for line in shot.errors:
            print(f"  page error: {line}")
        if shot.blocked:
            print(f"  blocked {len(shot.blocked)} request(s) to other hosts, first: {shot.blocked[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
