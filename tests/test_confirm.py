"""`python -m search.confirm`: a study's top configurations crammed again with new seeds.

The studies here are written straight to MLflow, as `search.run` records them (a study run, trial
runs with `arch.yaml` and metrics), which is much faster than running one; the confirmations then
really cram those tiny architectures on the Wikipedia slice, for 3e3 tokens each.
"""

from __future__ import annotations

import math
import re

import mlflow
import pytest

from search.confirm import main
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from tests.confirm_study import BUDGET, SEEDS, TRAIN, tiny_arch, write_study
from tests.helpers import requires_shared_data

pytestmark = [requires_shared_data, pytest.mark.slow]  # each test writes a new MLflow store, most cram

# An architecture that cannot be built: 30 hidden units do not split into 4 heads.
BROKEN_ARCH = {**tiny_arch(), "hidden": 30, "heads": 4}


def confirmation_runs(uri: str, name: str) -> list:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    return client.search_runs([experiment.experiment_id], "tags.`cramnas.kind` = 'confirmation'")


@pytest.fixture
def confirm(wiki_slice_dir, slice_cache, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"

    def run(study: str, *extra: str) -> int:
        return main(["--study", study, "--tracking-uri", uri, "--data", str(wiki_slice_dir),
                     "--cache-dir", str(slice_cache), "--budget", BUDGET, *extra])

    run.uri = uri
    return run


def test_top_k_crammed_with_new_seeds_once(confirm, capsys):
    trials = [(tiny_arch(), "complete", {"validation_loss": 7.0}),
              (tiny_arch(position="rotary"), "complete", {"validation_loss": 6.5}),
              (tiny_arch(), "repeat", {"validation_loss": 6.0}),  # a copy of trial 0's result: never ranked
              (tiny_arch(layers=2), "pruned", {"validation_loss": 5.0}),  # stopped early: never ranked
              (tiny_arch(ffn_kind="gelu"), "complete", {"validation_loss": 8.0})]  # fourth: beyond --top 2
    originals = write_study(confirm.uri, "s", trials)
    assert confirm("s", "--top", "2", "--seeds", "2") == 0
    out = capsys.readouterr().out
    # It ends by naming the report and the export, on the store it read (no --data: they read only the stores).
    assert f"report: python -m dashboards.report --study s --tracking-uri {confirm.uri}" in out
    assert f"export: python -m search.export --study s --tracking-uri {confirm.uri}" in out
    runs = confirmation_runs(confirm.uri, "s")
    assert len(runs) == 4
    study_run = StudyTracker(confirm.uri, "s").study_run_id
    seen = set()
    for run in runs:
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        trial = int(tags["cramnas.original_trial"])
        assert trial in (0, 1) and tags["cramnas.confirmation_of"] == originals[trial]
        assert tags["mlflow.parentRunId"] == study_run
        seed = int(tags["cramnas.seed"])
        assert seed in SEEDS and seed != TRAIN["seed"] and params["train.seed"] == str(seed)
        assert run.info.run_name == f"confirm-t{trial:04d}-s{SEEDS.index(seed) + 1}"
        seen.add((trial, seed))
        assert run.info.status == "FINISHED" and tags["cramnas.state"] == "complete"
        assert "cramnas.failure_reason" not in tags
        assert params["budget"] == BUDGET and params["arch.position"] == trials[trial][0]["position"]
        for name in ("validation_loss", "tokens", "tokens_per_s", "params", "flops_per_token", "seconds"):
            assert math.isfinite(metrics[name]) and metrics[name] > 0, name
        # The confirmation budget, not the study's 2e4 tokens: 3e3 in whole micro-batches of 8 x 64
        # (trainer.loop drops a last one the budget would cut short).
        assert 3000 - 8 * 64 < metrics["tokens"] <= 3000
        assert metrics["unigram_floor"] > 0  # every confirmation says how far above counting tokens it is
        assert metrics["nats_below_unigram"] == pytest.approx(metrics["unigram_floor"] - metrics["validation_loss"])
    assert seen == {(t, s) for t in (0, 1) for s in SEEDS}
    # Seeds matter: the same architecture under two seeds does not land on the same loss.
    by_seed = {int(r.data.tags["cramnas.seed"]): r.data.metrics["validation_loss"] for r in runs
               if r.data.tags["cramnas.original_trial"] == "1"}
    assert by_seed[SEEDS[0]] != by_seed[SEEDS[1]]
    assert "confirmed (95% CI)" in out and " ± " in out and "4 complete now" in out
    assert len(re.findall(r" nats (below|above) the corruption floor [\d.]+, regime (plateau|neighbours|beyond-ngrams)",
                          out)) == 4

    # The same command again: nothing is crammed or added.
    assert confirm("s", "--top", "2", "--seeds", "2") == 0
    out = capsys.readouterr().out
    assert len(confirmation_runs(confirm.uri, "s")) == 4
    assert out.count(": complete before (run") == 4 and "0 complete now" in out

    # A run a Ctrl-C or a crash left behind is re-done in the same MLflow run.
    client = mlflow.MlflowClient(confirm.uri)
    killed = runs[0].info.run_id
    client.set_terminated(killed, "KILLED")
    assert confirm("s", "--top", "2", "--seeds", "2") == 0
    out = capsys.readouterr().out
    assert "re-doing" in out and "1 complete now" in out and "3 complete before" in out
    assert len(confirmation_runs(confirm.uri, "s")) == 4
    assert client.get_run(killed).info.status == "FINISHED"


def test_a_failure_costs_only_its_run_and_ctrl_c_kills_the_one_in_flight(confirm, capsys, monkeypatch):
    import search.study.trial

    originals = write_study(confirm.uri, "f", [(BROKEN_ARCH, "complete", {"validation_loss": 6.0}),
                                               (tiny_arch(), "complete", {"validation_loss": 7.0})])
    assert confirm("f", "--top", "2", "--seeds", "1") == 0
    runs = {int(r.data.tags["cramnas.original_trial"]): r for r in confirmation_runs(confirm.uri, "f")}
    assert runs[0].info.status == "FAILED" and runs[0].data.tags["cramnas.state"] == "failed"
    assert "ArchError" in runs[0].data.tags["cramnas.failure_reason"]
    assert "hidden" in runs[0].data.tags["cramnas.failure_reason"]
    assert runs[1].info.status == "FINISHED" and runs[1].data.tags["cramnas.confirmation_of"] == originals[1]
    capsys.readouterr()

    # Ctrl-C during the next cram (trial 1, second seed): that run ends KILLED, exit code 130.
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search.study.trial, "cram_and_probe", interrupted)
    assert confirm("f", "--top", "2", "--seeds", "2") == 130
    assert "failed before" in capsys.readouterr().out  # trial 0's first seed is kept as it failed
    runs = confirmation_runs(confirm.uri, "f")
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert len(runs) == 4 and len(killed) == 1
    assert killed[0].data.tags["cramnas.original_trial"] == "1" and killed[0].data.tags["cramnas.seed"] == str(SEEDS[1])
    assert "interrupted" in killed[0].data.tags["cramnas.failure_reason"]

    # Resumed, failures retried: the same four runs, the killed one now complete.
    monkeypatch.undo()
    assert confirm("f", "--top", "2", "--seeds", "2", "--retry-failed") == 0
    after = {r.info.run_id: r for r in confirmation_runs(confirm.uri, "f")}
    assert set(after) == {r.info.run_id for r in runs}
    assert after[killed[0].info.run_id].info.status == "FINISHED"
    assert "cramnas.failure_reason" not in after[killed[0].info.run_id].data.tags
    assert sorted(r.info.status for r in after.values()) == ["FAILED", "FAILED", "FINISHED", "FINISHED"]


def test_probe_study_is_ranked_and_confirmed_by_its_probe_score(confirm, monkeypatch):
    import search.study.trial

    # As search.study.driver records them: every glue.ProbeLimits field but the data directory and the seed.
    limits = {"max_train_examples": 64, "max_seconds_per_task": 2.0, "epochs": 1, "batch_size": 16, "lr": 1e-3,
              "pooling": "mean"}
    # Trial 1 has the better MLM loss, trial 0 the better probe score: the probe decides.
    originals = write_study(confirm.uri, "p", [
        (tiny_arch(), "complete", {"validation_loss": 7.0, "probe_average": 0.6, "tokens_per_s": 100.0}),
        (tiny_arch(position="rotary"), "complete", {"validation_loss": 6.0, "probe_average": 0.5, "tokens_per_s": 900.0}),
    ], objective="probe+throughput", probe_tasks="rte,stsb", probe_limits=limits)
    probes = []
    real = search.study.trial.cram_and_probe
    monkeypatch.setattr(search.study.trial, "cram_and_probe", lambda *args, **kw: probes.append(args[4]) or real(*args, **kw))
    assert confirm("p", "--top", "1", "--seeds", "1") == 0
    (probe,) = probes  # the study's probe, exactly: its tasks and limits, with this run's seed and data
    assert probe.tasks == ("rte", "stsb") and probe.limits == {**limits, "seed": SEEDS[0], "data_dir": probe.limits["data_dir"]}
    (run,) = confirmation_runs(confirm.uri, "p")
    assert run.data.tags["cramnas.confirmation_of"] == originals[0]
    metrics = run.data.metrics
    assert 0 <= metrics["probe_average"] <= 1 and 0 <= metrics["glue.rte.accuracy"] <= 1
    assert -1 <= metrics["glue.stsb.spearman"] <= 1


def test_plan_reads_back_what_the_study_recorded(wiki_slice_dir, slice_cache, tmp_path):
    """Without arch.yaml (a run rebuilt on resume) the architecture and training settings come back
    from the run's params, typed; the budget defaults to the study's."""
    from search.confirm import make_plan, parse_args

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rotary = tiny_arch(position="rotary", norm_eps=1e-12, qkv_bias=True)
    write_study(uri, "r", [(tiny_arch(), "complete", {"validation_loss": 7.0}),
                           (rotary, "complete", {"validation_loss": 6.0})], artifacts=False)
    plan = make_plan(parse_args(["--study", "r", "--tracking-uri", uri, "--data", str(wiki_slice_dir),
                                 "--cache-dir", str(slice_cache), "--top", "5"]))
    assert plan.budget.text == "2e4tokens" and plan.seeds == [1008, 1009, 1010]
    assert [(c.rank, c.trial) for c in plan.candidates] == [(1, 1), (2, 0)]
    assert plan.candidates[0].arch == rotary and ArchConfig.from_dict(plan.candidates[0].arch).fingerprint()
    assert plan.candidates[0].train == TRAIN and plan.probe is None


@pytest.mark.parametrize("study,extra,expected", [
    ("nobody", [], "--study: no study 'nobody'"),
    ("b", ["--top", "0"], "--top"),
    ("b", ["--seeds", "0"], "--seeds"),
    ("b", ["--budget", "5 fortnights"], "budget"),
    ("none-complete", [], "no complete trial"),
    ("b", ["--tracking-uri", "sqlite:////nonexistent/mlflow.db"], "--tracking-uri"),
    ("unknown-limits", [], "not its probe limits"),
])
def test_bad_input_fails_in_one_line_before_any_training(study, extra, expected, confirm, capsys):
    write_study(confirm.uri, "b", [(tiny_arch(), "complete", {"validation_loss": 7.0})])
    write_study(confirm.uri, "none-complete", [(tiny_arch(), "pruned", {"validation_loss": 7.0}),
                                               (tiny_arch(layers=2), "failed", {"validation_loss": math.nan})])
    write_study(confirm.uri, "unknown-limits", [(tiny_arch(), "complete", {"validation_loss": 7.0})], probe_tasks="rte")
    capsys.readouterr()  # MLflow's notes on creating the store
    assert confirm(study, *extra) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not confirmation_runs(confirm.uri, "b")
