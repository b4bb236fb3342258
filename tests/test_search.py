"""`python -m search.run` end to end on CPU: real (tiny) trials on Ray, both stores checked.

Trials cram a tiny space on the Wikipedia slice for 2e4 tokens; most studies skip the GLUE probe
(objective mlm) to stay fast, one runs it. After every study the Optuna study and MLflow must
agree run for run, with no run left RUNNING.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from search.run import main
from search.tracking import trial_runs
from tests.conftest import requires_shared_data

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "search_files" / "tiny_profile.yaml"

pytestmark = requires_shared_data


@pytest.fixture(autouse=True)
def loopback_ray(monkeypatch):
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def study_args(tmp_path: Path, data: Path, study: str, *extra: str) -> list[str]:
    return ["--profile", str(PROFILE), "--data", str(data), "--study", study, "--seed", "1",
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "cache"), *extra]


def check_stores_agree(tmp_path: Path, study_name: str, trials: int) -> tuple[optuna.Study, list[dict]]:
    """Counts are exact, every counted Optuna trial has exactly one finished MLflow run."""
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path}/optuna.db")
    counted = [t for t in study.trials if "infeasible" not in t.user_attrs]
    assert len(counted) == trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in counted)
    runs = trial_runs(study_name, f"sqlite:///{tmp_path}/mlflow.db").to_dict("records")
    assert sorted(int(r["trial"]) for r in runs) == sorted(t.number for t in counted)  # one run each
    # KILLED for a failed trial: a run the driver's death cut short (see search.study.reconcile).
    status = {TrialState.COMPLETE: {"FINISHED"}, TrialState.PRUNED: {"KILLED"}, TrialState.FAIL: {"FAILED", "KILLED"}}
    by_trial = {int(r["trial"]): r for r in runs}
    for trial in counted:
        assert by_trial[trial.number]["status"] in status[trial.state], trial.number
    return study, runs


@pytest.mark.parametrize("controller", ["tpe", "random", "nsga2", "cmaes", "gp", "evolution"])
def test_each_controller_runs_a_study_end_to_end(controller, wiki_slice_dir, tmp_path):
    name = f"e2e-{controller}"
    code = main(study_args(tmp_path, wiki_slice_dir, name, "--trials", "5", "--controller", controller,
                           "--objective", "mlm", "--no-probe", "--no-early-stop"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, name, 5)
    completed = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(completed) == 5
    for run in runs:
        assert run["params.arch.layers"] in ("1", "2") and run["params.budget"] == "2e4tokens"
        assert float(run["metrics.validation_loss"]) > 0 and float(run["metrics.tokens"]) == 19968  # 2e4 in whole 64-token rows
        assert run["tags.cramnas.controller"] == controller


def test_evolution_records_lineage_in_mlflow(wiki_slice_dir, tmp_path, monkeypatch):
    from search import controllers

    small = lambda space, seed: controllers.RegularizedEvolutionSampler(space, 3, 2, seed)  # noqa: E731
    monkeypatch.setitem(controllers.CONTROLLERS, "evolution", controllers.Controller(small, False))
    code = main(study_args(tmp_path, wiki_slice_dir, "lineage", "--trials", "7", "--controller", "evolution",
                           "--objective", "mlm", "--no-probe", "--no-early-stop"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, "lineage", 7)
    run_of = {int(r["trial"]): r["run_id"] for r in runs}
    children = [r for r in runs if isinstance(r.get("tags.cramnas.parent_trial"), str)]
    assert children, "evolution after its initial population must breed children"
    for child in children:
        parent = int(child["tags.cramnas.parent_trial"])
        assert child["tags.cramnas.parent_run_id"] == run_of[parent]
        assert " -> " in child["tags.cramnas.mutation"]
        assert int(child["tags.cramnas.generation"]) >= 1


def test_probe_objective_and_failures_cost_only_their_trial(wiki_slice_dir, tmp_path, monkeypatch):
    """The GLUE probe runs in trials; an injected exception and a NaN loss fail their trials only,
    with their reasons in both stores."""
    monkeypatch.setenv("CRAMNAS_INJECT_FAULT", "exception@1;nan@2")
    code = main(study_args(tmp_path, wiki_slice_dir, "faults", "--trials", "4", "--controller", "random",
                           "--no-early-stop"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, "faults", 4)
    failed = {t.number: t.user_attrs["failure_reason"] for t in study.trials if t.state == TrialState.FAIL}
    assert set(failed) == {1, 2}
    assert "injected fault in trial 1" in failed[1] and "NonFiniteLoss" in failed[2]
    by_trial = {int(r["trial"]): r for r in runs}
    assert "injected fault" in by_trial[1]["tags.cramnas.failure_reason"]
    assert by_trial[2]["tags.cramnas.status"] == "failed"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    result = json.loads(Path(client.download_artifacts(by_trial[0]["run_id"], "result.json", str(tmp_path))).read_text())
    assert result["cram"]["tokens"] == 19968 and result["probe"]["tasks"] == ["rte", "stsb"]
    for trial in (0, 3):
        assert 0 <= study.trials[trial].values[0] <= 1  # the probe average
        assert 0 <= float(by_trial[trial]["metrics.glue.rte.accuracy"]) <= 1
        assert -1 <= float(by_trial[trial]["metrics.glue.stsb.spearman"]) <= 1


def test_killed_worker_fails_only_its_trial(wiki_slice_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CRAMNAS_INJECT_FAULT", "kill@1")  # SIGKILL of trial 1's worker process
    code = main(study_args(tmp_path, wiki_slice_dir, "killed-worker", "--trials", "3", "--controller", "random",
                           "--objective", "mlm", "--no-probe", "--no-early-stop", "--max-concurrent", "1"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, "killed-worker", 3)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert "worker died" in study.trials[1].user_attrs["failure_reason"]
    assert {int(r["trial"]): r["status"] for r in runs}[1] == "FAILED"


def test_repeated_architecture_is_not_trained_again(wiki_slice_dir, tmp_path):
    space = yaml.safe_load((PROFILE.parent / "tiny_space.yaml").read_text())
    space["params"] = {"qkv_bias": {"choice": [False]}}  # a space of one point: every later trial repeats it
    space["fixed"].update(layers=1, hidden=32, heads=2)
    space_file = tmp_path / "one_point.yaml"
    space_file.write_text(yaml.safe_dump(space))
    code = main(study_args(tmp_path, wiki_slice_dir, "repeats", "--trials", "3", "--controller", "random",
                           "--space", str(space_file), "--objective", "mlm", "--no-probe", "--max-concurrent", "1"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, "repeats", 3)
    by_trial = {int(r["trial"]): r for r in runs}
    assert [t.user_attrs.get("repeat_of") for t in study.trials] == [None, 0, 0]
    assert all(t.values == study.trials[0].values for t in study.trials)  # the recorded result, told again
    assert [by_trial[n]["tags.cramnas.status"] for n in range(3)] == ["complete", "repeat", "repeat"]
    assert by_trial[1]["tags.cramnas.repeat_of"] == "0"


def test_export_round_trips_into_trainer_cram(wiki_slice_dir, tmp_path):
    from search.export import main as export_main
    from trainer.cram import main as cram_main

    assert main(study_args(tmp_path, wiki_slice_dir, "export", "--trials", "3", "--controller", "random",
                           "--objective", "mlm", "--no-probe", "--no-early-stop")) == 0
    out = ROOT / "trainer" / "configs" / "test-export-best.yaml"
    try:
        assert export_main(["--study", "export", "--rank-by", "mlm", "--out", str(out),
                            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
        exported = yaml.safe_load(out.read_text())
        study = optuna.load_study(study_name="export", storage=f"sqlite:///{tmp_path}/optuna.db")
        best = min((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0])
        assert exported["arch"] == best.user_attrs["arch"]
        assert exported["provenance"]["trial"] == best.number and exported["provenance"]["study"] == "export"
        assert cram_main(["--config", str(out), "--budget", "3e3tokens", "--data", str(wiki_slice_dir),
                          "--out", str(tmp_path / "final"), "--cache-dir", str(tmp_path / "cache")]) == 0
        assert (tmp_path / "final" / "model.safetensors").is_file()
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.parametrize("extra,expected", [
    (["--objective", "probe+throughput", "--controller", "evolution"], "--objective probe+throughput"),
    (["--resume"], "--resume"),
    (["--trials", "0"], "--trials"),
    (["--budget", "5 fortnights"], "budget"),
    (["--space", "missing.yaml"], "missing.yaml"),
    (["--no-probe"], "--no-probe"),
    (["--max-concurrent", "0"], "--max-concurrent"),
])
def test_bad_input_fails_in_one_line_before_any_trial(extra, expected, wiki_slice_dir, tmp_path, capsys):
    args = study_args(tmp_path, wiki_slice_dir, "bad", *extra)
    if "--resume" in extra:
        args = [a for a in args if a not in ("--study", "bad")]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and expected in err[0], err


def test_resume_of_unknown_study_and_existing_study_without_resume(wiki_slice_dir, tmp_path, capsys):
    assert main(study_args(tmp_path, wiki_slice_dir, "nobody", "--resume")) == 2
    assert "not found" in capsys.readouterr().err
    assert main(study_args(tmp_path, wiki_slice_dir, "once", "--trials", "1", "--objective", "mlm",
                           "--no-probe")) == 0
    assert main(study_args(tmp_path, wiki_slice_dir, "once", "--trials", "1", "--objective", "mlm",
                           "--no-probe")) == 2
    assert "--resume" in capsys.readouterr().err


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and everything in its session (its local Ray processes)."""
    sid = os.getsid(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_driver_killed_mid_study_resumes_to_the_exact_total(wiki_slice_dir, tmp_path):
    args = study_args(tmp_path, wiki_slice_dir, "killed", "--trials", "8", "--controller", "tpe",
                      "--objective", "mlm", "--no-probe", "--no-early-stop")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:  # kill once some trials are done and others running
            time.sleep(0.5)
            try:
                study = optuna.load_study(study_name="killed", storage=storage)
            except (KeyError, Exception):  # noqa: BLE001 - not created yet
                continue
            if len(study.get_trials(states=(TrialState.COMPLETE,))) >= 3:
                break
        else:
            pytest.fail("the study made no progress")
    finally:
        _kill_session(proc)
    before = optuna.load_study(study_name="killed", storage=storage)
    finished = len([t for t in before.trials if t.state.is_finished()])
    assert finished < 8
    assert main([*args, "--resume"]) == 0
    study, runs = check_stores_agree(tmp_path, "killed", 8)
    assert all(r["status"] != "RUNNING" for r in runs)
    died = [t.number for t in study.trials if t.user_attrs.get("failure_reason") == "driver died"]
    assert all(r["status"] == "KILLED" for r in runs if int(r["trial"]) in died)
    assert all(t.user_attrs.get("failure_reason") == "driver died" for t in study.trials if t.state == TrialState.FAIL)


def test_study_joins_an_existing_ray_cluster(wiki_slice_dir, tmp_path):
    """`--address` joins a running head (on loopback here) instead of starting Ray; stopped by its PID."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_bin = Path(sys.executable).with_name("ray")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats", "--block"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = main(study_args(tmp_path, wiki_slice_dir, "cluster", "--trials", "2", "--controller", "random",
                               "--objective", "mlm", "--no-probe", "--address", f"127.0.0.1:{port}"))
        assert code == 0
        check_stores_agree(tmp_path, "cluster", 2)
    finally:
        head.terminate()
        head.wait(timeout=30)
