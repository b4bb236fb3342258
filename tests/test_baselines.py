"""`search.confirm --baselines`: hand-designed configs trained beside the confirmed candidates, and
the report's "Search vs hand design" section.

The crams use tiny configs written to a temporary configs directory (`search.confirm.BASELINES`),
shrunk to the Wikipedia slice's vocabulary and sequence length, so they share its prepared data and
take seconds; the real configs' names are checked by the error for an unknown one.
"""

from __future__ import annotations

import mlflow
import pandas as pd
import pytest
import yaml
from scipy import stats

import search.confirm
from dashboards import analysis, report
from dashboards.analysis import Score
from search.base.objectives import OBJECTIVES
from search.confirm import main
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from tests.confirm_study import BUDGET, SEEDS, TRAIN, tiny_arch, write_study
from tests.dashboard_study import UNIGRAM_FLOOR, scratch_store, write_confirmations
from tests.dashboard_study import write_study as write_synthetic_study
from tests.helpers import CONFIGS, SLICE_SEQ, SLICE_VOCAB, requires_shared_data
from trainer.config import load_run_config
from trainer.model import CrammedBert

PROBE_SCORE = Score(OBJECTIVES["probe"])
# Today's designs (issue 19): each at its crammed-bert counterpart's scale, with its training recipe.
TODAYS = {"neobert-cpu": "crammed-bert-cpu", "modernbert-cpu": "crammed-bert-cpu", "sized-cpu": "crammed-bert-cpu",
          "neobert": "crammed-bert", "modernbert": "crammed-bert"}


def runs_of(uri: str, study: str, kind: str) -> list:
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(study)
    return client.search_runs([experiment.experiment_id], f"tags.`cramnas.kind` = '{kind}'")


def tiny_config(directory, name: str, source: str, lr: float) -> dict:
    """trainer/configs/<source>.yaml shrunk to the slice as directory/<name>.yaml; returns its train section."""
    config = yaml.safe_load((CONFIGS / f"{source}.yaml").read_text())
    config["name"] = name
    config["arch"].update(layers=1, hidden=32, heads=2, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
    config["train"].update(micro_batch=8, batch_size=16, lr=lr, seed=123)  # seed: replaced by the study's seeds
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return config["train"]


@requires_shared_data
@pytest.mark.slow  # six tiny crams
def test_baselines_train_with_the_candidates_seeds_once(wiki_slice_dir, slice_cache, tmp_path, capsys, monkeypatch):
    configs = tmp_path / "configs"
    configs.mkdir()
    recipes = {"hand-a": tiny_config(configs, "hand-a", "crammed-bert-cpu", 3e-3),
               "hand-b": tiny_config(configs, "hand-b", "bert-original-cpu", 3e-4)}
    monkeypatch.setattr(search.confirm, "BASELINES", configs)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    write_study(uri, "s", [(tiny_arch(), "complete", {"validation_loss": 7.0}),
                           (tiny_arch(position="rotary"), "complete", {"validation_loss": 6.5})])

    def confirm(*extra: str) -> int:
        return main(["--study", "s", "--tracking-uri", uri, "--data", str(wiki_slice_dir), "--cache-dir",
                     str(slice_cache), "--budget", BUDGET, "--seeds", "2", *extra])

    assert confirm("--top", "1", "--baselines", "hand-a") == 0
    out = capsys.readouterr().out
    confirmations, baselines = runs_of(uri, "s", "confirmation"), runs_of(uri, "s", "baseline")
    assert len(confirmations) == 2 and len(baselines) == 2
    assert {int(r.data.tags["cramnas.seed"]) for r in confirmations} == set(SEEDS)
    study_run = StudyTracker(uri, "s").study_run_id
    for run in baselines:
        tags, params = run.data.tags, run.data.params
        seed = int(tags["cramnas.seed"])
        assert seed in SEEDS and params["train.seed"] == str(seed)  # the candidates' seeds, not the config's 123
        assert tags["cramnas.baseline"] == "hand-a" and tags["cramnas.budget"] == BUDGET
        assert tags["mlflow.parentRunId"] == study_run and tags["cramnas.state"] == "complete"
        assert run.info.run_name == f"hand-a s{SEEDS.index(seed) + 1}"  # the two seeds told apart at a glance
        assert run.info.status == "FINISHED" and run.data.metrics["validation_loss"] > 0
        # The hand design's own recipe, not the study's.
        assert params["train.lr"] == str(recipes["hand-a"]["lr"]) != str(TRAIN["lr"])
        assert params["arch.position"] == "scaled_sinusoidal" and params["budget"] == BUDGET
    assert "hand-a: 1x32/2h geglu pre-norm scaled_sinusoidal" in out and "4 complete now" in out

    # Again, with --top 0: only baselines; hand-a's runs are there already, hand-b's are new.
    assert confirm("--top", "0", "--baselines", "hand-a,hand-b") == 0
    out = capsys.readouterr().out
    assert len(runs_of(uri, "s", "confirmation")) == 2
    baselines = runs_of(uri, "s", "baseline")
    assert len(baselines) == 4 and out.count("complete before (run") == 2 and "2 complete now" in out
    assert {(r.data.tags["cramnas.baseline"], int(r.data.tags["cramnas.seed"])) for r in baselines} == \
        {(name, seed) for name in ("hand-a", "hand-b") for seed in SEEDS}
    assert all(r.data.params["train.mlm_rate"] == str(recipes[r.data.tags["cramnas.baseline"]]["mlm_rate"])
               for r in baselines)

    # The whole command again: nothing crammed, nothing added.
    assert confirm("--top", "1", "--baselines", "hand-a,hand-b") == 0
    out = capsys.readouterr().out
    assert len(runs_of(uri, "s", "baseline")) == 4 and len(runs_of(uri, "s", "confirmation")) == 2
    assert out.count("complete before (run") == 6 and "0 complete now" in out
    table = StudyTracker(uri, "s").baseline_table()
    assert sorted(table["baseline"]) == ["hand-a", "hand-a", "hand-b", "hand-b"]


def test_unknown_baseline_or_top_0_alone_is_one_line_before_any_training(tmp_path, capsys, monkeypatch):
    import search.study.trial

    def no_training(*args, **kwargs):
        raise AssertionError("trained despite bad input")

    monkeypatch.setattr(search.study.trial, "cram_and_probe", no_training)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    write_study(uri, "u", [(tiny_arch(), "complete", {"validation_loss": 7.0})])
    capsys.readouterr()  # MLflow's notes on creating the store
    assert main(["--study", "u", "--tracking-uri", uri, "--baselines", "crammed-bert-cpu,bert-nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "--baselines" in captured.err and "'bert-nope'" in captured.err
    assert "crammed-bert-cpu" in captured.err and "bert-original-cpu" in captured.err  # the names to choose from
    assert all(name in captured.err for name in TODAYS)
    assert main(["--study", "u", "--tracking-uri", uri, "--top", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--top" in err and "--baselines" in err
    assert runs_of(uri, "u", "baseline") == []


@pytest.mark.parametrize("name", TODAYS)
def test_todays_baselines_build_with_the_counted_parameters_and_the_crammed_recipe(name):
    (baseline,) = search.confirm.load_baselines(name)
    arch = ArchConfig.from_dict(baseline.arch)
    assert CrammedBert(arch).num_params() == arch.num_params()
    crammed = load_run_config(CONFIGS / f"{TODAYS[name]}.yaml")
    assert baseline.train == crammed.train.to_dict()
    assert (arch.vocab_size, arch.max_seq_len) == (crammed.arch.vocab_size, crammed.arch.max_seq_len)
    assert arch.position == "rotary" and not (arch.qkv_bias or arch.attn_out_bias or arch.ffn_bias)


def test_modernbert_alternates_local_and_global_layers():
    for name in ("modernbert-cpu", "modernbert"):
        arch = load_run_config(CONFIGS / f"{name}.yaml").arch
        kinds = [arch.is_global(layer) for layer in range(arch.layers)]
        assert kinds[0] and not all(kinds) and kinds[::3] == [True] * len(kinds[::3])
        assert 0 < 2 * arch.local_window + 1 < arch.max_seq_len  # the window restricts


# ---- the analysis ------------------------------------------------------------------------------

def frame(rows: list[dict], key: str) -> pd.DataFrame:
    """A prepared frame as `confirmation_table` (`key="trial"`) or `baseline_table` (`key="baseline"`) returns it."""
    start = pd.Timestamp("2026-01-01", tz="UTC")
    records = [{key: row[key], "run_id": f"{key}{i}", "run_name": f"r{i}", "status": "FINISHED",
                "start_time": start + pd.Timedelta(minutes=i), "end_time": start + pd.Timedelta(minutes=i + 1),
                "params.budget": row.get("budget", "120s"), "tags.cramnas.seed": str(row["seed"]),
                "tags.cramnas.state": row.get("state", "complete"),
                "metrics.probe_average": row["score"], "metrics.validation_loss": 7.0 - 4.0 * row["score"],
                "metrics.nats_below_unigram": 4.0 * row["score"] - 0.05, "metrics.tokens_per_s": 1000.0,
                "metrics.params": 5e6} for i, row in enumerate(rows)]
    return analysis.prepare(pd.DataFrame(records))


def test_best_candidate_against_each_baseline_paired_by_seed():
    trials = pd.DataFrame({"trial": [3, 5], "run_id": ["t3", "t5"]})
    ours = {1001: 0.70, 1002: 0.74, 1003: 0.71}
    confirmations = frame([{"trial": 3, "seed": s, "score": v} for s, v in ours.items()]
                          + [{"trial": 5, "seed": s, "score": v - 0.05} for s, v in ours.items()], "trial")
    # "steady" tracks our seeds 0.10 below: clearly behind. "noisy" is as good on average, seed by seed
    # above and below. Runs that must not count: a failed seed, and a seed under another budget.
    steady = {1001: 0.61, 1002: 0.63, 1003: 0.60}
    noisy = {1001: 0.76, 1002: 0.66, 1003: 0.74}
    baselines = frame([{"baseline": "steady", "seed": s, "score": v} for s, v in steady.items()]
                      + [{"baseline": "noisy", "seed": s, "score": v} for s, v in noisy.items()]
                      + [{"baseline": "steady", "seed": 1004, "score": 0.9, "state": "failed"},
                         {"baseline": "noisy", "seed": 1001, "score": 0.1, "budget": "60s"}], "baseline")
    # The budget compared is the latest baseline run's: make it the 120s one.
    baselines.loc[baselines["params.budget"] == "60s", "start_time"] -= pd.Timedelta(days=1)

    result = analysis.hand_design(confirmations, baselines, trials, PROBE_SCORE)
    assert result.budget == "120s"
    table = result.table.set_index("configuration")
    assert list(result.table["configuration"]) == ["noisy", "trial 3", "trial 5", "steady"]  # best mean first
    assert table.loc["steady", "n"] == 3 and table.loc["steady", "failed"] == 1 and table.loc["steady", "kind"] == "baseline"
    assert table.loc["noisy", "score_mean"] == pytest.approx(sum(noisy.values()) / 3)
    ci = stats.ttest_1samp([7.0 - 4.0 * v for v in ours.values()], 0.0).confidence_interval(0.95)
    assert (table.loc["trial 3", "loss_low"], table.loc["trial 3", "loss_high"]) == pytest.approx((ci.low, ci.high))

    paired = result.paired.set_index("baseline")
    assert set(paired["best"]) == {"trial 3"}
    for name, theirs in (("steady", steady), ("noisy", noisy)):
        differences = [ours[s] - theirs[s] for s in ours]
        ci = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
        assert paired.loc[name, "n"] == 3
        assert paired.loc[name, "mean"] == pytest.approx(sum(differences) / 3)
        assert (paired.loc[name, "low"], paired.loc[name, "high"]) == pytest.approx((ci.low, ci.high))
    assert paired.loc["steady", "outside_noise"] and paired.loc["steady", "best_ahead"]
    assert not paired.loc["noisy", "outside_noise"]

    # A lower-is-better score: a difference below 0 is ahead.
    loss = analysis.hand_design(confirmations, baselines, trials, Score(OBJECTIVES["mlm"])).paired.set_index("baseline")
    assert loss.loc["steady", "mean"] < 0 and loss.loc["steady", "best_ahead"] and loss.loc["steady", "outside_noise"]


# ---- the report --------------------------------------------------------------------------------

def test_report_sets_the_search_against_each_baseline(tmp_path):
    with scratch_store("cramnas-baselines-") as uri:
        study = write_synthetic_study(uri, "hd", 6, seed=3, optuna_store=False)
        page = report.write_report("hd", tmp_path / "none.html", uri, log_artifact=False).read_text()
        section = page.split('id="hand-design"')[1].split("</section>")[0]
        assert "Search vs hand design" in section and "python -m search.confirm --study hd --tracking-uri" in section
        assert "--baselines sized-cpu,neobert-cpu,modernbert-cpu,crammed-bert-cpu" in section

        write_confirmations(study, {0: [0.70, 0.74, 0.71], 1: [0.60, 0.61, 0.62]}, budget="120s")
        tracker = StudyTracker(uri, "hd")
        scores = {"crammed-bert-cpu": [0.61, 0.63, 0.60], "bert-original-cpu": [0.76, 0.66, 0.74]}
        for name, values in scores.items():
            arch = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["arch"]
            for index, value in enumerate(values, start=1):
                run_id = tracker.open_baseline_run(name, 1000 + index, index, arch, {"seed": 1000 + index}, "120s")
                loss = 7.0 - 4.0 * value
                tracker.finish_run(run_id, "complete", {"probe_average": value, "validation_loss": loss,
                                                        "unigram_floor": UNIGRAM_FLOOR,
                                                        "nats_below_unigram": UNIGRAM_FLOOR - loss,
                                                        "tokens_per_s": 2000.0, "params": 4.2e6, "tokens": 1e6})
        page = report.write_report("hd", tmp_path / "hd.html", uri, log_artifact=False).read_text()
    section = page.split('id="hand-design"')[1].split("</section>")[0]
    shape = ArchConfig.from_dict(yaml.safe_load((CONFIGS / "crammed-bert-cpu.yaml").read_text())["arch"]).describe()
    assert "crammed-bert-cpu" in section and "bert-original-cpu" in section and shape.split()[0] in section
    assert "probe average ± 95% CI" in section and "4.2M" in section
    # Trial 0 against each, in words: who won, by how much, beyond the noise or not.
    assert "search better by 0.103 in probe average (GLUE), outside noise" in section
    assert "baseline better by 0.00333 in probe average (GLUE), within noise" in section
    assert '<div class="table-wrap">' in section and 'class="ci"' in section  # scrolls, wraps: stays in its card
    assert section.count("<b>trial 0</b>") == 1 and "<b>trial 1</b>" in section
