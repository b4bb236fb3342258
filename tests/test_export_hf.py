"""trainer.export_hf: a cramnas checkpoint loads in transformers with the same logits and token ids,
without cramnas, and fine-tunes with transformers' Trainer."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from space.arch import ArchConfig
from tests.helpers import ROOT, SHARED_DATA, cli_env, tiny_checkpoint
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.config import TrainConfig
from trainer.export_hf import AUTO_MAP, CRAMNAS_PACKAGES, export, exported_name, main, remote_code
from trainer.hf_compat import ORIGINAL_BERT
from trainer.model import CrammedBert
from trainer.tokenizer import SPECIAL_TOKENS, train_wordpiece

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "a small cat sleeps on the warm mat and dreams of fish and milk",
    "crammed models learn quickly when the budget is short",
    "language models predict the masked words of a sentence",
]
PAIRS = [("the fox sleeps", "a cat jumps over the dog"), ("models learn words", "the river is warm")]
SMALL = dict(layers=2, hidden=32, heads=4, max_seq_len=64)

# Every position scheme, each norm placement, rmsnorm, gated and plain FFNs, every bias, dense and
# sparse prediction, local attention: the exported model must give cramnas's logits for each.
VARIANTS = {
    "crammed": {},
    "learned": dict(position="learned"),
    "sinusoidal": dict(position="sinusoidal", norm_placement="post"),
    "rotary": dict(position="rotary", ffn_kind="swiglu", norm_kind="rmsnorm"),
    "alibi": dict(position="alibi", norm_placement="sandwich"),
    # ModernBERT's: layer 1 sees 2 tokens each side, far less than the sentences (the mask is a buffer
    # transformers leaves unset on the meta device: the export must rebuild it).
    "sliding-window": dict(position="rotary", local_window=2, global_every=2, norm_bias=False, head_transform=True,
                           decoder_bias=True),
    "none": dict(position="none", ffn_kind="relu2", final_norm=False, embedding_norm=False),
    "all-biases-untied": dict(qkv_bias=True, attn_out_bias=True, ffn_bias=True, decoder_bias=True, norm_bias=False,
                              tie_embeddings=False, head_transform=True, segment_embeddings=True,
                              sparse_prediction=False, ffn_kind="reglu", norm_kind="rmsnorm"),
}


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_wordpiece(SENTENCES * 5, vocab_size=120, normalization="cramming").save(str(path))
    return path


def write_run(root: Path, tokenizer_path: Path, result: dict | None = None, **arch_fields) -> Path:
    """A checkpoint directory of a small model whose every weight (norms, scales, biases) is random."""
    vocab = Tokenizer.from_file(str(tokenizer_path)).get_vocab_size()
    arch = ArchConfig(vocab_size=vocab, **{**SMALL, **arch_fields})
    torch.manual_seed(0)
    model = CrammedBert(arch)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return save_checkpoint(root / "run", model, arch, TrainConfig(), tokenizer_path, result or {})


def encoded(tokenizer_path: Path) -> dict[str, torch.Tensor]:
    """cramnas's own encoding of sentence pairs of different lengths: padded, with segment ids."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(SPECIAL_TOKENS["pad"]), pad_token=SPECIAL_TOKENS["pad"])
    encodings = tokenizer.encode_batch([*PAIRS, (SENTENCES[0], SENTENCES[1])])
    return {
        "input_ids": torch.tensor([e.ids for e in encodings]),
        "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
        "token_type_ids": torch.tensor([e.type_ids for e in encodings]),
    }


def cramnas_logits(run: Path, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    model, _ = load_checkpoint(run)
    with torch.no_grad():
        logits, _ = model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                          token_type_ids=batch["token_type_ids"])
    return logits


def assert_same_logits(name: str, ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor | None) -> None:
    keep = torch.ones(ours.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    difference = (ours[keep] - theirs[keep]).abs().max().item()
    print(f"largest logit difference, {name}: {difference:.2e}")  # for the record (pytest -s)
    assert difference <= 1e-5, f"{name}: exported logits differ from cramnas's by {difference}"


def assert_export_matches(name: str, directory: str | Path, run: Path, tokenizer_path: Path) -> None:
    """The export in `directory` gives checkpoint `run`'s logits on a padded batch of sentence pairs."""
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory, trust_remote_code=True).eval()
    batch = encoded(tokenizer_path)
    with torch.no_grad():
        theirs = model(**batch).logits
    assert_same_logits(name, cramnas_logits(run, batch), theirs, batch["attention_mask"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_logits_equal_cramnas(variant, tokenizer_path, tmp_path):
    run = write_run(tmp_path, tokenizer_path, **VARIANTS[variant])
    out = export(run, tmp_path / "hf")
    model = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(model).__name__ == "CrammedBertForMaskedLM"
    assert model.config.arch.to_dict() == load_checkpoint(run)[0].arch.to_dict()
    padded = encoded(tokenizer_path)
    unpadded = {key: value[-1:] for key, value in padded.items() if key != "attention_mask"}  # the longest row
    for batch, mask in ((padded, padded["attention_mask"]), (unpadded, None)):
        with torch.no_grad():
            theirs = model(**batch).logits
        assert_same_logits(variant, cramnas_logits(run, batch), theirs, mask)


def test_the_remote_code_imports_no_cramnas_module():
    sources = remote_code()
    assert set(sources) >= {f"{target.split('.')[0]}.py" for target in AUTO_MAP.values()} | {"trainer_model.py"}
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] not in CRAMNAS_PACKAGES, f"{name} imports {node.module}"
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert f"{node.module}.py" in sources, f"{name} imports .{node.module}, which the export lacks"
    # The modeling code is cramnas's own, not a copy kept by hand: only its cramnas imports differ.
    original = (ROOT / "trainer/model.py").read_text().splitlines()
    copied = sources["trainer_model.py"].splitlines()
    assert len(copied) == len(original)
    for ours, theirs in zip(original, copied, strict=True):
        imported = re.match(r"from ([\w.]+) import", ours)
        if imported and imported[1].split(".")[0] in CRAMNAS_PACKAGES:
            ours = ours.replace(f"from {imported[1]} import", f"from .{exported_name(imported[1])} import")
        assert theirs == ours


LOAD_WITHOUT_CRAMNAS = """
import sys, torch

class NoCramnas:  # cramnas is installed in this environment: make every import of it fail
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {packages!r}:
            raise ImportError("the export imported cramnas: " + name)

sys.meta_path.insert(0, NoCramnas())
sys.path = [p for p in sys.path if p not in ("", {root!r})]
from transformers import AutoModelForMaskedLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
model = AutoModelForMaskedLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
batch = tokenizer([a for a, _ in {pairs!r}], [b for _, b in {pairs!r}], padding=True, return_tensors="pt")
with torch.no_grad():
    torch.save(dict(batch) | {{"logits": model(**batch).logits}}, sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_export_loads_where_cramnas_cannot_be_imported(tokenizer_path, tmp_path):
    run = write_run(tmp_path, tokenizer_path, position="rotary")
    out = export(run, tmp_path / "hf")
    script = LOAD_WITHOUT_CRAMNAS.format(packages=set(CRAMNAS_PACKAGES), root=str(ROOT), pairs=PAIRS)
    env = {key: value for key, value in cli_env(HF_MODULES_CACHE=str(tmp_path / "modules")).items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script, str(out), str(tmp_path / "logits.pt")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = torch.load(tmp_path / "logits.pt", weights_only=True)
    assert_same_logits("rotary (no cramnas)", cramnas_logits(run, saved), saved["logits"], saved["attention_mask"])


def test_the_tokenizer_gives_cramnas_ids(tokenizer_path, tmp_path):
    out = export(write_run(tmp_path, tokenizer_path), tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ours = Tokenizer.from_file(str(tokenizer_path))
    for name, token in SPECIAL_TOKENS.items():
        assert getattr(theirs, f"{name}_token_id") == ours.token_to_id(token)
    for sentence in [*SENTENCES, "Ünïcode and UPPER case, unseen-words!"]:
        assert theirs(sentence)["input_ids"] == ours.encode(sentence).ids
    for first, second in PAIRS:
        encoding, expected = theirs(first, second), ours.encode(first, second)
        assert encoding["input_ids"] == expected.ids and encoding["token_type_ids"] == expected.type_ids
        cls, sep = ours.token_to_id("[CLS]"), ours.token_to_id("[SEP]")
        assert encoding["input_ids"][0] == cls and encoding["input_ids"].count(sep) == 2
    assert theirs.model_max_length == SMALL["max_seq_len"]


def test_original_bert_exports_as_a_plain_bert_for_masked_lm(tokenizer_path, tmp_path):
    run = write_run(tmp_path, tokenizer_path, **{**ORIGINAL_BERT, "sparse_prediction": True})
    out = export(run, tmp_path / "hf")
    assert not list(out.glob("*.py")) and "auto_map" not in json.loads((out / "config.json").read_text())
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()  # no remote code
    assert isinstance(model, transformers.BertForMaskedLM)
    batch = encoded(tokenizer_path)
    with torch.no_grad():
        theirs = model(**batch).logits
    assert_same_logits("original BERT", cramnas_logits(run, batch), theirs, batch["attention_mask"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(*PAIRS[0])["input_ids"] == Tokenizer.from_file(str(tokenizer_path)).encode(*PAIRS[0]).ids


def test_the_classifier_is_glue_finetunes_head(tokenizer_path, tmp_path):
    from glue.finetune import SequenceClassifier

    run = write_run(tmp_path, tokenizer_path, position="alibi")
    out = export(run, tmp_path / "hf")
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True,
                                                                             num_labels=3).eval()
    ours = SequenceClassifier(load_checkpoint(run)[0], num_labels=3, dropout=0.1).eval()
    ours.head.load_state_dict(theirs.head.state_dict())
    batch = encoded(tokenizer_path)
    encoder = transformers.AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(**batch).logits, ours(**batch), atol=1e-5, rtol=0)
        torch.testing.assert_close(encoder(**batch).last_hidden_state, ours.encoder.encode(**batch), atol=1e-5, rtol=0)
    # transformers' loss conventions: regression for one label.
    regression = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True,
                                                                                 num_labels=1)
    labels = torch.tensor([0.5, 1.0, 2.0])
    output = regression(**batch, labels=labels)
    assert regression.config.problem_type == "regression"
    torch.testing.assert_close(output.loss, torch.nn.functional.mse_loss(output.logits.squeeze(-1), labels))


@pytest.mark.slow
def test_a_classifier_trains_a_step_with_the_transformers_trainer(tokenizer_path, tmp_path):
    import pandas as pd

    rte = SHARED_DATA / "glue" / "rte" / "train.parquet"
    if not rte.is_file():
        pytest.skip(f"no GLUE RTE at {rte}")
    out = export(write_run(tmp_path, tokenizer_path), tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True, num_labels=2)
    rows = pd.read_parquet(rte).head(8)
    encodings = tokenizer(list(rows.sentence1), list(rows.sentence2), truncation=True)
    examples = [{key: values[i] for key, values in encodings.items()} | {"labels": int(rows.label.iloc[i])}
                for i in range(len(rows))]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = transformers.Trainer(
        model=model, train_dataset=examples, data_collator=transformers.DataCollatorWithPadding(tokenizer),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=1, per_device_train_batch_size=8,
                                            learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no"),
    )
    result = trainer.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    changed = {name for name, p in model.named_parameters() if not torch.equal(p.detach().cpu(), before[name])}
    assert {"head.classifier.weight", "crammed.embeddings.tokens.weight"} <= changed
    # The fine-tuned model saves with its code and loads back as it was.
    model.eval().save_pretrained(tmp_path / "finetuned")
    again = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "finetuned", trust_remote_code=True)
    batch = tokenizer(list(rows.sentence1[:2]), list(rows.sentence2[:2]), padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(**batch).logits, model(**batch).logits, atol=1e-6, rtol=0)


@pytest.mark.subprocess
@pytest.mark.slow
def test_bad_run_directories_are_one_error_line(tmp_path, capsys):
    missing = subprocess.run([sys.executable, "-m", "trainer.export_hf", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                             cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [missing.stderr.strip()]
    assert missing.stderr.startswith(f"error: run directory {tmp_path / 'nope'}: no such directory")
    assert not (tmp_path / "o").exists()

    for name in ("good", "mismatched", "no-weights", "bad-arch"):
        (tmp_path / name).mkdir()
    good = tiny_checkpoint(tmp_path / "good")
    mismatched = tiny_checkpoint(tmp_path / "mismatched", extra_vocab=3)
    no_weights = tiny_checkpoint(tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    bad_arch = tiny_checkpoint(tmp_path / "bad-arch")
    (bad_arch / "arch.yaml").write_text("layers: two\n")
    for run, expected in ((no_weights, "lacks model.safetensors"), (bad_arch, "arch.yaml: layers: expected an integer"),
                          (mismatched, "tokens but the model's vocab_size is")):
        assert main([str(run), "--out", str(tmp_path / "o")]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and expected in error and error.count("\n") == 1

    assert main([str(good), "--out", str(tmp_path / "o")]) == 0
    assert main([str(good), "--out", str(tmp_path / "o")]) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    assert main([str(good), "--out", str(tmp_path / "o"), "--force"]) == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main([str(good), "--out", str(tmp_path / "other"), "--force"]) == 2
    assert "holds no earlier export" in capsys.readouterr().err and (tmp_path / "other" / "notes.txt").exists()


@pytest.mark.slow
def test_search_export_registers_the_winners_export_with_its_lineage(tokenizer_path, tmp_path, capsys, monkeypatch):
    import mlflow
    import yaml
    from mlflow import MlflowClient

    from search.base.objectives import OBJECTIVES
    from search.export import main as search_export
    from tests.dashboard_study import write_confirmations, write_study

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # where models:/ URIs resolve
    study = write_study(uri, "registered", 4, controller="random", objective="mlm", seed=1)
    mlm = OBJECTIVES["mlm"]
    winner = min(study.by_state("complete"), key=lambda t: mlm.sort_key(t.metrics[mlm.rank_metric]))
    args = ["--study", study.name, "--tracking-uri", uri, "--out", str(tmp_path / "best.yaml"), "--force",
            "--register", "winner"]
    capsys.readouterr()
    assert search_export(args) == 2  # the study ran without --save-checkpoints
    error = capsys.readouterr().err
    assert error.startswith(f"error: --register: trial {winner.number} has no saved checkpoint") and error.count("\n") == 1

    client = MlflowClient(uri)
    run = write_run(tmp_path, tokenizer_path, position="alibi", norm_placement="sandwich")
    client.set_tag(winner.run_id, "cramnas.checkpoint", str(run))  # as search.run --save-checkpoints tags it
    client.log_dict(winner.run_id, {"cram": {"data_fingerprint": "data-0123"}}, "result.json")
    write_confirmations(study, {winner.number: [0.5, 0.6]}, "60s")
    assert search_export(args) == 0
    provenance = yaml.safe_load((tmp_path / "best.yaml").read_text())["provenance"]
    assert provenance["registered_model"] == "models:/winner/1"

    tags = client.get_model_version("winner", "1").tags
    assert {key: tags[f"cramnas.{key}"] for key in ("study", "trial", "run_id", "data_fingerprint", "confirmation_seeds")} \
        == {"study": study.name, "trial": str(winner.number), "run_id": winner.run_id, "data_fingerprint": "data-0123",
            "confirmation_seeds": "1001,1002"}
    local = mlflow.artifacts.download_artifacts("models:/winner/1", dst_path=str(tmp_path / "download"))
    assert_export_matches("registered model", local, run, tokenizer_path)


@pytest.mark.slow
def test_a_cram_is_recorded_in_mlflow_with_its_export_once(tokenizer_path, tmp_path, capsys):
    """`python -m search.record RUN_DIR`: one run in the experiment `cram`, with the export; recording
    the directory again (a retry after a failure, or by mistake) returns the same run, adding nothing."""
    import mlflow
    from mlflow import MlflowClient

    from search.record import main as record_main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = {"validation_loss": 5.25, "tokens": 4096, "device": "cpu", "data_fingerprint": "data-4567",
              "loss_curve": [[1024, 6.5], [2048, 6.0]]}
    run = write_run(tmp_path, tokenizer_path, result, position="learned", ffn_kind="swiglu")
    outputs = []
    for _ in range(2):
        assert record_main([str(run), "--tracking-uri", uri]) == 0
        outputs.append(capsys.readouterr().out)
    run_id = outputs[0].split()[2]
    assert outputs[1] == outputs[0] and outputs[0].startswith(f"MLflow run {run_id} in {uri} (experiment cram)")
    client = MlflowClient(uri)
    (recorded,) = client.search_runs([client.get_experiment_by_name("cram").experiment_id])
    assert recorded.info.run_id == run_id
    assert recorded.info.status == "FINISHED" and recorded.info.run_name == run.name
    assert recorded.data.params["arch.position"] == "learned" and recorded.data.params["train.seed"]
    assert recorded.data.metrics["validation_loss"] == 5.25 and recorded.data.tags["cramnas.data_fingerprint"] == "data-4567"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(1024, 6.5), (2048, 6.0)]
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="hf_model", tracking_uri=uri,
                                                dst_path=str(tmp_path / "download"))
    assert (tmp_path / "mlruns").is_dir()  # beside the database, as a study's artifacts are
    assert_export_matches("recorded cram", local, run, tokenizer_path)


@pytest.mark.slow
def test_recording_again_completes_a_run_cut_short_without_duplicates(tokenizer_path, tmp_path, monkeypatch):
    """The store fails part way (after the metrics, before the export): one line, exit 1; the next
    attempt finishes the same run, and its metrics are not logged twice."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from search import record

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = write_run(tmp_path, tokenizer_path, {"validation_loss": 5.25, "loss_curve": [[1024, 6.5]]})

    def store_gone(client, run_id, checkpoint):
        raise MlflowException("database is locked")

    with monkeypatch.context() as patched:
        patched.setattr("trainer.export_hf.log_to_mlflow", store_gone)
        with pytest.raises(record.RecordError, match="record it again once the store is back"):
            record.record_cram(uri, run)
    client = MlflowClient(uri)
    (cut,) = client.search_runs([client.get_experiment_by_name("cram").experiment_id])
    assert cut.info.status == "RUNNING"
    assert record.record_cram(uri, run) == cut.info.run_id
    assert client.get_run(cut.info.run_id).info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(cut.info.run_id, "validation_loss")] == [5.25]
    assert [m.value for m in client.get_metric_history(cut.info.run_id, "train_loss")] == [6.5]
    assert client.list_artifacts(cut.info.run_id, "hf_model")


@pytest.mark.parametrize("case,code,expected", [
    ("unfinished", 2, "has no arch.yaml, train.yaml, result.json: not a finished trainer.cram run"),
    ("bad store", 2, "error: MLflow store sqlite:////proc/none/mlflow.db: cannot create /proc/none"),
])
def test_record_fails_in_one_line_before_writing_anything(case, code, expected, tmp_path, capsys):
    from search.record import main as record_main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    if case == "bad store":
        for name in ("arch.yaml", "train.yaml", "result.json"):
            (run_dir / name).write_text("{}")
        uri = "sqlite:////proc/none/mlflow.db"
    assert record_main([str(run_dir), "--tracking-uri", uri]) == code
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and expected in captured.err
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_the_study_driver_logs_each_saved_checkpoints_export(tokenizer_path, tmp_path, capsys):
    """`search.run --save-checkpoints`: the driver (`CramnasSearcher.on_trial_complete`, no Ray
    trial needed) logs a complete trial's checkpoint as its run's `hf_model/` artifact; a checkpoint
    that cannot be exported leaves the trial complete, with the reason as a tag and a warning."""
    import mlflow
    import optuna

    from search.base.objectives import OBJECTIVES
    from search.study import controllers
    from search.study.searcher import CramnasSearcher
    from search.study.spec import TrialSpec
    from search.tracking.tracker import StudyTracker
    from space import load_space
    from trainer.budget import Budget

    uri, storage = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    space = load_space(ROOT / "tests" / "search_files" / "tiny_space.yaml")
    study = controllers.open_study("saved", storage, "random", "mlm", space, seed=0)
    tracker = StudyTracker(uri, "saved")
    tracker.start_study({"controller": "random", "objective": "mlm"})
    searcher = CramnasSearcher(study, space, OBJECTIVES["mlm"], tracker,
                               TrialSpec(TrainConfig(), Budget.parse("2e4tokens"), "data-0123"), {"controller": "random"})
    run = write_run(tmp_path, tokenizer_path, position="rotary")
    for trial_id, checkpoint in (("good", run), ("broken", tmp_path / "gone")):
        searcher.suggest(trial_id)
        searcher.on_trial_complete(trial_id, {"final": True, "validation_loss": 6.5, "tokens": 4096.0,
                                              "checkpoint_path": str(checkpoint)})
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.COMPLETE] * 2
    good, broken = (tracker.find_trial_run(number) for number in (0, 1))
    for recorded in (good, broken):
        assert recorded.info.status == "FINISHED" and recorded.data.tags["cramnas.state"] == "complete"
    assert "cramnas.hf_export_error" not in good.data.tags
    local = mlflow.artifacts.download_artifacts(run_id=good.info.run_id, artifact_path="hf_model", tracking_uri=uri,
                                                dst_path=str(tmp_path / "download"))
    assert (Path(local) / "config.json").is_file()
    assert_export_matches("a study's saved checkpoint", local, run, tokenizer_path)
    assert broken.data.tags["cramnas.hf_export_error"].startswith(f"HfExportError: run directory {tmp_path / 'gone'}")
    assert not mlflow.MlflowClient(uri).list_artifacts(broken.info.run_id, "hf_model")
    assert f"warning: trial 1 stays complete, but its checkpoint {tmp_path / 'gone'} has no Hugging Face export" \
        in capsys.readouterr().out
