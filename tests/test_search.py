"""`python -m search.run` end to end on CPU: real (tiny) trials on Ray (and, where marked, on the
local executor), both stores checked.

Trials cram a tiny space on the Wikipedia slice for 2e4 tokens; these studies skip the GLUE probe
(objective mlm) to stay fast (the fault-injection study in tests/reliability/ runs it). After every
study the Optuna study and MLflow must agree run for run, with no run left RUNNING. Faults (failed,
killed and out-of-memory trials, a killed driver, a tracking server restart, a full disk) are
tests/reliability/'s.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from optuna.trial import TrialState

from search.run import main
from tests.helpers import cli_env, free_port, requires_shared_data
from tests.studies import PROFILE, ROOT, check_stores_agree, study_args

pytestmark = [requires_shared_data, pytest.mark.slow]  # real studies on Ray, each with new stores


@pytest.fixture
def args(wiki_slice_dir, slice_cache, tmp_path):
    """`search.run` arguments for a study of the tiny profile on the slice, its stores in `tmp_path`;
    it reads the slice from the shared token cache rather than preparing it again."""
    return lambda name, *extra: study_args(tmp_path, wiki_slice_dir, name, *extra, cache_dir=slice_cache)


@pytest.mark.parametrize("controller", ["tpe", "random", "nsga2", "cmaes", "gp", "evolution"])
def test_each_controller_runs_a_study_end_to_end(controller, args, tmp_path):
    name = f"e2e-{controller}"
    code = main(args(name, "--trials", "5", "--controller", controller, "--objective", "mlm", "--no-probe", "--no-early-stop"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, name, 5)
    completed = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(completed) == 5
    for run in runs:
        assert run["params.arch.layers"] in ("1", "2") and run["params.budget"] == "2e4tokens"
        assert float(run["metrics.validation_loss"]) > 0 and float(run["metrics.tokens"]) == 19968  # 2e4 in whole 64-token rows
        assert run["tags.cramnas.controller"] == controller


def test_evolution_records_lineage_in_mlflow(args, tmp_path, monkeypatch):
    from search.study import controllers

    small = lambda space, seed, startup: controllers.RegularizedEvolutionSampler(space, 3, 2, seed)
    monkeypatch.setitem(controllers.CONTROLLERS, "evolution", controllers.Controller(small, False))
    code = main(args("lineage", "--trials", "7", "--controller", "evolution",
                     "--objective", "mlm", "--no-probe", "--no-early-stop"))
    assert code == 0
    _, runs = check_stores_agree(tmp_path, "lineage", 7)
    run_of = {int(r["trial"]): r["run_id"] for r in runs}
    children = [r for r in runs if isinstance(r.get("tags.cramnas.parent_trial"), str)]
    assert children, "evolution after its initial population must breed children"
    for child in children:
        parent = int(child["tags.cramnas.parent_trial"])
        assert child["tags.cramnas.parent_run_id"] == run_of[parent]
        assert " -> " in child["tags.cramnas.mutation"]
        assert int(child["tags.cramnas.generation"]) >= 1


def test_repeated_architecture_is_not_trained_again(args, tmp_path):
    space = yaml.safe_load((PROFILE.parent / "tiny_space.yaml").read_text())
    space["params"] = {"qkv_bias": {"choice": [False]}}  # a space of one point: every later trial repeats it
    space["fixed"].update(layers=1, hidden=32, heads=2)
    space_file = tmp_path / "one_point.yaml"
    space_file.write_text(yaml.safe_dump(space))
    code = main(args("repeats", "--trials", "3", "--controller", "random",
                     "--space", str(space_file), "--objective", "mlm", "--no-probe", "--max-concurrent", "1"))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, "repeats", 3)
    by_trial = {int(r["trial"]): r for r in runs}
    assert [t.user_attrs.get("repeat_of") for t in study.trials] == [None, 0, 0]
    assert all(t.values == study.trials[0].values for t in study.trials)  # the recorded result, told again
    assert [by_trial[n]["tags.cramnas.state"] for n in range(3)] == ["complete", "repeat", "repeat"]
    assert by_trial[1]["tags.cramnas.repeat_of"] == "0"


@pytest.mark.parametrize("executor", ["ray", "local"])
def test_asha_stops_trials_behind_on_their_train_loss(executor, args, tmp_path):
    """One trial at a time, so each meets the rungs of those before it: ASHA (on in the tiny profile)
    stops the ones whose train loss is behind, and both stores say so."""
    assert main(args("asha", "--trials", "6", "--controller", "random", "--objective", "mlm", "--no-probe",
                     "--max-concurrent", "1", "--executor", executor)) == 0
    study, runs = check_stores_agree(tmp_path, "asha", 6)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert pruned, "ASHA stopped no trial: does it see the progress reports' train_loss?"
    by_trial = {int(r["trial"]): r for r in runs}
    for trial in pruned:
        assert trial.user_attrs["failure_reason"].startswith("stopped early by ASHA after")
        # Stopped at a rung (reports 4 and 8 of the tiny profile's 15), the report that stopped it counted.
        assert len(trial.user_attrs["intermediate"]) in (4, 8)
        assert trial.user_attrs["failure_reason"].endswith(f"after {len(trial.user_attrs['intermediate'])} of its reports")
        # FINISHED, not a failure's red cross in the MLflow UI; its last reported loss is its last metric.
        assert by_trial[trial.number]["status"] == "FINISHED" and by_trial[trial.number]["tags.cramnas.state"] == "pruned"
        assert by_trial[trial.number]["metrics.train_loss"] == trial.user_attrs["intermediate"][-1][1]


def test_export_round_trips_into_trainer_cram(args, wiki_slice_dir, slice_cache, tmp_path, capsys):
    from search.export import main as export_main
    from trainer.cram import main as cram_main

    assert main(args("export", "--trials", "3", "--controller", "random", "--objective", "mlm", "--no-probe",
                     "--no-early-stop")) == 0
    # The search ends naming what comes next, with its own --data (the data as the study recorded it).
    data = f"--data {shlex.quote(str(Path(wiki_slice_dir).resolve()))}"
    steps = capsys.readouterr().out.split("next steps:")[-1]
    assert "python -m dashboards.report --study export" in steps and "python -m dashboards.ui --study export" in steps
    assert f"python -m search.confirm --study export --tracking-uri sqlite:///{tmp_path}/mlflow.db" in steps
    assert data in steps and "--baselines sized-cpu,neobert-cpu,modernbert-cpu,crammed-bert-cpu" in steps
    out = ROOT / "trainer" / "configs" / "test-export-best.yaml"
    try:
        assert export_main(["--study", "export", "--rank-by", "mlm", "--out", str(out),
                            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
        assert f"cram it:  python -m trainer.cram --config {out} --budget 24h {data}" in capsys.readouterr().out
        exported = yaml.safe_load(out.read_text())
        study = optuna.load_study(study_name="export", storage=f"sqlite:///{tmp_path}/optuna.db")
        best = min((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0])
        assert exported["arch"] == best.user_attrs["arch"]
        assert exported["provenance"]["trial"] == best.number and exported["provenance"]["study"] == "export"
        assert cram_main(["--config", str(out), "--budget", "3e3tokens", "--data", str(wiki_slice_dir),
                          "--out", str(tmp_path / "final"), "--cache-dir", str(slice_cache)]) == 0
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
    (["--no-probe", "--objective", "probe+throughput", "--controller", "nsga2"], "--no-probe"),
    (["--max-concurrent", "0"], "--max-concurrent"),
    (["--warm-start", "study:"], "--warm-start"),
    (["--warm-start", "study:nobody:3"], "--warm-start: study nobody not found"),
])
def test_bad_input_fails_in_one_line_before_any_trial(extra, expected, args, tmp_path, capsys):
    argv = args("bad", *extra)
    if "--resume" in extra:
        argv = [a for a in argv if a not in ("--study", "bad")]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and expected in err[0], err


def test_resume_of_unknown_study_and_existing_study_without_resume(args, tmp_path, capsys):
    assert main(args("nobody", "--resume")) == 2
    assert "not found" in capsys.readouterr().err
    assert main(args("once", "--trials", "1", "--objective", "mlm", "--no-probe")) == 0
    assert main(args("once", "--trials", "1", "--objective", "mlm", "--no-probe")) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.subprocess
def test_study_joins_an_existing_ray_cluster(args, tmp_path):
    """`--address` joins a running head (on loopback here) instead of starting Ray; stopped by its PID."""
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats", "--block"], env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = main(args("cluster", "--trials", "2", "--controller", "random",
                         "--objective", "mlm", "--no-probe", "--no-early-stop",  # a final result (its node) each
                         "--address", f"127.0.0.1:{port}"))
        assert code == 0
        _, runs = check_stores_agree(tmp_path, "cluster", 2)
        import ray

        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)  # the cluster's own nodes, asked of its head
        try:
            cluster_nodes = {node["NodeID"] for node in ray.nodes()}
        finally:
            ray.shutdown()
    finally:
        head.terminate()
        head.wait(timeout=30)
    # The trials ran on the cluster, not on a Ray the driver started itself (whose node would be new).
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    nodes = [json.loads(Path(client.download_artifacts(run["run_id"], "result.json", str(tmp_path / run["run_id"])))
                        .read_text())["data"]["node"] for run in runs]
    assert len(nodes) == 2 and set(nodes) <= cluster_nodes, (nodes, cluster_nodes)


def test_a_study_trains_its_warm_starts_and_covering_design_first_and_tags_them(args, tmp_path, capsys):
    assert main(args("short", "--trials", "2", "--controller", "random", "--objective", "mlm", "--no-probe",
                     "--no-cover")) == 0
    short = optuna.load_study(study_name="short", storage=f"sqlite:///{tmp_path}/optuna.db")
    best = min((t for t in short.trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0])
    capsys.readouterr()
    assert main(args("warm", "--trials", "4", "--objective", "mlm", "--no-probe", "--no-early-stop",
                     "--warm-start", "study:short:1")) == 0
    out = capsys.readouterr().out
    assert f"first draw: 1 warm start (study:short#{best.number})" in out
    assert f"trial 0 (warm start study:short#{best.number})" in out.split("of the study's first draw: ")[1]
    study, runs = check_stores_agree(tmp_path, "warm", 4)
    assert study.trials[0].user_attrs["arch"] == best.user_attrs["arch"]
    by_trial = {int(r["trial"]): r for r in runs}
    assert by_trial[0]["tags.cramnas.warm_start"] == f"study:short#{best.number}"
    assert [by_trial[n].get("tags.cramnas.first_draw") for n in (1, 2, 3)] == ["cover"] * 3
