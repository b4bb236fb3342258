"""What a study costs before it starts (issue 20 §5): `search.study.estimate`'s arithmetic, the
`--estimate` flag end to end, the CPUs a GPU trial gets from its node, and the Inductor settings a
trial compiles with (§3). Issue 39 §5: the estimate prices what will run (early stopping as the
session applies it, no more trials at once than there are trials, refs budgets) in seconds when
short, and says what it assumed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml

from search.study.estimate import (
    Costs,
    asha_rungs,
    asha_shares,
    device_time,
    estimate,
    ladder_hours,
    progress_reports,
    study_estimate,
)
from search.study.resources import auto_cpus_per_trial
from search.study.trial import compile_env, use_compile_env
from space.errors import UsageError
from tests.helpers import ROOT, SHARED_DATA, cli_env, requires_shared_data
from trainer.budget import Budget

COSTS = Costs(startup_s=20, compile_s=20, probe_task_s=15, tokens_per_s=5e5, flops_per_s=4.8e10)


@pytest.mark.parametrize(("grace", "factor", "max_t"), [(4, 2, 17), (2, 3, 17), (1, 2, 9), (4, 3, 33), (3, 4, 17)])
def test_rungs_are_the_ones_ray_builds(grace, factor, max_t):
    from ray.tune.schedulers.async_hyperband import _Bracket

    ray_rungs = sorted(milestone for milestone, _ in _Bracket(grace, max_t, factor, 0)._rungs)
    assert asha_rungs(grace, factor, max_t) == ray_rungs


def test_progress_reports_follow_report_every():
    assert progress_reports(1 / 16) == 16
    assert progress_reports(0.25) == 4
    assert progress_reports(0.3) == 4  # .3, .6, .9 and the end


def test_asha_shares_of_the_old_and_the_new_gpu_rungs():
    # 4/16, 8/16, 16/16 halving: all train a quarter, half go on to a half, a quarter to the end;
    # the rung at the last report stops half of those after their training, before their probe.
    assert asha_shares([4, 8, 16], 16, 2) == pytest.approx((0.25 + 0.5 * 0.25 + 0.25 * 0.5, 1 / 8))
    # 2/16 and 6/16 keeping a third: 2/16 + 4/16 / 3 + 10/16 / 9.
    assert asha_shares([2, 6], 16, 3) == pytest.approx((2 / 16 + 4 / 48 + 10 / 144, 1 / 9))
    assert asha_shares([2, 6, 18], 16, 3) == asha_shares([2, 6], 16, 3)  # a rung past the end stops nothing


def study(**changes):
    settings = dict(trials=200, budget=Budget.parse("5m"), costs=COSTS, compile_model=True, report_every=1 / 16,
                    early_stop={"grace_reports": 2, "reduction_factor": 3}, probe_tasks=5,
                    probe_seconds_per_task=60.0, resources={"cpu": 8, "gpu": 1}, concurrent=1, name="gpu.yaml")
    return estimate(**{**settings, **changes})


def test_a_gpu_study_costs_its_trials_device_seconds():
    trained, probed = asha_shares([2, 6], 16, 3)
    per_trial = 20 + 20 + trained * 300 + probed * 5 * (60 + 15)
    result = study()
    assert result.device_hours == pytest.approx(200 * per_trial / 3600)
    assert result.probed == pytest.approx(200 / 9)
    assert result.line() == f"estimate: 200 trials, {200 * per_trial / 3600:.1f} GPU-hours " \
                            f"({200 * per_trial / 3600:.1f} hours on 1 GPU), 22 trials probed"


def test_eight_gpus_divide_the_hours_not_the_gpu_hours():
    one, eight = study(), study(concurrent=8)
    assert eight.device_hours == one.device_hours and eight.wall_hours == pytest.approx(one.device_hours / 8)
    assert "on 8 GPUs" in eight.line()


def test_without_asha_compile_or_probe():
    result = study(early_stop=None, compile_model=False, probe_tasks=0)
    assert result.device_hours == pytest.approx(200 * (20 + 300) / 3600) and result.probed == 0


def test_a_cpu_study_counts_cpu_hours_and_prices_flops_at_the_recorded_speed():
    result = study(budget=Budget.parse("1e13flops"), compile_model=False, resources={"cpu": 1, "gpu": 0}, concurrent=2,
                   early_stop={"grace_reports": 4, "reduction_factor": 2}, probe_tasks=3, probe_seconds_per_task=5.0)
    # search.study.ray_executor.early_stopping's rungs: 4 and 8 of the 15 progress reports (max_t 15.5), none at the
    # end, so the quarter that trains to the end is all probed: 4/16 + 4/16 / 2 + 8/16 / 4 trained.
    trained, probed = asha_shares([4, 8], 16, 2)
    assert (trained, probed) == pytest.approx((0.5, 1 / 4))
    per_trial = 20 + trained * 1e13 / 4.8e10 + probed * 3 * (5 + 15)
    assert result.kind == "CPU" and result.device_hours == pytest.approx(200 * per_trial / 3600)
    assert result.wall_hours == pytest.approx(result.device_hours / 2)


def test_a_token_budget_without_a_recorded_speed_names_the_cost_to_add():
    with pytest.raises(UsageError, match=r"costs\.tokens_per_s in gpu\.yaml"):
        study(budget=Budget.parse("2e8tokens"), costs=Costs(20, 20, 15))


@pytest.mark.parametrize(("costs", "message"), [
    (None, "gpu.yaml has no costs section"),
    ({"startup_s": 1, "compile_s": 1}, "costs lacks probe_task_s"),
    ({"startup_s": 1, "compile_s": 1, "probe_task_s": 1, "tokens_per_s": "5e5"}, r"write 5\.0e\+5"),
    ({"startup_s": 1, "compile_s": 1, "probe_task_s": 1, "speed": 3}, "costs.speed is not a cost"),
])
def test_a_bad_costs_section_is_one_line_naming_the_key(costs, message):
    with pytest.raises(UsageError, match=message):
        Costs.from_profile({} if costs is None else {"costs": costs}, "gpu.yaml")


@pytest.mark.parametrize(("cpus", "gpus", "per_trial", "expected"), [
    (32, 1, 1, 8),    # one H200 on 32 vCPUs: the cap
    (48, 8, 1, 6),    # 6 per GPU: all eight GPUs busy, not five
    (16, 8, 1, 2),
    (4, 8, 1, 1),     # fewer CPUs than GPUs: at least one
    (16, 1, 0.5, 8),  # two trials on the GPU: 8 each
    (2, 0, 1, 2),     # no GPU here (an estimate on a laptop): what there is, capped
])
def test_auto_cpus_per_trial_shares_the_node_between_its_gpus(cpus, gpus, per_trial, expected):
    assert auto_cpus_per_trial(cpus, gpus, per_trial) == expected


def test_auto_cpus_come_from_this_machine_or_from_the_cluster_once_ray_is_up(monkeypatch, tmp_path):
    import search.run as run

    monkeypatch.setattr(run, "local_gpus", lambda: 4)
    monkeypatch.setattr("os.cpu_count", lambda: 24)
    assert run.check_inputs(run.parse_args(["--profile", "gpu"])).resources == {"cpu": 6, "gpu": 1}
    assert run.check_inputs(run.parse_args(["--profile", "gpu", "--address", "auto"])).resources["cpu"] is None
    profile = tmp_path / "eight.yaml"
    profile.write_text((ROOT / "search" / "profiles" / "gpu.yaml").read_text().replace("cpus_per_trial: auto",
                                                                                      "cpus_per_trial: eight"))
    with pytest.raises(UsageError, match=r"eight\.yaml: resources\.cpus_per_trial must be a number of at least 0 or auto"):
        run.check_inputs(run.parse_args(["--profile", str(profile)]))


def test_a_trial_compiles_with_its_cpus_and_the_nodes_shared_cache(tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config

    env = compile_env(8.0, str(tmp_path))
    assert env == {"TORCHINDUCTOR_COMPILE_THREADS": "8", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    monkeypatch.setenv("CRAMNAS_CACHE", str(tmp_path / "root"))
    assert compile_env(None, None) == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "root" / "inductor")}
    monkeypatch.setattr(inductor_config, "compile_threads", 32)
    for name in env:  # restored after the test: use_compile_env writes os.environ
        monkeypatch.setenv(name, "before")
    use_compile_env(compile_env(3, str(tmp_path)))
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert inductor_config.compile_threads == 3 and cache_dir() == str(tmp_path / "inductor")


def run_estimate(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search.run", "--trials", "200", "--estimate", *flags],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=600)


@requires_shared_data
@pytest.mark.slow
@pytest.mark.subprocess
def test_estimate_prints_the_cost_and_what_it_assumed_and_starts_nothing(tmp_path):
    done = run_estimate("--profile", "gpu", "--data", str(SHARED_DATA), "--max-concurrent", "4", "--early-stop",
                        "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("estimate: 200 trials, ")
    assert "GPU-hours" in lines[0] and "on 4 GPUs" in lines[0]
    assert lines[1].startswith("assumed: profile gpu.yaml; budget 5m a trial; early stopping on (ASHA") and \
        lines[1].endswith("; controller gp; 4 trials at once, 1 GPU each")
    hours = float(lines[0].split(", ")[1].split()[0])
    assert hours <= 10.0  # with early stopping the GPU profile's study fits 10 H200-hours (issue 20 §5)
    assert list(tmp_path.iterdir()) == []  # no store opened, no data prepared
    bad = run_estimate("--profile", "gpu", "--data", str(SHARED_DATA), "--budget", "5 minutes")
    assert bad.returncode == 2 and bad.stderr.startswith("error: budget: ") and bad.stdout == ""
    path = run_estimate("--profile", "gpu", "--data", str(SHARED_DATA), "--target", "30x")
    assert path.returncode == 0, path.stderr
    study_hours, rest = path.stdout.split(", ", 2)[1], path.stdout.split("; then the ladder ")[1]
    assert "(30x)" in rest and "5+1+1 candidates and 3 baselines, 3 seeds each" in rest
    ladder, whole = (float(part.split(" GPU-hours")[0].split()[-1]) for part in rest.split("; the whole path "))
    assert whole == pytest.approx(float(study_hours.split()[0]) + ladder, abs=0.11)
    wrong = run_estimate("--profile", "gpu", "--data", str(SHARED_DATA), "--ladder", "3x,2x")
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: --ladder: rungs must rise")
    refs = run_estimate("--profile", "cpu", "--data", str(SHARED_DATA), "--budget", "180refs")
    assert refs.returncode == 0 and refs.stderr == "", refs.stderr  # a traceback (KeyError: 'refs') before
    # Screened by default at 200 trials: the screen at a quarter of 180refs, its best eighth at 180refs.
    screen, promotion = refs.stdout.split("\npromotion, study ")
    assert screen.startswith("screen, study ") and "\nestimate: 200 trials, " in screen
    assert "assumed: profile cpu.yaml; budget 45refs a trial = " in screen
    assert "\nestimate: 25 trials, " in promotion and "assumed: profile cpu.yaml; budget 180refs a trial = " in promotion
    no_speed = run_estimate("--profile", "gpu", "--data", str(SHARED_DATA), "--budget", "180refs")
    assert no_speed.returncode == 2 and no_speed.stdout == ""
    assert no_speed.stderr.startswith("error: --estimate: a budget in refs needs costs.flops_per_s in gpu.yaml")


def test_a_ladder_costs_each_rungs_climbers_and_baselines_with_every_seed():
    from search.analysis.ladder import Ladder

    ladder = Ladder(Budget.parse("1e12flops"), (Budget.parse("3e12flops"), Budget.parse("9e12flops")), eta=3)
    hours = ladder_hours(ladder, candidates=6, baselines=2, seeds=3, costs=COSTS, name="cpu.yaml", probe_s=5.0,
                         devices_per_run=1)
    # rung 0: (6 + 2) x 3 runs of 20 + 62.5 + 5 s; rung 1: (2 + 2) x 3 runs of 20 + 187.5 + 5 s
    assert hours == pytest.approx((24 * (20 + 3e12 / 4.8e10 + 5) + 12 * (20 + 9e12 / 4.8e10 + 5)) / 3600)
    line = dataclasses.replace(study(), ladder="3e12flops (3x), 9e12flops (9x)", ladder_hours=hours).line()
    assert line.endswith(f"the whole path {study().device_hours + hours:.1f} GPU-hours")


def test_a_short_study_reads_in_minutes_and_one_trial_is_singular():
    one = study(trials=1, budget=Budget.parse("60s"), early_stop=None, compile_model=False, probe_tasks=0,
                resources={"cpu": 1, "gpu": 0}, concurrent=2)
    # 20 s of start-up and 60 s of training: 80 s = 1.3 minutes, on the one CPU its one trial runs on
    assert one.line() == "estimate: 1 trial, 1.3 CPU-minutes (1.3 minutes on 1 CPU), 0 trials probed"
    assert "0.0" not in study(trials=2, budget=Budget.parse("60s")).line()


def test_a_study_under_a_minute_reads_in_seconds():
    # 20 s of start-up and 10 s of training: 30 s, not "0.5 minutes"
    short = study(trials=1, budget=Budget.parse("10s"), early_stop=None, compile_model=False, probe_tasks=0,
                  resources={"cpu": 1, "gpu": 0})
    assert short.line() == "estimate: 1 trial, 30 CPU-seconds (30 seconds on 1 CPU), 0 trials probed"
    assert device_time(1 / 3600) == "1 second" and device_time(59 / 3600, "GPU") == "59 GPU-seconds"
    assert device_time(1.5 / 60) == "1.5 minutes" and device_time(1.5) == "1.5 hours"


def cpu_study(monkeypatch, trials: int, *flags: str, cpus: int = 2):
    """`search.run --profile cpu --trials N --estimate FLAGS` priced in-process on a machine of `cpus` CPUs."""
    import search.run as run

    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    args = run.parse_args(["--profile", "cpu", "--trials", str(trials), "--estimate", *flags])
    return study_estimate(run.check_inputs(args), trials, args.max_concurrent, args.controller)


def test_early_stopping_is_priced_only_where_the_session_applies_it(monkeypatch):
    from search.run import ASHA_MIN_TRIALS

    few, enough = ASHA_MIN_TRIALS - 1, ASHA_MIN_TRIALS
    # Below min_trials the study runs without ASHA (search.study.driver.early_stop_for_session): so is it priced.
    asked, without = cpu_study(monkeypatch, few, "--early-stop"), cpu_study(monkeypatch, few, "--no-early-stop")
    assert asked.device_hours == pytest.approx(without.device_hours) and asked.probed == without.probed == few
    assert f"early stopping off ({few} trials are too few: ASHA from {ASHA_MIN_TRIALS} trials)" in asked.assumed
    # From min_trials on, ASHA stops trials: fewer hours, and only the trials that finish are probed.
    asked, without = cpu_study(monkeypatch, enough, "--early-stop"), cpu_study(monkeypatch, enough, "--no-early-stop")
    assert asked.device_hours < 0.8 * without.device_hours and asked.probed < without.probed == enough
    assert "early stopping on (ASHA: rungs from progress report 2, each keeping 1/2)" in asked.assumed
    # Off by default (the profile's early_stop.by_default), and the line says so; so in the profile's
    # default screen, which crams every trial whole.
    unscreened = cpu_study(monkeypatch, enough, "--screen", "1")
    assert unscreened.device_hours == pytest.approx(without.device_hours)
    assert "early stopping off (the profile's default; --early-stop turns it on)" in unscreened.assumed
    assert "early stopping off (a screened study, --screen 4: " in cpu_study(monkeypatch, enough).assumed


@pytest.mark.parametrize(("trials", "cpus", "at_once"), [(1, 2, 1), (3, 4, 3), (8, 4, 4), (8, 2, 2)])
def test_no_more_trials_run_at_once_than_there_are_trials(monkeypatch, trials, cpus, at_once):
    result = cpu_study(monkeypatch, trials, "--budget", "2e12flops", cpus=cpus)
    assert result.at_once == at_once and result.wall_hours == pytest.approx(result.device_hours / at_once)
    assert f"on {at_once} CPU{'s' if at_once > 1 else ''})" in result.line()
    assert result.assumed.endswith("1 trial at a time, 1 CPU each" if at_once == 1 else
                                   f"{at_once} trials at once, 1 CPU each")


def test_a_refs_budget_is_priced_at_the_flops_it_resolves_to_over_the_space(monkeypatch):
    import random

    import search.run as run
    from space import load_space

    refs = cpu_study(monkeypatch, 8, "--budget", "180refs")
    # What 180 reference-core seconds are for architectures of the CPU space, one by one.
    args = run.parse_args(["--profile", "cpu"])
    checked = run.check_inputs(args)
    space, rng = load_space(checked.space_path), random.Random(1)
    flops = [Budget.parse("180refs").resolve(space.sample_random(rng), checked.train.mlm_rate).amount
             for _ in range(200)]
    assert min(flops) < 0.7 * max(flops)  # FLOPs differ by architecture: no one FLOP budget stands for it
    lowest, highest = (cpu_study(monkeypatch, 8, "--budget", f"{amount:.6e}flops") for amount in (min(flops), max(flops)))
    assert lowest.device_hours < refs.device_hours < highest.device_hours
    mean = cpu_study(monkeypatch, 8, "--budget", f"{sum(flops) / len(flops):.6e}flops")
    assert refs.device_hours == pytest.approx(mean.device_hours, rel=0.1)  # another 200 draws: near, not equal
    assert "budget 180refs a trial = " in refs.assumed and "FLOPs on average over the space = " in refs.assumed
    # Without a space (search.confirm's runs) or a recorded FLOP speed: one line, not a KeyError.
    with pytest.raises(UsageError, match=r"^--estimate: 180refs is reference-core seconds"):
        COSTS.train_seconds(Budget.parse("180refs"), "cpu.yaml")
    with pytest.raises(UsageError, match=r"needs costs\.flops_per_s in gpu\.yaml"):
        dataclasses.replace(COSTS, flops_per_s=None, reference_flops_per_s=4e10).train_seconds(Budget.parse("180refs"),
                                                                                              "gpu.yaml")


def test_the_estimate_says_what_it_assumed(monkeypatch):
    result = cpu_study(monkeypatch, 8, "--budget", "2e12flops", "--controller", "tpe")
    speed = yaml.safe_load((ROOT / "search" / "profiles" / "cpu.yaml").read_text())["costs"]["flops_per_s"]
    lines = result.text().splitlines()
    assert lines == [result.line(), f"assumed: {result.assumed}"]
    assert lines[1] == (f"assumed: profile cpu.yaml; budget 2e12flops a trial = {2e12 / speed:.0f} s of training at "
                        f"{speed:.1e} FLOP/s; early stopping off (the profile's default; --early-stop turns it on); "
                        "controller tpe; 2 trials at once, 1 CPU each").replace("e+", "e")
