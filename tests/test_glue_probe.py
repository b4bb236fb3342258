"""The GLUE probe and `python -m glue.evaluate` on a tiny crammed checkpoint."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from glue import DEFAULT_PROBE_TASKS, ProbeLimits, probe
from glue.evaluate import main
from glue.tasks import METRIC_RANGES, TASKS, GlueError
from space.arch import ArchConfig
from tests.helpers import SHARED_DATA, SLICE_SEQ, SLICE_VOCAB, requires_shared_data
from trainer.budget import Budget
from trainer.checkpoint import load_checkpoint
from trainer.config import TrainConfig
from trainer.cram import cram
from trainer.tokenizer import train_wordpiece

pytestmark = requires_shared_data

ARCH = ArchConfig(layers=2, hidden=64, heads=4, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
# Small enough that no run reaches the time cap: results are then exactly reproducible.
LIMITS = ProbeLimits(max_train_examples=64, max_seconds_per_task=30, batch_size=16, data_dir=SHARED_DATA)


@pytest.fixture(scope="module")
def tiny_checkpoint(wiki_slice, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("glue") / "tiny"
    cram(ARCH, TrainConfig(batch_size=32, micro_batch=8, seed=0), wiki_slice, Budget.parse(f"{64 * SLICE_SEQ}tokens"),
         out_dir=out)
    return out


@pytest.fixture
def tiny_rte(tmp_path) -> Path:
    """DATA with a 32-row RTE train split and a 16-row validation split, and QNLI's validation only."""
    source = SHARED_DATA / "glue"
    for task, split, rows in (("rte", "train", 32), ("rte", "validation", 16), ("qnli", "validation", 16)):
        (tmp_path / "glue" / task).mkdir(parents=True, exist_ok=True)
        frame = pd.read_parquet(source / task / f"{split}.parquet").head(rows)
        frame.to_parquet(tmp_path / "glue" / task / f"{split}.parquet")
    return tmp_path


@pytest.mark.slow
def test_probe_of_a_tiny_checkpoint_scores_every_metric_within_its_range(tiny_checkpoint):
    result = probe(tiny_checkpoint, limits=LIMITS)
    assert result.tasks == list(DEFAULT_PROBE_TASKS) and result.protocol == "probe"
    assert set(result.metrics) == set(DEFAULT_PROBE_TASKS)
    for entry, values in result.metrics.items():
        task = TASKS[entry]
        assert set(values) == set(task.metrics)
        for name, value in values.items():
            low, high = METRIC_RANGES[name]
            assert math.isfinite(value) and low <= value <= high, (entry, name, value)
        assert result.scores[entry] == values[task.main_metric]
    assert result.average == pytest.approx(np.mean(list(result.scores.values())))
    assert f"{len(DEFAULT_PROBE_TASKS)} of the 9 GLUE entries" in result.average_over
    assert result.train_examples == {name: 64 for name in DEFAULT_PROBE_TASKS}
    assert all(run[0]["examples_seen"] == 64 and run[0]["stopped_by"] == "epochs" for run in result.runs.values())
    assert result.seconds["total"] >= sum(result.seconds[name] for name in DEFAULT_PROBE_TASKS)
    json.dumps(result.to_dict())  # what the search logs


@pytest.mark.slow
def test_an_in_memory_model_probes_exactly_like_its_checkpoint(tiny_checkpoint):
    model, tokenizer = load_checkpoint(tiny_checkpoint)
    from_memory = probe(model, tokenizer, tasks=["stsb"], limits=LIMITS)
    from_disk = probe(tiny_checkpoint, tasks="stsb", limits=LIMITS)
    assert from_memory.metrics == from_disk.metrics
    other_seed = probe(tiny_checkpoint, tasks="stsb", limits=dataclasses.replace(LIMITS, seed=1))
    assert other_seed.metrics != from_disk.metrics


def test_the_time_cap_ends_training_and_the_schedule(tiny_checkpoint):
    limits = ProbeLimits(max_train_examples=64, max_seconds_per_task=1e-9, batch_size=16, data_dir=SHARED_DATA)
    run = probe(tiny_checkpoint, tasks="rte", limits=limits).runs["rte"][0]
    assert run["stopped_by"] == "time" and run["steps"] == 1


def test_bad_probe_inputs_are_clear_errors(tiny_checkpoint, tiny_rte, tmp_path):
    model, _ = load_checkpoint(tiny_checkpoint)
    with pytest.raises(GlueError, match="unknown GLUE task 'wnli'"):
        probe(tiny_checkpoint, tasks="rte,wnli", limits=LIMITS)
    with pytest.raises(GlueError, match="nowhere lacks model.safetensors.*trainer.cram"):
        probe(tmp_path / "nowhere", limits=LIMITS)
    with pytest.raises(GlueError, match="needs its tokenizer"):
        probe(model, limits=LIMITS)
    with pytest.raises(GlueError, match=r"task sst2: missing .*sst2/train.parquet"):
        probe(tiny_checkpoint, tasks="rte,sst2", limits=ProbeLimits(data_dir=tiny_rte))
    other = tmp_path / "other.json"
    train_wordpiece(["some other text"] * 10, vocab_size=100, normalization="cramming").save(str(other))
    with pytest.raises(GlueError, match="has 100 tokens but the model's vocab_size is 2048"):
        probe(model, other, tasks="rte", limits=LIMITS)


# ---- the CLI ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_probe_on_rte_prints_the_table_and_writes_glue_json(tiny_checkpoint, capsys):
    code = main(["--checkpoint", str(tiny_checkpoint), "--protocol", "probe", "--tasks", "rte",
                 "--data", str(SHARED_DATA), "--max-train-examples", "64"])
    out = capsys.readouterr().out
    assert code == 0
    record = json.loads((tiny_checkpoint / "glue.json").read_text())
    assert record["protocol"] == "probe" and record["tasks"] == ["rte"]
    assert 0 <= record["scores"]["rte"] <= 1 and record["average"] == record["scores"]["rte"]
    assert "1 of the 9 GLUE entries (rte)" in record["average_over"]
    assert "accuracy" in out and "average" in out and "glue.json" in out


def test_cli_available_runs_what_is_present_and_says_what_it_skips(tiny_checkpoint, tiny_rte, capsys):
    code = main(["--checkpoint", str(tiny_checkpoint), "--protocol", "probe", "--tasks", "available",
                 "--data", str(tiny_rte)])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads((tiny_checkpoint / "glue.json").read_text())["tasks"] == ["rte"]
    assert "skipping qnli: validation only" in out and "skipping sst2: missing" in out


@pytest.mark.slow
def test_cli_sane_protocol_reports_the_median_over_seeds(tiny_checkpoint, tiny_rte, capsys):
    code = main(["--checkpoint", str(tiny_checkpoint), "--protocol", "sane", "--seeds", "3", "--tasks", "rte",
                 "--data", str(tiny_rte)])
    assert code == 0, capsys.readouterr().err
    record = json.loads((tiny_checkpoint / "glue.json").read_text())
    runs = record["runs"]["rte"]
    assert [run["seed"] for run in runs] == [0, 1, 2]
    assert all(run["steps"] == 5 * 2 for run in runs)  # 5 epochs of 32 rows in batches of 16
    assert record["metrics"]["rte"]["accuracy"] == pytest.approx(np.median([r["metrics"]["rte"]["accuracy"]
                                                                            for r in runs]))
    assert record["settings"]["lr"] == 4e-5 and record["settings"]["max_train_examples"] is None


def bad_cli_inputs(checkpoint: Path, data: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, text the one error line must contain)."""
    mismatched = tmp_path / "mismatched"
    shutil.copytree(checkpoint, mismatched)
    train_wordpiece(["some other text"] * 10, vocab_size=100, normalization="cramming").save(
        str(mismatched / "tokenizer.json"))
    probe_args = ["--protocol", "probe", "--data", str(data)]
    return {
        "unknown task": (["--checkpoint", str(checkpoint), "--tasks", "rte,wnli", *probe_args], "wnli"),
        "missing checkpoint": (["--checkpoint", str(tmp_path / "nope"), "--tasks", "rte", *probe_args], "nope"),
        "incomplete checkpoint": (["--checkpoint", str(tmp_path), "--tasks", "rte", *probe_args], "lacks"),
        "tokenizer of another vocabulary": (["--checkpoint", str(mismatched), "--tasks", "rte", *probe_args],
                                            "vocab_size is 2048"),
        "task absent from the data": (["--checkpoint", str(checkpoint), "--tasks", "rte,mrpc", *probe_args],
                                      "mrpc/train.parquet"),
        "validation-only task": (["--checkpoint", str(checkpoint), "--tasks", "qnli", *probe_args], "validation only"),
        "no seeds": (["--checkpoint", str(checkpoint), "--tasks", "rte", "--seeds", "0", *probe_args], "seed"),
        "no training examples": (["--checkpoint", str(checkpoint), "--tasks", "rte", "--max-train-examples", "0",
                                  *probe_args], "max_train_examples must be positive"),
        "missing data dir": (["--checkpoint", str(checkpoint), "--tasks", "rte", "--protocol", "probe", "--data",
                              str(tmp_path / "nodata")], "nodata"),
    }


@pytest.mark.parametrize("case", ["unknown task", "missing checkpoint", "incomplete checkpoint",
                                  "tokenizer of another vocabulary", "task absent from the data",
                                  "validation-only task", "no seeds", "no training examples", "missing data dir"])
def test_cli_bad_input_exits_2_with_one_line_before_fine_tuning(case, tiny_checkpoint, tiny_rte, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setattr("glue.runner.finetune", _no_fine_tuning)
    args, expected = bad_cli_inputs(tiny_checkpoint, tiny_rte, tmp_path)[case]
    code = main(args)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2
    assert len(errors) == 1 and "Traceback" not in err, err
    assert expected in errors[0]


def _no_fine_tuning(*args, **kwargs):
    raise AssertionError("fine-tuning started despite bad input")
