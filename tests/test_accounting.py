"""The arithmetic of the accounting, search.analysis.accounting (compute-equivalent multiples,
payback, size or design), and of the proving ground (search.analysis.proving_ground: whose winner is
which, its tables; search.study.stages, which runs its stages; the commands benchmarks/proving_ground.py
--dry-run prints), on made-up numbers: the real benchmarks take hours."""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest

from search.analysis import accounting, proving_ground
from search.analysis import crams as cram_store
from search.study import stages as stage_runner
from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget


def test_compute_equivalent_interpolates_in_log_compute():
    multiples, losses = [1, 2, 4, 8, 16], [6.0, 5.0, 4.0, 3.5, 3.0]
    assert accounting.compute_equivalent(multiples, losses, 5.0) == pytest.approx(2.0)
    assert accounting.compute_equivalent(multiples, losses, 4.5) == pytest.approx(2 ** 1.5)  # halfway in log2
    assert accounting.compute_equivalent(multiples, losses, 6.5) == 1.0  # there already at 1x
    assert accounting.compute_equivalent(multiples, losses, 2.9) is None  # never within the ladder: "> 16x"


def test_payback_counts_final_runs():
    account = accounting.payback(search_flops=100.0, final_flops=10.0, factor=3.0)
    assert account == {"search_in_final_runs": 10.0, "saved_per_run": 20.0, "payback_runs": 5.0}
    assert accounting.payback(100.0, 10.0, None)["payback_runs"] is None  # no measurable saving
    assert accounting.payback(100.0, 10.0, 1.0)["payback_runs"] is None


def test_split_win_into_size_and_design():
    grid = {("winner", "winner"): 4.0, ("winner", "baseline"): 4.5, ("baseline", "winner"): 5.0,
            ("baseline", "baseline"): 6.0}
    parts = accounting.split_win(grid)
    assert parts["win"] == pytest.approx(2.0)
    assert parts["size"] + parts["design"] == pytest.approx(parts["win"])
    assert parts["size"] == pytest.approx(0.75) and parts["design"] == pytest.approx(1.25)
    # the baseline's size costs 1.0 under the baseline's design, 0.5 under the winner's
    assert parts["interaction"] == pytest.approx(0.5)


def test_the_proving_ground_reads_the_transfer_of_ranks_from_trial_to_confirmation():
    same_order = [(5.0, 4.0), (5.5, 4.6), (6.0, 5.1), (6.5, 5.3)]
    assert "Spearman 1.00" in proving_ground.transfer(same_order)
    reversed_order = [(trial, -confirmed) for trial, confirmed in same_order]
    assert "Spearman -1.00" in proving_ground.transfer(reversed_order)
    assert "too few to rank" in proving_ground.transfer(same_order[:2])


def cram_row(name: str, multiple: float, seed: int, loss: float, tokens: int = 1000) -> dict:
    """A line of crams.jsonl as search.analysis.crams.cram_job writes it, with what the accounting reads."""
    return {"key": f"{name}|{multiple:g}x|{seed}", "name": name, "validation_loss": loss, "seconds": 10.0 * multiple,
            "tokens": tokens, "flops_per_token": 1e6, "corruption_floor": 6.0, "context_reference": 3.0,
            "unigram_floor": 7.0, "params": 100_000, "regime": "neighbours"}


def test_payback_under_a_refs_budget_counts_the_flops_the_winners_crams_spent(tmp_path):
    # Reference-core seconds are no FLOP amount: a final run costs what the winner's 1x crams trained.
    rows = [cram_row("winner", 1, seed, loss, tokens) for seed, loss, tokens in ((0, 4.4, 990), (1, 4.5, 1000),
                                                                               (2, 4.6, 1010))]
    rows += [cram_row("winner", 4, 0, 3.9)]
    rows += [cram_row("sized-cpu", m, seed, loss) for m, loss in ((1, 5.0), (2, 4.5), (4, 4.0)) for seed in (0, 1, 2)]
    (tmp_path / "crams.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("60refs"), jobs=1)
    assert crams.flops("winner", 1) == [990e6, 1000e6, 1010e6]
    search = {"flops": 1e10, "device_seconds": 3600.0, "trials": 10}
    text = "\n".join(accounting.ladder_tables(crams, ["sized-cpu"], crams.budget, search, (1, 2, 4)))
    # 1e10 + 3 confirmation seeds x 1e9 = 13 final runs of 1e9; sized-cpu needs 2x for the winner's 4.5
    assert "= 13 final runs of 60refs" in text
    assert "a factor 2.0 per final run, so the search pays back after 13.0 runs" in text
    assert "nan" not in text


class InlinePool(concurrent.futures.ThreadPoolExecutor):
    """`Crams.run`'s process pool, in this process and one at a time: the patched cram function is called."""

    def __init__(self, workers: int, mp_context=None):
        super().__init__(1)


def small_arch(hidden: int) -> dict:
    return ArchConfig(layers=1, hidden=hidden, heads=1).to_dict()


def test_crams_refuse_a_kept_cram_of_another_architecture_before_cramming_anything(tmp_path, monkeypatch):
    # Crams are kept by (name, multiple, seed): a study whose winner changed, or an --out shared by two
    # runs, would otherwise read another architecture's loss as this one's.
    kept = {**cram_row("winner", 1, 0, 4.4), "arch_fingerprint": ArchConfig.from_dict(small_arch(32)).fingerprint()}
    (tmp_path / "crams.jsonl").write_text(json.dumps(kept) + "\n")
    crammed = []
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(cram_store, "cram_job", lambda job: crammed.append(job["key"]) or cram_row("winner", 1, 1, 4.5))
    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), jobs=1)
    other = [("winner", small_arch(64), {}, 1, seed) for seed in (0, 1)]
    with pytest.raises(UsageError, match=r"keeps winner\|1x\|0 of another architecture than this call's winner; "
                                         r"pass another --out"):
        crams.run(other)
    assert crammed == []
    crams.run([("winner", small_arch(32), {}, 1, seed) for seed in (0, 1)])  # the same architecture: reused
    assert crammed == ["winner|1x|1"] and crams.losses("winner", 1) == [4.4, 4.5]


def test_a_dead_worker_ends_the_run_in_one_line_and_keeps_what_finished(tmp_path, monkeypatch):
    def cram_job(job: dict) -> dict:
        if job["key"].endswith("|1"):  # the pool raises this for every cram once a worker is killed
            raise concurrent.futures.process.BrokenProcessPool("a process in the pool was terminated abruptly")
        return cram_row("winner", 1, 0, 4.4)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(cram_store, "cram_job", cram_job)
    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), jobs=2)
    with pytest.raises(SystemExit, match="worker process died; 1 of 2 crams finished and are kept in .*crams.jsonl; "
                                         "run the same command again to go on"):
        crams.run([("winner", small_arch(32), {}, 1, seed) for seed in (0, 1)])
    again = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), jobs=2)
    assert list(again.done) == ["winner|1x|0"]


def test_the_accounted_trial_is_the_studys_best_or_the_one_asked_for():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="s", storage=storage)
    study.set_user_attr("train", {"lr": 1e-3})
    study.set_user_attr("budget", "2e12flops")
    for loss, hidden in ((5.0, 32), (4.0, 64), (4.5, 48)):
        study.add_trial(optuna.trial.create_trial(value=loss, user_attrs={"arch": {"hidden": hidden},
                                                                          "metrics": {"validation_loss": loss}}))
    assert accounting.study_winner(storage, "s") == ({"hidden": 64}, {"lr": 1e-3}, "2e12flops")
    assert accounting.study_winner(storage, "s", trial=2)[0] == {"hidden": 48}
    with pytest.raises(UsageError, match="no complete trial 7"):
        accounting.study_winner(storage, "s", trial=7)


# ---- the proving ground -------------------------------------------------------------------------

Study = proving_ground.Study
LONG, SHORT = "6e12flops", "2e12flops"


def configuration(name: str, losses: dict[str, list[float]], trial: int | None = None) -> object:
    """A confirmed candidate (with `trial`) or a baseline whose seeds 0, 1, ... scored `losses` per budget."""
    seeds = {budget: pd.DataFrame({"validation_loss": values, "nats_below_floor": [6.0 - v for v in values],
                                   "tokens_per_s": 1000.0, "params": 100_000, "corruption_floor": 6.0,
                                   "context_reference": 3.0, "unigram_floor": 7.0})
             for budget, values in losses.items()}
    return proving_ground.Configuration(name, "1x64", seeds, trial, None if trial is None else 6.0 - trial / 10)


def made_up_results() -> object:
    # pg-tpe-s0's trial 5 is the better at the trial budget, trial 3 at the long one: trial 3 wins.
    return proving_ground.Results({
        Study("tpe", 0): [configuration("pg-tpe-s0 trial 5", {LONG: [4.5, 4.6, 4.7], SHORT: [5.0, 5.1, 5.2]}, 5),
                          configuration("pg-tpe-s0 trial 3", {LONG: [4.0, 4.1, 4.2], SHORT: [5.5, 5.6, 5.7]}, 3)],
        Study("random", 0): [configuration("pg-random-s0 trial 1", {LONG: [4.2, 4.4, 4.5], SHORT: [5.3, 5.3, 5.4]}, 1)],
        Study("tpe", 1): [configuration("pg-tpe-s1 trial 2", {SHORT: [4.9, 5.0, 5.1]}, 2)],  # never confirmed long
        Study("random", 1): [configuration("pg-random-s1 trial 8", {LONG: [3.9, 4.0, 4.0], SHORT: [5.2, 5.3, 5.3]}, 8)],
    }, [configuration("sized-cpu (hand-designed)", {LONG: [4.3, 4.4, 4.5], SHORT: [5.0, 5.0, 5.1]})])


def test_each_studys_winner_is_crowned_at_the_long_budget_and_the_best_is_accounted():
    results = made_up_results()
    winners = proving_ground.winners(results, LONG)
    assert {study.name: winner.name for study, winner in winners.items()} == {
        "pg-tpe-s0": "pg-tpe-s0 trial 3", "pg-random-s0": "pg-random-s0 trial 1", "pg-random-s1": "pg-random-s1 trial 8"}
    study, winner = proving_ground.accounted(winners, LONG, "best")
    assert (study.name, winner.trial) == ("pg-random-s1", 8)  # the lowest long-budget mean of all
    assert proving_ground.accounted(winners, LONG, "tpe")[0].name == "pg-tpe-s0"
    with pytest.raises(UsageError, match="--account gp"):
        proving_ground.accounted(winners, LONG, "gp")


def test_the_tables_pair_each_seeds_winners_with_the_baselines_budget_by_budget():
    text = proving_ground.table(made_up_results(), {LONG: "3x the trial budget", SHORT: "1x, the trial budget"})
    references, long, short = text.split("## Under ")
    assert "corruption floor 6.000" in references
    assert long.startswith(f"{LONG} (3x") and short.startswith(f"{SHORT} (1x")
    # the winner is trial 3 under both budgets; the 1x comparison reads its 1x runs
    assert "| pg-tpe-s0 trial 3 vs sized-cpu (hand-designed) | -0.300 ± 0.000 (n=3), outside noise |" in long
    assert "| pg-tpe-s0 trial 3 vs sized-cpu (hand-designed) | +0.567 ± " in short
    for section in (long, short):
        assert "trial 5 vs" not in section and "pg-tpe-s1 trial 2 vs" not in section  # no winners
        comparisons = [line.split(" | ")[0] for line in section.splitlines() if " vs " in line]
        assert comparisons == ["| pg-tpe-s0 trial 3 vs sized-cpu (hand-designed)",
                               "| pg-random-s0 trial 1 vs sized-cpu (hand-designed)",
                               "| pg-tpe-s0 trial 3 vs pg-random-s0 trial 1",  # within a controller seed only
                               "| pg-random-s1 trial 8 vs sized-cpu (hand-designed)"]
    assert "| pg-tpe-s1 trial 2 |" in short and "| pg-tpe-s1 trial 2 |" not in long  # each budget's runs alone
    assert "over the 4 confirmed candidates" in text  # the transfer, over those confirmed long


def dry_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """`benchmarks/proving_ground.py --dry-run`: the stages' commands, each stage's name then its commands."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "proving_ground.py"
    return subprocess.run([sys.executable, str(script), "--data", "d", "--out", str(tmp_path / "pg"), "--dry-run", *flags],
                          capture_output=True, text=True, timeout=300)


def stage_commands(out: str) -> dict[str, list[list[str]]]:
    stages: dict[str, list[list[str]]] = {}
    for line in out.splitlines():
        if line.startswith("  "):
            stages[next(reversed(stages))].append(shlex.split(line))
        elif line.endswith(":"):
            stages[line[:-1]] = []
    return stages


@pytest.mark.slow  # the script imports search.run (torch)
@pytest.mark.subprocess
def test_the_proving_ground_searches_search_runs_default_controller_against_random(tmp_path):
    from search.run import parse_args

    done = dry_run(tmp_path)
    assert done.returncode == 0, done.stderr
    controller = parse_args([]).controller
    searches = {name: commands for name, commands in stage_commands(done.stdout).items() if name.startswith("search-")}
    assert list(searches) == [f"search-pg-{name}-s{seed}" for seed in (0, 1, 2) for name in (controller, "random")]
    assert "(--account best)" in done.stdout and not (tmp_path / "pg").exists()  # a dry run writes nothing
    assert dry_run(tmp_path, "--controller", "tpe", "--account", "tpe").returncode == 0
    refused = dry_run(tmp_path, "--controller", "random")  # the control
    assert refused.returncode == 2 and "--controller" in refused.stderr
    other = next(name for name in ("tpe", "evolution") if name != controller)
    refused = dry_run(tmp_path, "--account", other)  # not a controller of this proving ground
    assert refused.returncode == 2 and "--account: best" in refused.stderr


@pytest.mark.slow  # the script imports search.run (torch)
@pytest.mark.subprocess
def test_the_confirmations_cover_every_study_and_baseline_at_both_budgets_the_long_first(tmp_path):
    done = dry_run(tmp_path, "--controller", "tpe", "--controller-seeds", "0,1", "--baselines", "a-cpu,b-cpu",
                   "--budget", SHORT, "--long-budget", LONG)
    assert done.returncode == 0, done.stderr
    commands = stage_commands(done.stdout)["confirmations"]
    studies = [Study("tpe", 0), Study("random", 0), Study("tpe", 1), Study("random", 1)]
    assert all(command[1:3] == ["-m", "search.confirm"] for command in commands)
    flags = [dict(zip(command[3::2], command[4::2])) for command in commands]
    uri = f"sqlite:///{tmp_path / 'pg' / 'mlflow.db'}"
    assert all(flag["--seeds"] == "3" and flag["--tracking-uri"] == uri for flag in flags)
    seen = [(flag["--budget"], flag["--study"], flag["--top"], flag.get("--baselines")) for flag in flags]
    for budget in (LONG, SHORT):
        assert [entry for entry in seen if entry[0] == budget] == [
            *((budget, study.name, "3", None) for study in studies),
            (budget, "pg-tpe-s0", "0", "a-cpu"), (budget, "pg-tpe-s0", "0", "b-cpu")]  # each baseline alone
    assert [entry[0] for entry in seen] == [LONG] * 6 + [SHORT] * 6


@pytest.mark.subprocess
def test_a_stage_runs_its_commands_jobs_at_a_time_and_once_it_passed(tmp_path, monkeypatch):
    monkeypatch.setattr(stage_runner, "POLL_S", 0.05)
    # Each command says whether another ran beside it, then exits with the code it is given.
    script = ("import pathlib, sys, time; lock = pathlib.Path(sys.argv[1]) / 'running'; beside = lock.exists(); "
              "lock.touch(); time.sleep(0.2); lock.unlink(); print('beside' if beside else 'alone'); "
              "sys.exit(int(sys.argv[2]))")
    command = lambda code: [sys.executable, "-c", script, str(tmp_path), str(code)]
    env = {"PATH": "/usr/bin:/bin"}
    stages = stage_runner.Stages(tmp_path)
    with pytest.raises(stage_runner.StageError, match=r"stage confirm failed \(exit \[0, 3, 0\]\)"):
        stages.run("confirm", [command(0), command(3), command(0)], env, jobs=1)
    # one at a time, and every command although the second failed
    assert [(tmp_path / f"confirm-{i}.log").read_text() for i in range(3)] == ["alone\n"] * 3
    stage_runner.Stages(tmp_path).run("confirm", [command(0)] * 3, env, jobs=1)  # run again: resumed, passes
    assert (tmp_path / "confirm-1.log").read_text() == "alone\nalone\n"
    again = stage_runner.Stages(tmp_path)
    again.run("confirm", [command(3)], env)  # done: skipped, so its failing command never runs
    assert again.started("confirm") and json.loads((tmp_path / "state.json").read_text())["confirm"]["done"]


@pytest.mark.slow  # an MLflow store
def test_the_proving_ground_reads_back_each_budget_apart(tmp_path):
    from search.tracking.tracker import StudyTracker
    from tests.confirm_study import TRAIN, tiny_arch, write_study

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    runs = write_study(uri, "pg-tpe-s0", [(tiny_arch(), "complete", {"validation_loss": 6.0}),
                                          (tiny_arch(position="rotary"), "complete", {"validation_loss": 5.0})])
    tracker = StudyTracker(uri, "pg-tpe-s0")
    for seed in (1, 2):
        for budget, loss in ((LONG, 4.0 + seed / 10), (SHORT, 5.0 + seed / 10)):
            run = tracker.open_confirmation_run(runs[1], 1, seed, seed, tiny_arch(position="rotary"), TRAIN, budget)
            tracker.finish_run(run, "complete", {"validation_loss": loss, "tokens": 100})
            run = tracker.open_baseline_run("sized-cpu", seed, seed, tiny_arch(), TRAIN, budget)
            tracker.finish_run(run, "complete", {"validation_loss": loss + 0.5, "tokens": 100})
    results = proving_ground.read(uri, [Study("tpe", 0)], "pg-tpe-s0")
    [candidate] = results.candidates[Study("tpe", 0)]
    [baseline] = results.baselines
    assert (candidate.name, candidate.trial, candidate.trial_loss) == ("pg-tpe-s0 trial 1", 1, 5.0)
    assert baseline.name == "sized-cpu (hand-designed)"
    assert sorted(candidate.seeds[LONG].index) == [1, 2]
    assert candidate.loss(LONG) == pytest.approx(4.15) and candidate.loss(SHORT) == pytest.approx(5.15)
    assert baseline.loss(LONG) == pytest.approx(4.65) and baseline.loss(SHORT) == pytest.approx(5.65)


@pytest.mark.slow  # an MLflow store
def test_the_path_counts_every_confirmation_and_baseline_run_of_a_ladder(tmp_path):
    from search.tracking.tracker import StudyTracker
    from space.arch import ArchConfig
    from tests.confirm_study import TRAIN, tiny_arch, write_study
    from trainer.config import TrainConfig

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    runs = write_study(uri, "pg-gp-s0", [(tiny_arch(position="rotary"), "complete", {"validation_loss": 5.0})])
    tracker = StudyTracker(uri, "pg-gp-s0")
    for rung, budget in enumerate(("6e12flops", "1.8e13flops")):
        run = tracker.open_confirmation_run(runs[0], 0, 0, 0, tiny_arch(position="rotary"), TRAIN, budget)
        tracker.finish_run(run, "complete", {"validation_loss": 4.0, "tokens": 1000 * (rung + 1)}, tags={"rung": rung})
        run = tracker.open_baseline_run("sized-cpu", 0, 0, tiny_arch(), TRAIN, budget)
        tracker.finish_run(run, "complete", {"validation_loss": 4.5, "tokens": 2000}, tags={"rung": rung})
    failed = tracker.open_baseline_run("sized-cpu", 1, 1, tiny_arch(), TRAIN, "6e12flops")
    tracker.finish_run(failed, "failed", reason="boom")  # no tokens: nothing spent that counts
    rate = TrainConfig.from_dict(TRAIN).mlm_rate
    per_token = {name: a.flops_per_token(a.max_seq_len, rate)
                 for name, a in (("candidate", ArchConfig.from_dict(tiny_arch(position="rotary"))),
                                 ("sized-cpu", ArchConfig.from_dict(tiny_arch())))}
    spent = (1000 + 2000) * per_token["candidate"] + 2 * 2000 * per_token["sized-cpu"]
    assert accounting.path_compute(uri, "pg-gp-s0") == {"flops": pytest.approx(spent), "runs": 4}


@pytest.mark.slow  # an MLflow store
def test_a_wrong_tracking_store_is_one_line_before_any_cram(tmp_path):
    import subprocess

    from tests.confirm_study import tiny_arch, write_study

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "accounting.py"
    missing = tmp_path / "none.db"
    base = [sys.executable, str(script), "--data", str(tmp_path), "--study", "s", "--storage", f"sqlite:///{tmp_path}/o.db"]
    done = subprocess.run(base + ["--tracking-uri", f"sqlite:///{missing}"], capture_output=True, text=True, cwd=script.parent)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"--tracking-uri: {missing} does not exist")
    assert not missing.exists()  # no empty store left behind

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    write_study(uri, "other", [(tiny_arch(), "complete", {"validation_loss": 5.0})])
    done = subprocess.run(base + ["--tracking-uri", uri], capture_output=True, text=True, cwd=script.parent)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--tracking-uri: MLflow at" in done.stderr and "no experiment 's'" in done.stderr
