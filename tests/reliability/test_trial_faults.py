"""Faults inside trials, injected with `CRAMNAS_INJECT_FAULT` into one real study (so that Ray starts
once): an exception, a NaN loss, a simulated CUDA out-of-memory, a full disk at the checkpoint write
and a SIGKILLed worker. Each costs its own trial only, with its reason in both stores."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from optuna.trial import TrialState

from search.run import main
from search.study.trial import FAULT_KINDS, parse_faults
from search.tracking.tracker import StudyTracker
from tests.helpers import requires_shared_data
from tests.studies import check_stores_agree, study_args
from trainer.checkpoint import load_checkpoint

FAULTS = "exception@1;nan@2;oom@3;diskfull@4;kill@5"


def test_fault_grammar_and_its_errors():
    assert parse_faults("exception@1,5; oom@3;diskfull@3;") == {
        1: {"exception"}, 5: {"exception"}, 3: {"oom", "diskfull"}}
    assert parse_faults("") == {}
    assert set(FAULT_KINDS) == {"exception", "nan", "kill", "oom", "diskfull"}
    for bad in ("oops@1", "nan", "nan@", "nan@x", "kill@1,two"):
        with pytest.raises(ValueError, match="CRAMNAS_INJECT_FAULT: .* is not kind@n"):
            parse_faults(bad)


@requires_shared_data
def test_a_misspelt_fault_fails_the_study_in_one_line(wiki_slice_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CRAMNAS_INJECT_FAULT", "exception@1;oom@x")
    assert main(study_args(tmp_path, wiki_slice_dir, "typo", "--trials", "2")) == 2  # before any data work
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "'oom@x'" in errors[0], errors


@requires_shared_data
@pytest.mark.slow
@pytest.mark.parametrize("executor", ["ray", "local"])
def test_each_fault_costs_only_its_trial(executor, wiki_slice_dir, slice_cache, tmp_path, monkeypatch):
    """Trials 0 and 6 are healthy; 1-5 each get one fault. The GLUE probe runs in the complete
    trials and each writes its checkpoint (--save-checkpoints). On either executor: a worker
    process SIGKILLed (trial 5) is a Ray worker or a process of the local executor's."""
    monkeypatch.setenv("CRAMNAS_INJECT_FAULT", FAULTS)
    code = main(study_args(tmp_path, wiki_slice_dir, "faults", "--trials", "7", "--controller", "random",
                           "--no-early-stop", "--save-checkpoints", "--executor", executor, cache_dir=slice_cache))
    assert code == 0
    study, runs = check_stores_agree(tmp_path, "faults", 7)
    complete, failed = TrialState.COMPLETE, TrialState.FAIL
    assert [t.state for t in study.trials] == [complete, failed, failed, complete, failed, failed, complete]
    reasons = {t.number: t.user_attrs["failure_reason"] for t in study.trials if t.state == failed}
    by_trial = {int(r["trial"]): r for r in runs}
    for number, reason in reasons.items():  # the same reason in both stores
        assert by_trial[number]["tags.cramnas.failure_reason"] == reason
        assert by_trial[number]["tags.cramnas.state"] == "failed"
    assert "injected fault in trial 1" in reasons[1]
    assert reasons[2].startswith("NonFiniteLoss: training loss became nan")
    assert "checkpoint write failed: No space left on device" in reasons[4]
    assert reasons[4].endswith("t0004/model.safetensors)")
    assert "worker died" in reasons[5]

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")

    def result_json(number: int) -> dict:
        path = client.download_artifacts(by_trial[number]["run_id"], "result.json", str(tmp_path / f"r{number}"))
        return json.loads(Path(path).read_text())

    # Out of memory: the micro-batch halved once (8 -> 4) and the trial trained on every row.
    oom = result_json(3)["cram"]
    assert oom["oom_halvings"] == 1 and oom["final_micro_batch"] == 4 and oom["tokens"] == 19968
    assert float(by_trial[3]["metrics.oom_halvings"]) == 1 and study.trials[3].user_attrs["metrics"]["oom_halvings"] == 1
    assert float(by_trial[0]["metrics.oom_halvings"]) == 0 and result_json(0)["cram"]["final_micro_batch"] == 8

    # Complete trials were probed and left a checkpoint that loads; the full disk left no files.
    checkpoints = tmp_path / "checkpoints" / "faults"
    for number in (0, 3, 6):
        assert 0 <= study.trials[number].values[0] <= 1  # the probe average
        assert -1 <= float(by_trial[number]["metrics.glue.stsb.spearman"]) <= 1
        tagged = Path(by_trial[number]["tags.cramnas.checkpoint"])
        assert tagged == checkpoints / f"t{number:04d}"
        model, _ = load_checkpoint(tagged)
        assert model.num_params() == float(by_trial[number]["metrics.params"])
        assert json.loads((tagged / "result.json").read_text())["checkpoint"] == str(tagged)
        # The driver logged its Hugging Face export to the trial's run (trainer/export_hf.py).
        exported = {item.path for item in client.list_artifacts(by_trial[number]["run_id"], "hf_model")}
        assert "hf_model/config.json" in exported and "hf_model/model.safetensors" in exported
        assert not isinstance(by_trial[number].get("tags.cramnas.hf_export_error"), str)
        metrics = {key: float(by_trial[number][f"metrics.{key}"]) for key in
                   ("validation_loss", "unigram_floor", "nats_below_unigram")}  # forwarded from the worker
        assert metrics["nats_below_unigram"] == pytest.approx(metrics["unigram_floor"] - metrics["validation_loss"])
    assert result_json(0)["probe"]["tasks"] == ["rte", "stsb"]
    # The floor is the prepared data's: recorded once, on the study run.
    study_run = StudyTracker(f"sqlite:///{tmp_path}/mlflow.db", "faults").study_run()
    assert float(study_run.data.params["unigram_floor"]) == pytest.approx(metrics["unigram_floor"], abs=1e-4)
    assert list((checkpoints / "t0004").iterdir()) == []  # no model.safetensors, no temporary file
    assert not isinstance(by_trial[4].get("tags.cramnas.checkpoint"), str)  # (NaN in the frame)
    assert sorted(path.name for path in checkpoints.iterdir()) == ["t0000", "t0003", "t0004", "t0006"]
