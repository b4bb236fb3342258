"""benchmarks/multi_fidelity.py run as a user runs it, on the real study crams of benchmarks/crams/
with tiny settings: random search and TPE, with and without early stopping, 2 seeds of 40 trials,
then the same command again, then `--report`. What is checked could fail: the compute a stopped
trial is counted, that early stopping spends less, that a rerun trains nothing stored, that the
report has a row per combination."""

from __future__ import annotations

import csv
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from search.base.paths import PROFILES
from search.run import load_profile
from search.study.estimate import asha_rungs
from search.study.warm_start import hand_design_names
from tests.helpers import table

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "multi_fidelity.py"
CRAMS = SCRIPT.parent / "crams"
CONTROLLERS, SEEDS, TRIALS = ("random", "tpe"), 2, 40
# A cheap world: no cross-validation of the surrogate (its fit is the same), few random members and resamples.
ARGS = ("--controllers", *CONTROLLERS, "--seeds", SEEDS, "--trials", TRIALS, "--members", 300, "--repeats", 0,
        "--boot", 20)
CUT_SHORT = '{"kind":"study","controller":"random","early_st'  # a line a killed process left


def start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[str, str]:
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    return stdout, stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The command, a line cut short appended, then the same command again beside --report (side
    by side: neither should write)."""
    out = tmp_path_factory.mktemp("multi_fidelity") / "studies.jsonl"
    first, _ = finish(start(*ARGS, "--out", out))
    screened, _ = finish(start(*ARGS, "--screen", "--out", out))  # the same controllers' screened studies
    stored = out.read_text()
    with out.open("a") as file:
        file.write(CUT_SHORT)
    kept = out.with_name("kept.jsonl.gz")  # as RESULTS' store is kept in benchmarks/crams/
    kept.write_bytes(gzip.compress(stored.encode()))
    second, report, from_kept = start(*ARGS, "--out", out), start("--report", out), start("--report", kept)
    return {"out": out, "first": first, "screened": screened, "stored": stored, "second": finish(second),
            "report": finish(report)[0],
            "from_kept": finish(from_kept)[0]}


def studies(text: str) -> list[dict]:
    return [line for line in map(json.loads, text.splitlines()) if line["kind"] == "study"]


def longest_curve() -> int:
    """The progress reports of a trial run to its end, as the real crams have them."""
    rows = [row for path in sorted(CRAMS.glob("default-s*.csv")) if "confirm" not in path.name
            for row in csv.DictReader(path.open())]
    return max(len(row["curve"].split()) for row in rows)


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_combination_and_seed_is_one_study_of_its_trials(runs):
    stored = studies(runs["stored"])
    assert sorted((s["controller"], s["early_stop"], s["seed"]) for s in stored) == sorted(
        (c, e, seed) for c in CONTROLLERS for e in (False, True) for seed in range(SEEDS))
    warm = hand_design_names("cpu")
    for study in stored:
        # Every ask is one of the trials, repeats and stopped trials included; the hand designs come first.
        assert all(len(study[key]) == TRIALS for key in ("state", "true", "observed", "stopped_at", "compute"))
        assert study["warm_start"][:len(warm)] == warm


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_stopped_trial_is_counted_as_far_as_it_ran(runs):
    early_stop = load_profile(PROFILES / "cpu.yaml")["early_stop"]
    reports = longest_curve()
    # The rungs as Ray's ASHAScheduler builds them from search.run's max_t (ray_executor.early_stopping).
    rungs = asha_rungs(early_stop["grace_reports"], early_stop["reduction_factor"], reports + 0.5)
    stopped = 0
    for study in studies(runs["stored"]):
        for state, observed, at, compute in zip(study["state"], study["observed"], study["stopped_at"],
                                                study["compute"], strict=True):
            if state == "pruned":
                assert study["early_stop"] and at in rungs and observed is None
                assert compute == pytest.approx(at / (reports + 1))
                stopped += 1
            else:
                assert at is None and observed is not None
                assert compute == (1.0 if state == "complete" else 0.0)  # a repeat trains nothing
    assert stopped > 0


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_baseline_is_the_warm_start_the_studies_saw(runs):
    """sized-cpu is trial 1 of every study (a warm start); the bar "below the model's value of it"
    is the value those studies saw for it, so it never meets its own bar."""
    [setup] = [line for line in map(json.loads, runs["stored"].splitlines()) if line["kind"] == "setup"]
    for study in studies(runs["stored"]):
        assert study["warm_start"][0] == "sized-cpu" and study["true"][0] == setup["baseline_predicted"]
    rows = table(runs["report"], "| controller | early stopping | trials to beat sized-cpu |")
    assert rows and all(not row[2].startswith("1 (") for row in rows)  # the warm starts are not the search


@pytest.mark.slow
@pytest.mark.subprocess
def test_early_stopping_spends_less_than_every_trial_run_to_its_end(runs):
    spent = {(s["controller"], s["early_stop"], s["seed"]): sum(s["compute"]) for s in studies(runs["stored"])}
    for controller in CONTROLLERS:
        for seed in range(SEEDS):
            assert spent[controller, True, seed] < spent[controller, False, seed]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_rerun_runs_nothing_stored_and_skips_a_line_cut_short(runs):
    assert runs["first"].startswith(f"{len(CONTROLLERS) * 2 * SEEDS} studies to run, 0 stored")
    assert runs["second"][0].startswith(f"0 studies to run, {len(CONTROLLERS) * 2 * SEEDS} stored")
    assert "not a whole line (cut short?)" in runs["second"][1]
    assert runs["out"].read_text() == runs["stored"] + CUT_SHORT  # nothing appended


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_report_has_a_row_for_every_combination(runs):
    report = runs["report"]
    assert runs["second"][0].endswith(report)  # the run's report is the stored studies' alone
    assert runs["from_kept"] == report
    combinations = {(c, e) for c in CONTROLLERS for e in ("off", "on")}
    regrets = table(report, "| controller | early stopping | 32 trials | 40 trials |")
    assert {(row[0], row[1]) for row in regrets} == combinations
    for row in regrets:
        for cell in row[2:4]:  # every seed ran 40 trials: no cell names fewer seeds
            median, p90 = map(float, cell.split(" / "))
            assert median <= p90
    compute = {(row[0], row[1]): row for row in table(report, "| controller | early stopping | 32 trials | 40 trials | stopped")}
    assert set(compute) == combinations
    stored = studies(runs["stored"])
    for controller in CONTROLLERS:
        trained = [s["state"].count("complete") for s in stored if s["controller"] == controller and not s["early_stop"]]
        assert compute[controller, "off"][3] == f"{sum(trained) / len(trained):.1f}"  # a repeat is free
        share = re.fullmatch(r"(\S+) \((\d+)%\)", compute[controller, "on"][3])
        assert share and int(share[2]) < 100
    below = table(report, "| controller | early stopping | trials to beat sized-cpu |")
    assert {(row[0], row[1]) for row in below} == combinations
    assert {row[0] for row in table(report, "| controller | without, 32 trials | with, same compute |")} == set(CONTROLLERS)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_screened_study_crams_a_quarter_and_promotes_its_best_share(runs):
    """--screen: each trial a whole cram at a quarter of the budget, its final at the whole budget kept
    for the promotion; the report promotes the best quarter of a prefix, then the profile's eighth,
    and counts both stages."""
    screened = [line for line in map(json.loads, runs["stored"].splitlines()) if line["kind"] == "screened"]
    assert sorted((s["controller"], s["seed"]) for s in screened) == sorted(
        (c, seed) for c in CONTROLLERS for seed in range(SEEDS))
    assert runs["screened"].startswith(f"{len(CONTROLLERS) * SEEDS} studies to run, 0 stored")
    for study in screened:
        assert len(study["state"]) == TRIALS and study["factor"] == 4
        for state, compute, final in zip(study["state"], study["compute"], study["final"], strict=True):
            assert (compute, final is None) == ((0.25, False) if state == "complete" else (0.0, True))
    regrets = table(runs["report"], "| controller | screened, 32 trials | unscreened, same compute |")
    assert [row[0] for row in regrets] == list(CONTROLLERS)
    compute = {row[0]: row for row in table(runs["report"], "| controller | 32 trials | 40 trials | warm-start winner")}
    for controller in CONTROLLERS:
        # 40 trials: at most 10 crams' worth screened (repeats are free) and 10 promoted, against ~40 whole
        share = re.fullmatch(r"(\S+) \((\d+)%\)", compute[controller][2])
        assert float(share[1]) <= 20 and int(share[2]) < 60
    # The profile's share, the best eighth: the same screens, 5 promoted of 40.
    eighth = runs["report"][runs["report"].index("`--screen 4 --promote 8`"):]
    assert "`--screen 4 --promote 4`" in runs["report"].split("`--screen 4 --promote 8`")[0]
    compute = {row[0]: row for row in table(eighth, "| controller | 32 trials | 40 trials | warm-start winner")}
    for controller in CONTROLLERS:
        share = re.fullmatch(r"(\S+) \((\d+)%\)", compute[controller][2])
        assert float(share[1]) <= 15 and int(share[2]) < 45


def test_the_promotion_is_the_best_share_of_the_screen_and_the_winner_the_best_final():
    sys.path.insert(0, str(SCRIPT.parent))
    from multi_fidelity import promoted, screened_spent, screened_winner

    # 8 trials: the warm start first; trial 2 a repeat (not promoted again); a quarter of 8 is 2.
    study = {"factor": 4, "state": ["complete", "complete", "repeat", *["complete"] * 5],
             "observed": [5.0, 4.1, 4.1, 4.9, 4.0, 5.5, 4.6, 4.7],
             "final": [4.9, 4.3, None, 4.2, 4.4, 4.0, 4.5, 4.6],
             "compute": [0.25, 0.25, 0.0, *[0.25] * 5]}
    assert promoted(study, 8, 4) == [4, 1] and screened_winner(study, 8, 4) == 1
    assert screened_spent(study, 8, 4) == pytest.approx(7 * 0.25 + 2)
    # A prefix promotes its own best: of the first 4 trials, one (a quarter of 4).
    assert promoted(study, 4, 4) == [1] and screened_spent(study, 4, 4) == pytest.approx(3 * 0.25 + 1)
    # Promoting an eighth: one of 8, the screen's best, whose final is not the best promoted above.
    assert promoted(study, 8, 8) == [4] and screened_winner(study, 8, 8) == 4
    assert screened_spent(study, 8, 8) == pytest.approx(7 * 0.25 + 1)


@pytest.mark.slow
@pytest.mark.subprocess
def test_results_show_the_report_of_the_stored_studies(tmp_path):
    """RESULTS' tables are `--report` of the studies kept in benchmarks/crams/, every row as printed."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--report", str(CRAMS / "multi_fidelity.jsonl.gz")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| gp | off |") for line in rows)
    results = (SCRIPT.parent / "RESULTS.md").read_text()
    missing = [line for line in rows if line not in results]
    assert not missing, f"RESULTS.md lacks {len(missing)} rows of the report, e.g. {missing[0]}"
