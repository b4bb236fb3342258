"""`search.confirm --ladder`: the study's top candidates promoted up rising budgets (`search.analysis.ladder`),
exported from the highest rung (`search.export`) and drawn against the budget (`dashboards.report`).

The rungs and the promotion are checked on stand-in crams (a table of losses); one real ladder crams
tiny architectures on the Wikipedia slice (tests/confirm_study.py's), resumes and is exported; the
export and the report are also checked on a synthetic study (tests/dashboard_study.py), whose
losses are chosen so that each rule, broken, picks another configuration.
"""

from __future__ import annotations

import argparse
import statistics

import mlflow
import optuna
import pytest
import yaml

import search.confirm
from dashboards import analysis, report
from dashboards.data import load_study
from search import export
from search.analysis.ladder import Ladder, climb, kept, ladder_of, pick, print_ladder
from search.base import tags as tag
from search.base.objectives import OBJECTIVES
from search.base.states import COMPLETE, FAILED
from search.confirm import Candidate, ConfirmPlan, SeedOutcome, main
from search.tracking.stores import study_storage
from search.tracking.tracker import StudyTracker
from tests.confirm_study import TRAIN, tiny_arch, write_study
from tests.dashboard_study import scratch_store, write_confirmations
from tests.dashboard_study import write_study as write_synthetic_study
from tests.helpers import CONFIGS, SLICE_SEQ, SLICE_VOCAB, requires_shared_data
from trainer.budget import Budget

MLM = OBJECTIVES["mlm"]
CORRUPTION_FLOOR, CONTEXT_REFERENCE = 5.856, 3.192  # the shared Wikipedia's (README), as a study run records them


def ladder_args(**flags) -> argparse.Namespace:
    return argparse.Namespace(**{"ladder": None, "target": None, "eta": None, "budget": None, "top": 6, **flags})


@pytest.mark.parametrize("flags, study_budget, rungs", [
    ({"ladder": "3x,9x,27x"}, "1e13flops", ["3e13flops", "9e13flops", "2.7e14flops"]),
    ({"ladder": "3x, 9x, 6e14flops"}, "1e13flops", ["3e13flops", "9e13flops", "6e14flops"]),  # a budget as given
    ({"ladder": "3x,9x"}, "2e4tokens", ["60000tokens", "180000tokens"]),
    ({"ladder": "2x,4x"}, "5m", ["600s", "1200s"]),
    # --target: 3x, 9x ... while at most half the target, then the target exactly.
    ({"target": "6e13flops"}, "1e13flops", ["3e13flops", "6e13flops"]),
    ({"target": "3e14flops"}, "1e13flops", ["3e13flops", "9e13flops", "3e14flops"]),
    ({"target": "30x"}, "1e13flops", ["3e13flops", "9e13flops", "3e14flops"]),
    ({"target": "5e13flops"}, "1e13flops", ["5e13flops"]),  # 3x is within a factor 2 of it
    ({"target": "cramming-day"}, "5e17flops", ["1.5e18flops", "cramming-day"]),  # a named budget as named
])
def test_rungs_rise_from_the_study_budget(flags, study_budget, rungs):
    ladder = ladder_of(ladder_args(**flags), Budget.parse(study_budget))
    assert [rung.text for rung in ladder.rungs] == rungs and ladder.eta == 3
    assert all(Budget.parse(rung.text) == rung for rung in ladder.rungs)  # the text is the rung: read back alike
    assert ladder.climbers(6) == [6, 2, 1][:len(rungs)]


# ---- promotion, on stand-in crams ------------------------------------------------------------------

# Six candidates in study rank order, three seeds each; None is a failed seed. At rung 0 the best
# mean is trial 2's, then trial 4's; trial 1 has the best single seed and trial 0 the best search
# score, and neither goes up. At rung 1 trial 4 overtakes trial 2: ranks move with compute.
LOSSES = {
    0: {0: [6.0, 6.0, 6.0]},
    1: {0: [5.0, 7.0, 7.0]},
    2: {0: [5.8, 5.9, 5.9], 1: [5.5, 5.5, 5.6]},
    3: {0: [None, None, None]},
    4: {0: [5.95, 5.9, 5.96], 1: [5.4, 5.45, 5.42], 2: [5.1, 5.2, 5.15]},
    5: {0: [6.5, 6.4, 6.6]},
    "hand": {0: [7.0, 7.1, 7.2], 1: [6.9, 6.8, 6.9], 2: [6.7, 6.7, 6.8]},
}
SEEDS = [1001, 1002, 1003]


def stand_in_plan(losses: dict, rungs: tuple[str, ...] = ("3e13flops", "9e13flops", "2.7e14flops"),
                  eta: int = 3) -> ConfirmPlan:
    def candidate(key) -> Candidate:
        if key == "hand":
            return Candidate(None, None, None, None, tiny_arch(), TRAIN, None, None, baseline="hand")
        return Candidate(key + 1, key, f"run{key}", 6.0, tiny_arch(layers=1 + key % 2), TRAIN, None, None)

    configurations = [candidate(key) for key in losses]
    ladder = Ladder(Budget.parse("1e13flops"), tuple(Budget.parse(text) for text in rungs), eta)
    return ConfirmPlan("s", None, MLM, ladder.rungs[-1], SEEDS, [c for c in configurations if c.baseline is None],
                       [c for c in configurations if c.baseline is not None], None, ladder=ladder)


def stand_in_crams(losses: dict, calls: list):
    """A `confirm_one` that returns the loss of `losses` for each (configuration, rung, seed)."""
    def confirm(plan: ConfirmPlan, candidate: Candidate, index: int, seed: int) -> SeedOutcome:
        calls.append((candidate.trial if candidate.baseline is None else candidate.baseline, plan.rung, plan.budget.text))
        assert plan.budget == plan.ladder.rungs[plan.rung] and seed == SEEDS[index - 1]
        loss = losses[calls[-1][0]][plan.rung][index - 1]
        if loss is None:
            return SeedOutcome(candidate, seed, "run", FAILED, None, "RuntimeError: out of memory")
        metrics = {"validation_loss": loss, "corruption_floor": CORRUPTION_FLOOR, "context_reference": CONTEXT_REFERENCE}
        return SeedOutcome(candidate, seed, "run", COMPLETE, loss, metrics=metrics)

    return confirm


def test_the_best_third_by_mean_goes_up_each_rung_beside_every_baseline(capsys):
    plan, calls, outcomes = stand_in_plan(LOSSES), [], []
    rungs = climb(plan, stand_in_crams(LOSSES, calls), outcomes)
    trained = [{(key, budget) for key, rung, budget in calls if rung == index} for index in range(3)]
    assert trained[0] == {(key, "3e13flops") for key in LOSSES}
    assert trained[1] == {(2, "9e13flops"), (4, "9e13flops"), ("hand", "9e13flops")}  # 6 // 3 = 2 go up
    assert trained[2] == {(4, "2.7e14flops"), ("hand", "2.7e14flops")}  # at least one
    assert len(calls) == len(outcomes) == 3 * (7 + 3 + 2)  # every seed, every outcome kept
    assert [[c.trial for c in rung.promoted] for rung in rungs] == [[2, 4], [4], []]
    assert [kept(n, 3) for n in (1, 2, 3, 4, 5, 6, 9)] == [1, 1, 1, 1, 1, 2, 3] and kept(6, 1) == 6  # 1/eta, at least 1
    best_rung, best = pick(rungs, MLM)
    assert (best_rung.index, best.candidate.trial) == (2, 4)
    assert best.summary[0] == pytest.approx(statistics.fmean(LOSSES[4][2]))

    print_ladder(plan, rungs)
    out = capsys.readouterr().out
    assert out.count("promoted to rung 1") == 2 and out.count("promoted to rung 2") == 1 and "pick" in out
    assert out.count("reference") == 3 and out.count("stays") == 4 + 1  # the baseline at each rung; who stayed
    assert "plateau" in out and "neighbours" in out  # each mean read against the references
    assert "pick: trial 4 (search rank 5), the best at rung 2, 2.7e14flops (27x): validation_loss 5.1500 ± " in out


def test_a_rung_without_a_complete_candidate_ends_the_ladder(capsys):
    losses = {0: {0: [None, None, None]}, "hand": {0: [7.0, 7.1, 7.2]}}
    plan, calls = stand_in_plan(losses, rungs=("3e13flops", "9e13flops")), []
    rungs = climb(plan, stand_in_crams(losses, calls), [])
    assert len(rungs) == 1 and {rung for _, rung, _ in calls} == {0} and pick(rungs, MLM) is None
    assert "the ladder stops at rung 0" in capsys.readouterr().out


# ---- bad input ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('ladder-flags')}/mlflow.db"
    write_study(uri, "b", [(tiny_arch(), "complete", {"validation_loss": 7.0})])  # budget 2e4tokens
    return uri


@pytest.mark.parametrize("extra, expected", [
    (["--ladder", "3x,2x"], "--ladder: rungs must rise, but 2x comes after 3x"),
    (["--ladder", "1x,3x"], "--ladder: 1x is not above the study's budget 2e4tokens"),
    (["--ladder", "3x,1e4tokens"], "--ladder: 1e4tokens is not above the study's budget 2e4tokens"),
    (["--ladder", "3y"], "--ladder: cannot read '3y'"),
    (["--ladder", "3x,1e14flops"], "--ladder: 1e14flops counts flops, the study's budget 2e4tokens counts tokens"),
    (["--ladder", "3x,9x", "--budget", "3e3tokens"], "--ladder: the rungs are the budgets"),
    (["--ladder", "3x,9x", "--eta", "0"], "--eta: must be at least 1"),
    (["--eta", "2"], "--eta: only with --ladder or --target"),
    (["--ladder", "3x", "--target", "9x"], "--target: give either --ladder"),
    (["--target", "5 fortnights"], "--target: cannot read '5 fortnights'"),
    (["--target", "1e4tokens"], "--target: 1e4tokens is not above the study's budget 2e4tokens"),
    (["--ladder", "3x", "--top", "0", "--baselines", "crammed-bert-cpu"], "--top: a ladder promotes candidates"),
])
def test_bad_ladder_input_is_one_line_before_any_training(extra, expected, small_store, capsys, monkeypatch):
    import search.study.trial

    def no_training(*args, **kwargs):
        raise AssertionError("trained despite bad input")

    monkeypatch.setattr(search.study.trial, "cram_and_probe", no_training)
    capsys.readouterr()
    assert main(["--study", "b", "--tracking-uri", small_store, *extra]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: {expected}"), err
    assert captured.out == ""


def test_estimate_prices_every_rung_and_trains_nothing(small_store, capsys, monkeypatch):
    import search.study.trial

    monkeypatch.setattr(search.study.trial, "cram_and_probe", lambda *args, **kwargs: pytest.fail("trained for an estimate"))
    runs_before = len(mlflow.MlflowClient(small_store).search_runs([mlflow.MlflowClient(small_store)
                                                                    .get_experiment_by_name("b").experiment_id]))
    assert main(["--study", "b", "--tracking-uri", small_store, "--ladder", "3x,9x", "--seeds", "2",
                 "--baselines", "crammed-bert-cpu", "--estimate", "--profile", "gpu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    # one candidate and one baseline with 2 seeds, at both rungs: 8 runs (tokens priced at the gpu profile's speed)
    assert out.startswith("estimate: 8 runs (60000tokens (3x), 180000tokens (9x)), ") and "GPU-minutes" in out
    client = mlflow.MlflowClient(small_store)
    assert len(client.search_runs([client.get_experiment_by_name("b").experiment_id])) == runs_before


# ---- a real ladder ----------------------------------------------------------------------------------

STUDY_BUDGET = "1e3tokens"  # per trial: the rungs 2x, 4x are then crams of seconds
RUNG_BUDGETS = {"0": "2000tokens", "1": "4000tokens"}


def write_tiny_study(uri: str, name: str, trials: list[tuple[dict, float]]) -> None:
    """A finished mlm study of complete trials (arch, validation loss) under STUDY_BUDGET, in both
    stores, as search.run records it: what search.confirm and search.export read."""
    tracker = StudyTracker(uri, name)
    tracker.start_study({"controller": "random", "objective": "mlm", "budget": STUDY_BUDGET, "trials": len(trials),
                         "train": TRAIN, "probe_tasks": "", "probe_limits": {}})
    optuna_study = optuna.create_study(study_name=name, storage=study_storage(uri))
    for key, value in {"objective": "mlm", "train": TRAIN, "budget": STUDY_BUDGET}.items():
        optuna_study.set_user_attr(key, value)
    for number, (arch, loss) in enumerate(trials):
        run_id = tracker.open_trial_run(number, arch, TRAIN, f"fp{number}")
        tracker.finish_run(run_id, COMPLETE, {"validation_loss": loss, "tokens": 992}, artifacts={"arch.yaml": arch})
        optuna_study.add_trial(optuna.trial.create_trial(value=loss, params={}, distributions={},
                                                         user_attrs={"arch": arch, "metrics": {"validation_loss": loss}}))
    tracker.finish_study()


def tiny_baseline(directory, name: str) -> None:
    """crammed-bert-cpu shrunk to the slice, as directory/<name>.yaml (search.confirm.BASELINES)."""
    config = yaml.safe_load((CONFIGS / "crammed-bert-cpu.yaml").read_text())
    config["name"] = name
    config["arch"].update(layers=1, hidden=32, heads=2, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
    config["train"].update(micro_batch=8, batch_size=16)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(config))


def seed_runs(uri: str, study: str) -> list:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(study)
    return client.search_runs([experiment.experiment_id], "tags.`cramnas.kind` != 'study' and "
                                                          "tags.`cramnas.kind` != 'trial'")


@requires_shared_data
@pytest.mark.slow  # 13 tiny crams
def test_a_real_ladder_promotes_by_mean_tags_its_rungs_resumes_and_is_exported(
        wiki_slice_dir, slice_cache, tmp_path, capsys, monkeypatch):
    configs = tmp_path / "configs"
    configs.mkdir()
    tiny_baseline(configs, "hand")
    monkeypatch.setattr(search.confirm, "BASELINES", configs)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # Study ranks 1, 2, 3 are trials 2, 1, 0; trial 3 is beyond --top 3.
    write_tiny_study(uri, "lad", [(tiny_arch(), 7.0), (tiny_arch(position="rotary"), 6.9),
                                  (tiny_arch(ffn_kind="gelu"), 6.8), (tiny_arch(layers=2), 7.5)])
    command = ["--study", "lad", "--tracking-uri", uri, "--data", str(wiki_slice_dir), "--cache-dir", str(slice_cache),
               "--top", "3", "--seeds", "2", "--ladder", "2x,4x", "--eta", "2", "--baselines", "hand"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "up the ladder 2000tokens (2x), 4000tokens (4x), the best 1/2 going up each rung: at most 12 run(s)" in out
    runs = seed_runs(uri, "lad")
    assert len(runs) == 12
    for run in runs:  # each an ordinary confirmation or baseline run under its rung's budget
        tags = run.data.tags
        assert run.info.status == "FINISHED" and tags[tag.STATE] == COMPLETE
        assert tags[tag.BUDGET] == run.data.params["budget"] == RUNG_BUDGETS[tags[tag.RUNG]]
        assert int(tags[tag.SEED]) in (1008, 1009)
        assert run.data.metrics["tokens"] <= Budget.parse(tags[tag.BUDGET]).amount
    confirmations = [r for r in runs if r.data.tags[tag.KIND] == tag.CONFIRMATION]
    at_rung = {rung: [r for r in confirmations if r.data.tags[tag.RUNG] == rung] for rung in RUNG_BUDGETS}
    assert {r.data.tags[tag.ORIGINAL_TRIAL] for r in at_rung["0"]} == {"0", "1", "2"} and len(at_rung["0"]) == 6
    means = {trial: statistics.fmean(r.data.metrics["validation_loss"] for r in at_rung["0"]
                                     if r.data.tags[tag.ORIGINAL_TRIAL] == trial) for trial in ("0", "1", "2")}
    promoted = min(means, key=means.get)  # 3 // 2: the one best mean goes up
    assert {r.data.tags[tag.ORIGINAL_TRIAL] for r in at_rung["1"]} == {promoted} and len(at_rung["1"]) == 2
    baselines = [r for r in runs if r.data.tags[tag.KIND] == tag.BASELINE]
    assert sorted(r.data.tags[tag.RUNG] for r in baselines) == ["0", "0", "1", "1"]  # every rung
    assert out.count("promoted to rung 1") == 1 and f"pick: trial {promoted} " in out
    assert "at rung 1, 4000tokens (4x)" in out and "12 complete now" in out

    # Again: nothing is crammed, and the same scores promote the same candidate.
    assert main(command) == 0
    out = capsys.readouterr().out
    assert len(seed_runs(uri, "lad")) == 12 and out.count("complete before (run") == 12 and "0 complete now" in out
    assert f"pick: trial {promoted} " in out

    # A run a Ctrl-C left KILLED at the top rung is re-done, in the same run, still tagged with its rung.
    client = mlflow.MlflowClient(uri)
    killed = at_rung["1"][0].info.run_id
    client.set_terminated(killed, "KILLED")
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "re-doing" in out and "1 complete now" in out and "11 complete before" in out
    run = client.get_run(killed)
    assert run.info.status == "FINISHED" and run.data.tags[tag.RUNG] == "1" and len(seed_runs(uri, "lad")) == 12

    out_file = tmp_path / "best.yaml"
    assert export.main(["--study", "lad", "--tracking-uri", uri, "--out", str(out_file), "--force"]) == 0
    provenance = yaml.safe_load(out_file.read_text())["provenance"]
    assert provenance["trial"] == int(promoted) and provenance["confirmed"]["budget"] == "4000tokens"
    assert provenance["ladder"] == {"rungs": ["2000tokens", "4000tokens"], "picked_at": "4000tokens"}
    assert set(provenance["confirmed"]["baselines"]) == {"hand"}  # set against the baseline at the same rung
    assert "the pick of the ladder 2000tokens, 4000tokens" in capsys.readouterr().out


# ---- export and report, on a synthetic ladder ---------------------------------------------------------

# mlm study of budget 60s. Rung 0 (180s): trial A best. Rung 1 (540s): trial B overtakes A. Rung 2
# (1620s): every seed failed, so the pick stays at 540s. Plain confirmations at 120s, written last,
# rank C first: the latest budget, which export took before ladders, would pick C.
RUNGS = {"180s": {"A": [5.40, 5.42, 5.41], "B": [5.50, 5.52, 5.51], "C": [5.60, 5.61, 5.62]},
         "540s": {"A": [5.20, 5.22, 5.21], "B": [5.10, 5.12, 5.11]},
         "1620s": {"B": [5.00, 5.00, 5.00]}}
PLAIN = {"120s": {"A": [6.0, 6.1, 6.2], "B": [6.1, 6.2, 6.3], "C": [5.7, 5.8, 5.9]}}


@pytest.fixture(scope="module")
def climbed():
    with scratch_store("cramnas-ladder-") as uri:
        study = write_synthetic_study(uri, "climbed", 6, controller="random", objective="mlm", seed=5)
        tracker = StudyTracker(uri, "climbed")
        tracker.start_study({"corruption_floor": CORRUPTION_FLOOR, "context_reference": CONTEXT_REFERENCE})
        tracker.finish_study()  # start_study reopened it to record them, as search.run on resume
        trials = {"A": 1, "B": 3, "C": 4}
        client = mlflow.MlflowClient(uri)
        for rung, (budget, losses) in enumerate(RUNGS.items()):
            failed = tuple((trials[key], seed) for key in losses for seed in (1, 2, 3)) if budget == "1620s" else ()
            run_ids = write_confirmations(study, {trials[key]: values for key, values in losses.items()}, budget, failed)
            arch = yaml.safe_load((CONFIGS / "crammed-bert-cpu.yaml").read_text())["arch"]
            for index in (1, 2, 3):  # the baseline beside them, every rung
                run_ids.append(tracker.open_baseline_run("crammed-bert-cpu", 1000 + index, index, arch, TRAIN, budget))
                tracker.finish_run(run_ids[-1], COMPLETE, {"validation_loss": 5.9 - 0.1 * rung})
            for run_id in run_ids:
                client.set_tag(run_id, tag.RUNG, str(rung))
        for budget, losses in PLAIN.items():
            write_confirmations(study, {trials[key]: values for key, values in losses.items()}, budget)
        yield study, trials


def test_export_picks_the_best_at_the_highest_rung_with_a_complete_seed(climbed, tmp_path, capsys):
    study, trials = climbed
    out = tmp_path / "best.yaml"
    assert export.main(["--study", "climbed", "--tracking-uri", study.uri, "--out", str(out), "--force"]) == 0
    exported = yaml.safe_load(out.read_text())
    provenance = exported["provenance"]
    assert provenance["trial"] == trials["B"] and exported["arch"] == study.trials[trials["B"]].arch
    confirmed = provenance["confirmed"]
    assert confirmed["budget"] == "540s" and confirmed["mean"] == pytest.approx(5.11)
    assert confirmed["seeds"] == [1001, 1002, 1003] and "crammed-bert-cpu" in confirmed["baselines"]
    assert provenance["ladder"] == {"rungs": ["180s", "540s", "1620s"], "picked_at": "540s"}
    assert "the pick of the ladder 180s, 540s, 1620s" in capsys.readouterr().out


def test_report_draws_each_configurations_loss_against_the_budget(climbed, tmp_path):
    study, trials = climbed
    data = load_study("climbed", study.uri)
    curves = analysis.budget_curves(data.confirmations, data.baselines, data.trials, "seconds").set_index(
        ["configuration", "budget"])
    b = f"trial {trials['B']}"
    assert list(curves.loc[b].index) == ["120s", "180s", "540s", "1620s"]  # by budget, not by when they ran
    assert curves.loc[(b, "540s"), "mean"] == pytest.approx(5.11) and curves.loc[(b, "540s"), "n"] == 3
    assert curves.loc[(b, "1620s"), "n"] == 0  # failed seeds have no loss
    assert curves.loc[("crammed-bert-cpu", "540s"), "kind"] == "baseline"
    assert analysis.budget_curves(data.confirmations, data.baselines, data.trials, "flops").empty  # other kinds: no axis

    page = report.write_report("climbed", tmp_path / "climbed.html", study.uri, log_artifact=False).read_text()
    assert '<a href="#ladder">' in page
    confirmation = page.split('id="confirmation"')[1].split("</section>")[0]
    assert "Under 540s, the highest budget" in confirmation  # ranked at one budget, the one export picks from
    order = [page.index(f'id="{key}"') for key in ("confirmation", "ladder", "hand-design")]
    assert order == sorted(order)  # after the confirmation it extends
    section = page.split('id="ladder"')[1].split("</section>")[0]
    assert section.count('class="plotly-graph-div"') == 1
    for name in (f"trial {trials['A']}", b, f"trial {trials['C']}", "crammed-bert-cpu"):
        assert f'"name":"{name}"' in section
    for reference in (f"corruption floor {CORRUPTION_FLOOR:.3f}", f"two-neighbour count model {CONTEXT_REFERENCE:.3f}"):
        assert reference in section
    assert '"type":"log"' in section and "budget per run, seconds (log scale)" in section
    assert f"At 540s, the highest budget where a configuration completed a seed, the best by validation MLM loss: <b>{b}</b>" \
        in section
