"""`python -m trainer.cram`: bad input fails in one line before training; a good run writes a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from space import load_space
from tests.helpers import CONFIGS, ROOT, slice_config
from trainer.checkpoint import load_checkpoint
from trainer.config import ConfigError, load_run_config
from trainer.console import floor_gap
from trainer.cram import main


@pytest.mark.parametrize("name", ["crammed-bert", "bert-original", "crammed-bert-cpu", "bert-original-cpu"])
def test_shipped_configs_load(name):
    run = load_run_config(CONFIGS / f"{name}.yaml")
    assert run.name == name
    # A CPU config crams the CPU space's data (its fixed vocabulary and row length), so that it
    # can stand beside a CPU study's trials as a baseline (search.confirm --baselines).
    space = load_space(ROOT / "space" / "spaces" / ("crammed_bert_cpu.yaml" if name.endswith("cpu") else "crammed_bert.yaml"))
    assert (run.arch.vocab_size, run.arch.max_seq_len) == (space.fixed["vocab_size"], space.fixed["max_seq_len"])


def test_crammed_bert_is_cramming_final_architecture():
    arch = load_run_config(CONFIGS / "crammed-bert.yaml").arch
    assert (arch.layers, arch.hidden, arch.heads, arch.ffn_inner) == (16, 768, 12, 1536)
    assert arch.num_params() == pytest.approx(120e6, rel=0.01)  # the paper's ~120M (incl. embeddings)


@pytest.mark.slow
def test_cli_crams_and_writes_a_checkpoint_that_reloads(wiki_slice_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["--config", str(slice_config(tmp_path)), "--budget", "3s", "--data", str(wiki_slice_dir),
                 "--out", str(out), "--seed", "7", "--cache-dir", str(tmp_path / "cache")])
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["seed"] == 7 and result["tokens"] > 0 and result["budget"] == "3s"
    printed = capsys.readouterr().out
    assert "validation MLM loss" in printed
    assert f"unigram floor {result['unigram_floor']:.4f}: {floor_gap(result['nats_below_unigram'], 4)} it" in printed
    model, _ = load_checkpoint(out)
    assert model.num_params() == result["params"]


def bad_inputs(tmp_path: Path, data_dir: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, text the one-line error must contain)."""
    good = str(slice_config(tmp_path))
    unknown_key = tmp_path / "unknown.yaml"
    unknown_key.write_text(yaml.safe_dump({**yaml.safe_load(Path(good).read_text()), "optimiser": {}}))
    unknown_train = tmp_path / "unknown_train.yaml"
    config = yaml.safe_load(Path(good).read_text())
    config["train"]["learning_rate"] = 0.1
    unknown_train.write_text(yaml.safe_dump(config))
    bad_arch = tmp_path / "bad_arch.yaml"
    config = yaml.safe_load(Path(good).read_text())
    config["arch"]["heads"] = 5
    bad_arch.write_text(yaml.safe_dump(config))
    empty = tmp_path / "empty_corpus" / "pretrain" / "empty"
    empty.mkdir(parents=True)
    (empty / "train.txt").write_text("\n\n")
    a_file = tmp_path / "a_file"  # a directory cannot be made below a file, even by root
    a_file.write_text("")
    data = ["--data", str(data_dir)]
    return {
        "missing data dir": (["--config", good, "--data", str(tmp_path / "nowhere")], "nowhere"),
        "empty corpus": (["--config", good, "--data", str(tmp_path / "empty_corpus")], "empty"),
        "unknown budget unit": (["--config", good, "--budget", "5 fortnights", *data], "budget"),
        "config unknown key": (["--config", str(unknown_key), *data], "optimiser"),
        "config unknown train key": (["--config", str(unknown_train), *data], "learning_rate"),
        "impossible architecture": (["--config", str(bad_arch), *data], "heads"),
        "missing config": (["--config", str(tmp_path / "nope.yaml"), *data], "nope.yaml"),
        "unwritable out dir": (["--config", good, *data, "--out", str(a_file / "run")], "--out"),
    }


@pytest.mark.parametrize("case", ["missing data dir", "empty corpus", "unknown budget unit", "config unknown key",
                                  "config unknown train key", "impossible architecture", "missing config",
                                  "unwritable out dir"])
def test_cli_bad_input_fails_in_one_line_before_training(case, wiki_slice_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("trainer.cram.cram", _no_training)
    args, expected = bad_inputs(tmp_path, wiki_slice_dir)[case]
    code = main([*args, "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2
    assert len(errors) == 1 and "Traceback" not in err, err  # (datasets may print a progress line)
    assert expected in errors[0]


def _no_training(*args, **kwargs):
    raise AssertionError("training started despite bad input")


def test_config_error_names_file_and_key(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\narch: {layers: 2, hidden: 64, heads: 4, colour: red}\n")
    with pytest.raises(ConfigError, match=r"x.yaml: arch.colour: unknown architecture field"):
        load_run_config(path)
