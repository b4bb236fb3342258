"""What comes after a study: the commands `search.run` prints at its end (with the study's own
flags), the report's file name, and `search.export` preferring what `search.confirm` confirmed.

The studies are synthetic (`tests/dashboard_study.py`): written straight to the two stores, no training.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from dashboards import report
from search import export
from search.study.next_steps import StudyFlags, after_search, print_after_search, report_path
from search.tracking.stores import resolve_uri, study_storage
from search.tracking.tracker import StudyTracker
from tests.dashboard_study import TRAIN, scratch_store, write_confirmations, write_study
from tests.helpers import ROOT

CONFIGS = ROOT / "trainer" / "configs"


def plan(tmp_path: Path, gpu: float = 0.0, data: str | None = "/data/shared", tracking_uri: str | None = None):
    """The fields of `search.run.StudyPlan` that the next steps read."""
    uri = tracking_uri or f"sqlite:///{tmp_path}/stores/mlflow.db"
    template = SimpleNamespace(data_dir=data, corpus=None, cache_dir="/tmp/my cache")
    return SimpleNamespace(study="s1", tracking_uri=uri, storage=study_storage(uri), template=template,
                           resources={"cpu": 1, "gpu": gpu})


def steps(text: str) -> dict[str, list[str]]:
    """`next steps:` lines as {what: the command's words}, comments dropped."""
    lines = text.splitlines()
    assert lines[0] == "next steps:"
    found = {}
    for line in lines[1:]:
        what, command = line.strip().split(":", 1)
        found[what] = shlex.split(command.split("#")[0])
    return found


def test_the_search_ends_with_the_next_commands_and_its_own_flags(tmp_path, capsys):
    found = steps(after_search(plan(tmp_path)))
    uri = f"sqlite:///{tmp_path}/stores/mlflow.db"
    assert set(found) == {"report", "MLflow UI", "confirm", "export"}
    for words in found.values():
        assert words[:2] == ["python", "-m"] and words[words.index("--study") + 1] == "s1"
        assert words[words.index("--tracking-uri") + 1] == uri  # not the default store: said
        assert "--storage" not in words  # beside the store, where every command looks by default
    confirm = found["confirm"]
    assert confirm[2] == "search.confirm"
    # The data again, as given (a path with a space survives the shell), and CPU-sized hand designs.
    assert confirm[confirm.index("--data") + 1] == "/data/shared"
    assert confirm[confirm.index("--cache-dir") + 1] == "/tmp/my cache"
    assert confirm[confirm.index("--baselines") + 1] == "sized-cpu,neobert-cpu,modernbert-cpu,crammed-bert-cpu"
    assert [found[what][2] for what in ("report", "MLflow UI", "export")] == \
        ["dashboards.report", "dashboards.ui", "search.export"]
    assert "--data" not in found["report"] and "--data" not in found["export"]  # they read the stores only
    assert "report-s1.html" in after_search(plan(tmp_path))

    gpu = steps(after_search(plan(tmp_path, gpu=1, data=None)))["confirm"]
    assert gpu[gpu.index("--baselines") + 1] == "neobert,modernbert,crammed-bert" and "--data" not in gpu

    # The default store (here, by the environment) is not spelled out.
    default = resolve_uri(None)
    assert "--tracking-uri" not in steps(after_search(plan(tmp_path, tracking_uri=default)))["report"]

    # Printed only after a finished study; the exit code goes through either way.
    assert print_after_search(plan(tmp_path), 130) == 130 and capsys.readouterr().out == ""
    assert print_after_search(plan(tmp_path), 0) == 0 and "search.confirm" in capsys.readouterr().out


def test_report_is_named_by_its_study(tmp_path, monkeypatch):
    assert report_path("cramnas-tpe-20260101-120000") == "report-cramnas-tpe-20260101-120000.html"
    assert report_path("my study/2") == "report-my_study_2.html"  # one file name, no directory
    monkeypatch.chdir(tmp_path)
    with scratch_store("cramnas-next-") as uri:
        write_study(uri, "first", 3, controller="random", objective="mlm", optuna_store=False)
        write_study(uri, "second", 3, controller="random", objective="mlm", optuna_store=False)
        assert report.main(["--study", "first", "--tracking-uri", uri, "--no-log"]) == 0
        assert report.main(["--study", "second", "--tracking-uri", uri, "--no-log"]) == 0
    # The second study's report did not overwrite the first's.
    assert sorted(p.name for p in tmp_path.glob("report*.html")) == ["report-first.html", "report-second.html"]
    assert "Study first" in (tmp_path / "report-first.html").read_text()


def test_report_hints_carry_the_studys_data(tmp_path):
    with scratch_store("cramnas-next-") as uri:
        write_study(uri, "hinted", 3, controller="random", objective="mlm", optuna_store=False)
        tracker = StudyTracker(uri, "hinted")
        tracker.start_study({"data": "/data/shared"})  # as search.run records it (search.study.next_steps.data_settings)
        page = report.write_report("hinted", tmp_path / "r.html", uri, log_artifact=False).read_text()
        flags = StudyFlags.of_run("hinted", uri, tracker.study_run())
    assert flags.data == {"data": "/data/shared"}
    confirmation = page.split('id="confirmation"')[1].split("</section>")[0]
    assert f"python -m search.confirm --study hinted --tracking-uri {uri} --data /data/shared</code>" in confirmation
    hand = page.split('id="hand-design"')[1].split("</section>")[0]
    assert "--data /data/shared --baselines sized-cpu,neobert-cpu,modernbert-cpu,crammed-bert-cpu" in hand


# ---- export prefers what the confirmation confirmed ---------------------------------------------

def write_baselines(study, scores: dict[str, list[float]], budget: str) -> None:
    """Baseline runs as `search.confirm --baselines` writes them, seeds 1001... (as `write_confirmations`)."""
    tracker = StudyTracker(study.uri, study.name)
    for name, values in scores.items():
        arch = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["arch"]
        for index, value in enumerate(values, start=1):
            run_id = tracker.open_baseline_run(name, 1000 + index, index, arch, TRAIN, budget)
            tracker.finish_run(run_id, "complete", {"probe_average": value, "validation_loss": 7.0 - 4.0 * value})


def test_export_prefers_the_best_confirmed_trial_and_records_its_confirmation(tmp_path, capsys):
    with scratch_store("cramnas-export-") as uri:
        study = write_study(uri, "confirmed", 8, controller="random", seed=4)
        complete = sorted(study.by_state("complete"), key=lambda t: -t.metrics["probe_average"])
        lucky, steady = complete[0].number, complete[1].number
        out = tmp_path / "best.yaml"
        # Before any confirmation: the search's best, and a hint to confirm it.
        assert export.main(["--study", "confirmed", "--tracking-uri", uri, "--out", str(out), "--force"]) == 0
        assert yaml.safe_load(out.read_text())["provenance"]["trial"] == lucky
        assert "search.confirm" in capsys.readouterr().out

        # The search's best was a lucky seed: its confirmations fall behind the runner-up's.
        write_confirmations(study, {lucky: [0.60, 0.62, 0.61], steady: [0.70, 0.72, 0.71]}, budget="120s")
        write_baselines(study, {"crammed-bert-cpu": [0.61, 0.63, 0.60], "bert-original-cpu": [0.80, 0.83, 0.81]},
                        budget="120s")
        assert export.main(["--study", "confirmed", "--tracking-uri", uri, "--out", str(out), "--force"]) == 0
    printed = capsys.readouterr().out
    exported = yaml.safe_load(out.read_text())
    provenance = exported["provenance"]
    assert provenance["trial"] == steady and exported["arch"] == study.trials[steady].arch
    confirmed = provenance["confirmed"]
    assert confirmed["budget"] == "120s" and confirmed["seeds"] == [1001, 1002, 1003]
    assert confirmed["mean"] == pytest.approx(0.71) and confirmed["search_best_trial"] == lucky
    low, high = confirmed["ci95"]
    assert low < 0.71 < high
    against = confirmed["baselines"]
    assert against["crammed-bert-cpu"]["beat"] is True and against["crammed-bert-cpu"]["paired_seeds"] == 3
    assert against["crammed-bert-cpu"]["difference"] == pytest.approx(0.71 - 0.61333, abs=1e-4)
    assert against["bert-original-cpu"]["beat"] is False
    assert against["bert-original-cpu"]["verdict"].startswith("baseline better by 0.103 in probe average")
    # Said, not only written: which trial, why, and the baseline it did not beat.
    assert f"trial {steady}: the best confirmed configuration, not the search's best trial {lucky}" in printed
    assert "did not beat baseline bert-original-cpu: baseline better by" in printed
