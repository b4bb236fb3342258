"""optuna-dashboard, as README.md runs it, on a cramnas study store, rendered in headless Chromium:
the study's optimisation history and its parameter importances are on its page. The study is
synthetic (`tests/dashboard_study.py`, no training); Chromium is Debian's, as in tests/test_browser.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests

from dashboards import screenshots
from search.tracking.stores import study_storage
from tests.dashboard_study import scratch_store, write_study
from tests.helpers import free_port
from tests.studies import wait_for

KNOBS = {"position", "norm_placement"}  # architecture knobs the synthetic study varies


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.subprocess
def test_the_optuna_dashboard_shows_a_cramnas_studys_history_and_importances(tmp_path):
    with scratch_store("cramnas-optuna-dashboard-") as uri:
        study = write_study(uri, "optuna-dashboard-study", 12, controller="random", objective="mlm", seed=2)
        url = f"http://127.0.0.1:{free_port()}"
        command = [str(Path(sys.executable).parent / "optuna-dashboard"), study_storage(uri),
                   "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1]]
        with open(tmp_path / "server.log", "w") as log:
            server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: answers(f"{url}/api/studies"), 60, "optuna-dashboard to answer")
            with screenshots.open_browser() as browser:
                with browser.page("optuna-dashboard", f"{url}/dashboard/studies/1", tmp_path / "optuna.png") as (page, shot):
                    page.get_by_text("Hyperparameter Importance").wait_for()
                    # The importance chart comes last (the server computes it): wait for its bars' labels.
                    for knob in KNOBS:
                        page.locator("svg text").filter(has_text=knob).first.wait_for()
        finally:
            server.terminate()
            server.wait(timeout=30)
    assert shot.blocked == [] and shot.errors == []
    assert study.name in shot.text and "History" in shot.text
    assert KNOBS <= set(shot.text.split())
