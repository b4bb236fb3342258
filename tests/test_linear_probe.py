"""glue.linear_probe, the frozen-feature linear probe, on a synthetic GLUE directory; and a smoke run of
benchmarks/probe_separation.py on the test slice.

The synthetic SST-2 says its label with one word (`good` or `bad`) among random filler words; the
synthetic STS-B's score is how many `good`s its pair holds. An encoder whose states are a fixed
vector per token carries both in its mean-pooled features; one whose states are noise carries
neither. Both are stubs with CrammedBert's `arch` and `encode`, so nothing here depends on training.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from glue import linear_probe
from glue.tasks import GlueError
from space.arch import ArchConfig
from tests.helpers import ROOT, cli_env, requires_shared_data
from trainer.checkpoint import save_checkpoint
from trainer.config import TrainConfig
from trainer.model import CrammedBert
from trainer.tokenizer import train_wordpiece

FILLER = ["the", "cat", "dog", "sat", "on", "mat", "a", "big", "small", "red", "blue", "green", "ran", "home"]
TRAIN_ROWS, VALIDATION_ROWS = 200, 120


def sst2_frame(rows: int, rng: np.random.Generator) -> pd.DataFrame:
    labels = rng.integers(0, 2, rows)
    sentences = []
    for label in labels:
        words = list(rng.choice(FILLER, 6))
        words.insert(int(rng.integers(0, 7)), "good" if label else "bad")
        sentences.append(" ".join(words))
    return pd.DataFrame({"sentence": sentences, "label": labels, "idx": np.arange(rows)})


def stsb_frame(rows: int, rng: np.random.Generator) -> pd.DataFrame:
    """Pairs of 5 words each; the score is the number of `good`s among the 10 (0-5)."""
    scores = rng.integers(0, 6, rows)
    pairs = []
    for score in scores:
        words = ["good"] * int(score) + list(rng.choice(FILLER, 10 - int(score)))
        rng.shuffle(words)
        pairs.append((" ".join(words[:5]), " ".join(words[5:])))
    return pd.DataFrame({"sentence1": [a for a, _ in pairs], "sentence2": [b for _, b in pairs],
                         "label": scores.astype(np.float32), "idx": np.arange(rows)})


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """(data directory with glue/{sst2,stsb}, tokenizer.json path, an ArchConfig of its vocabulary)."""
    root = tmp_path_factory.mktemp("synthetic-glue")
    rng = np.random.default_rng(0)
    for task, make in (("sst2", sst2_frame), ("stsb", stsb_frame)):
        (root / "glue" / task).mkdir(parents=True)
        for split, rows in (("train", TRAIN_ROWS), ("validation", VALIDATION_ROWS)):
            make(rows, rng).to_parquet(root / "glue" / task / f"{split}.parquet")
    tokenizer = train_wordpiece([" ".join([*FILLER, "good", "bad"])] * 20, vocab_size=64, normalization="cramming")
    tokenizer.save(str(root / "tokenizer.json"))
    arch = ArchConfig(layers=1, hidden=16, heads=2, vocab_size=tokenizer.get_vocab_size(), max_seq_len=64)
    return root, root / "tokenizer.json", arch


class BagOfEmbeddings(nn.Module):
    """States = a fixed random vector per token: the mean-pooled state says which words the input holds."""

    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.arch = arch
        self.table = nn.Embedding(arch.vocab_size, arch.hidden)
        nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(0))
        self.calls = 0

    def encode(self, input_ids, attention_mask=None, token_type_ids=None):
        self.calls += 1
        return self.table(input_ids)


class Noise(BagOfEmbeddings):
    """States = noise drawn independently of the input: features without the label."""

    def __init__(self, arch: ArchConfig):
        super().__init__(arch)
        self.generator = torch.Generator().manual_seed(1)

    def encode(self, input_ids, attention_mask=None, token_type_ids=None):
        self.calls += 1
        return torch.randn(*input_ids.shape, self.arch.hidden, generator=self.generator)


def tiny_bert(arch: ArchConfig, seed: int = 0) -> CrammedBert:
    torch.manual_seed(seed)
    return CrammedBert(arch, dropout=0.5)  # dropout: features that moved between calls would show train mode


def test_features_carrying_the_label_score_high_and_noise_does_not(synthetic):
    data, tokenizer, arch = synthetic
    informed = linear_probe(BagOfEmbeddings(arch), tokenizer, ("sst2", "stsb"), data_dir=data)
    blind = linear_probe(Noise(arch), tokenizer, ("sst2", "stsb"), data_dir=data)
    assert informed.metrics["sst2"]["accuracy"] >= 0.95 and informed.metrics["stsb"]["pearson"] >= 0.9
    assert blind.metrics["sst2"]["accuracy"] <= 0.7 and abs(blind.metrics["stsb"]["pearson"]) <= 0.3
    assert informed.average == pytest.approx(np.mean([informed.scores["sst2"], informed.scores["stsb"]]))
    assert informed.train_examples == {"sst2": TRAIN_ROWS, "stsb": TRAIN_ROWS} and informed.feature_size == arch.hidden
    assert set(informed.regularisation) == {"sst2", "stsb"}
    json.dumps(informed.to_dict())


def test_the_encoder_is_frozen_in_eval_mode_and_left_as_it_was(synthetic):
    data, tokenizer, arch = synthetic
    model = tiny_bert(arch).train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    seen = []  # (training, output requires grad) of the last block at every call
    model.blocks[-1].register_forward_hook(lambda module, args, output: seen.append((module.training, output.requires_grad)))
    linear_probe(model, tokenizer, "sst2", data_dir=data)
    assert seen and all(state == (False, False) for state in seen)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(parameter.grad is None and parameter.requires_grad for parameter in model.parameters())
    assert model.training  # put back in the mode the caller left it in


@pytest.mark.parametrize(("tasks", "kwargs", "message"), [
    ("sst3", {}, "unknown GLUE task 'sst3'"),
    ("rte", {}, "task rte: missing"),
    ("sst2", {"max_train_examples": 6}, "fewer than the 5 cross-validation folds; raise max_train_examples"),
    ("sst2", {"max_train_examples": 0}, "max_train_examples must be positive"),
])
def test_bad_input_fails_in_one_line_before_any_encoding(synthetic, tasks, kwargs, message):
    data, tokenizer, arch = synthetic
    model = BagOfEmbeddings(arch)
    with pytest.raises(GlueError, match=message) as raised:
        linear_probe(model, tokenizer, tasks, data_dir=data, **kwargs)
    assert "\n" not in str(raised.value) and model.calls == 0


def test_an_in_memory_model_needs_its_tokenizer(synthetic):
    _, _, arch = synthetic
    with pytest.raises(GlueError, match="tokenizer_path: an in-memory model needs its tokenizer"):
        linear_probe(BagOfEmbeddings(arch))


def test_same_seed_same_result_from_memory_or_checkpoint_and_another_seed_another_subset(synthetic, tmp_path):
    data, tokenizer, arch = synthetic
    model = tiny_bert(arch).eval()
    checkpoint = save_checkpoint(tmp_path / "checkpoint", model, arch, TrainConfig(), tokenizer, {})

    def probed(encoder, seed, tokenizer_path=None) -> dict:
        result = linear_probe(encoder, tokenizer_path, "stsb", data_dir=data, max_train_examples=100, seed=seed)
        return {key: value for key, value in result.to_dict().items() if key not in ("seconds", "device")}

    first = probed(model, 0, tokenizer)
    assert probed(tiny_bert(arch).eval(), 0, tokenizer) == first
    assert probed(checkpoint, 0) == first
    assert probed(model, 1, tokenizer)["metrics"]["stsb"] != first["metrics"]["stsb"]


@pytest.mark.slow
@pytest.mark.subprocess
@requires_shared_data
def test_probe_separation_smoke_run_prints_both_probes_against_random_init(wiki_slice_dir, slice_cache, tmp_path):
    out = tmp_path / "separation.jsonl"
    command = [sys.executable, str(ROOT / "benchmarks" / "probe_separation.py"), "--data", str(wiki_slice_dir),
               "--cache-dir", str(slice_cache), "--arch-overrides", '{"layers": 1, "hidden": 32, "heads": 2}',
               "--budget", "1e10flops", "--seeds", "2", "--tasks", "rte", "--max-train-examples", "100",
               "--finetune-examples", "32", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    table = [line for line in lines if line.startswith(("| linear |", "| finetune |"))]
    assert [line.split(" | ")[1] for line in table] == ["rte", "average", "rte", "average"]
    assert any(line.startswith("mean validation MLM loss") for line in lines)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["key"] for row in rows) == sorted(
        ["cram|0", "cram|1"] + [f"{kind}|{group}|{seed}" for kind in ("linear", "finetune")
                                for group in ("pretrained", "random") for seed in (0, 1)])
    again = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "crammed seed" not in again.stdout and " probe, " not in again.stdout
    assert len(out.read_text().splitlines()) == len(rows)  # resumed: nothing run twice
