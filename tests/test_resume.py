"""Long crams: resumable checkpoints, exact resume, Ctrl-C/SIGTERM, damaged checkpoints, the
epochs a budget reads and the warning when it would repeat the corpus."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB, cli_env, slice_config
from trainer import resume
from trainer.budget import Budget
from trainer.checkpoint import CheckpointWriteError
from trainer.config import TrainConfig
from trainer.cram import cram_with_model, main
from trainer.epochs import corpus_tokens, measure_speed, repeat_warning
from trainer.loop import LoopState
from trainer.model import CrammedBert
from trainer.resume import Interrupted, LongRun, ResumeError, checkpoint_dirs, latest_checkpoint, parse_every

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
# Micro-batches of 4 rows ramping to steps of 4 of them; a report (a loss-curve point) every step.
TRAIN = TrainConfig(batch_size=16, micro_batch=4, seed=5, report_every=1e-3)
MICRO_BATCHES = 60
BUDGET = Budget.parse(f"{MICRO_BATCHES * 4 * SLICE_SEQ}tokens")
# Forward passes after which a stop is requested: mid-step and on a step boundary alike.
STOPS = random.Random(14).sample(range(1, MICRO_BATCHES - 1), 3)


@contextlib.contextmanager
def single_thread():
    """Bit-equal weights need the same reduction order: the same thread count on both sides."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def one_thread():
    with single_thread():
        yield


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.fixture(scope="module")
def uninterrupted(wiki_slice, tmp_path_factory):
    """The reference: the whole budget in one go, a checkpoint every 3000 tokens and at the end."""
    out = tmp_path_factory.mktemp("uninterrupted")
    with single_thread():
        model, result = cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET, out_dir=out,
                                        long_run=LongRun(checkpoint_every=Budget.parse("3000tokens")))
    return model, result, out


# ---- exact resume ------------------------------------------------------------------------------

@pytest.mark.parametrize("stop_after", STOPS)
def test_interrupted_and_resumed_run_ends_with_the_same_weights(stop_after, wiki_slice, uninterrupted, tmp_path):
    reference, expected, _ = uninterrupted
    stop, forwards = threading.Event(), []

    def count(rows: int) -> None:
        forwards.append(rows)
        if len(forwards) == stop_after:
            stop.set()

    with pytest.raises(Interrupted) as info:
        cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET, out_dir=tmp_path, before_forward=count,
                        long_run=LongRun(stop=stop))
    assert info.value.checkpoint == latest_checkpoint(tmp_path, pytest.fail).path
    model, result = cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET, out_dir=tmp_path,
                                    long_run=LongRun(resume_from=latest_checkpoint(tmp_path, pytest.fail)))
    assert same_weights(model, reference), f"stopped after forward {stop_after}"
    assert (result.tokens, result.steps, result.micro_steps) == (expected.tokens, expected.steps, expected.micro_steps)
    assert result.loss_curve == expected.loss_curve and result.validation_loss == expected.validation_loss


def test_batches_from_a_start_row_go_on_in_the_same_order(wiki_slice):
    tiny = dataclasses.replace(wiki_slice, train=np.arange(30).reshape(10, 3))  # epochs end inside batches
    stream = list(itertools.islice(tiny.batches(4, seed=3), 20))
    for drawn in range(20):
        again = itertools.islice(tiny.batches(4, seed=3, start=4 * drawn), 20 - drawn)
        assert all(torch.equal(a, b) for a, b in zip(again, stream[drawn:], strict=True)), drawn


def test_the_last_two_checkpoints_are_kept_and_hold_the_run(uninterrupted, wiki_slice):
    _, result, out = uninterrupted
    kept = checkpoint_dirs(out)
    assert len(kept) == 2 and kept[-1].name == f"step-{result.steps:08d}"
    assert sorted(path.name for path in kept[-1].iterdir()) == ["model.safetensors", "optimizer.safetensors",
                                                                "state.json"]
    state = json.loads((kept[0] / "state.json").read_text())
    assert state["run"]["budget"] == BUDGET.text and state["run"]["data_fingerprint"] == wiki_slice.fingerprint
    # The periodic one at the first step boundary past 12000 tokens (15000 was crossed by the last step).
    assert 12000 <= state["progress"]["tokens"] < 12000 + 4 * 4 * SLICE_SEQ


def test_state_json_keeps_its_keys_and_reads_back_as_the_loop_state(uninterrupted):
    _, result, out = uninterrupted
    checkpoint = latest_checkpoint(out, pytest.fail)
    # Format 1's keys, spelled out: checkpoints written before `LoopState` existed must resume.
    assert set(checkpoint.state["progress"]) == {
        "tokens", "steps", "micro_steps", "oom_halvings", "micro_batch", "seconds", "batches_drawn", "next_report",
        "pending_losses", "loss_curve", "validation_curve", "rollbacks", "recent_losses", "rng"}
    state = LoopState.from_dict(checkpoint.progress())
    assert (state.tokens, state.steps, state.micro_steps) == (result.tokens, result.steps, result.micro_steps)
    # The last point may be missing: a periodic checkpoint at the final step is not written again.
    assert state.loss_curve and result.loss_curve[:len(state.loss_curve)] == state.loss_curve
    assert all(type(point) is tuple for point in state.loss_curve)  # JSON's lists made pairs again
    assert LoopState.from_dict(state.to_dict()) == state


def test_resume_with_a_changed_setting_names_it(uninterrupted, wiki_slice):
    _, _, out = uninterrupted
    checkpoint = latest_checkpoint(out, pytest.fail)
    changes = {"arch.hidden": (ARCH.replace(hidden=64), TRAIN, BUDGET),
               "train.lr": (ARCH, TrainConfig(**{**TRAIN.to_dict(), "lr": 5e-4}), BUDGET),
               "budget": (ARCH, TRAIN, Budget.parse("2e5tokens"))}
    for what, (arch, train, budget) in changes.items():
        with pytest.raises(ResumeError, match=rf"^--resume: {what} is .* but .*step-\d+ was trained") as info:
            cram_with_model(arch, train, wiki_slice, budget, long_run=LongRun(resume_from=checkpoint))
        assert "\n" not in str(info.value)


def test_a_run_saved_before_an_arch_field_existed_resumes_with_its_default():
    current = resume.run_record(ARCH, TRAIN, BUDGET, "data")
    saved = {**current, "arch": {k: v for k, v in current["arch"].items() if k not in ("local_window", "global_every")}}
    resume.check_same_run(saved, ARCH, TRAIN, BUDGET, "data", Path("step-1"))
    with pytest.raises(ResumeError, match=r"^--resume: arch.local_window is 4 but step-1 was trained with 0;"):
        resume.check_same_run(saved, ARCH.replace(local_window=4), TRAIN, BUDGET, "data", Path("step-1"))


def test_a_half_written_or_damaged_checkpoint_is_refused_in_one_line(uninterrupted, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted[2], out)
    older, newest = checkpoint_dirs(out)
    (out / "checkpoints" / f".{newest.name}.tmp-99").mkdir()  # a writer killed mid-way: ignored
    with open(newest / "model.safetensors", "r+b") as weights:  # a flipped byte
        weights.seek(200)
        byte = weights.read(1)
        weights.seek(200)
        weights.write(bytes([byte[0] ^ 0xFF]))
    warnings = []
    assert latest_checkpoint(out, warnings.append).path == older
    assert warnings == [f"warning: refusing checkpoint {newest}: model.safetensors does not match its checksum; "
                        "trying the one before"]
    (older / "state.json").unlink()
    with pytest.raises(ResumeError, match="no intact checkpoint"):
        latest_checkpoint(out, warnings.append)
    assert warnings[-1].endswith("state.json unreadable (FileNotFoundError); trying the one before")


def test_a_full_disk_leaves_the_previous_checkpoints_alone(uninterrupted, tmp_path, monkeypatch):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted[2], out)
    before = {path: sorted(file.name for file in path.iterdir()) for path in checkpoint_dirs(out)}

    def no_space(tensors, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(resume, "save_file", no_space)
    model = CrammedBert(ARCH)
    with pytest.raises(CheckpointWriteError) as info:
        resume.save_resumable(out, model, torch.optim.AdamW(model.parameters()), {},
                          {"steps": 99, "rng": resume.capture_rng(torch.Generator())})
    assert str(info.value) == ("checkpoint write failed: No space left on device "
                               f"({out / 'checkpoints' / 'step-00000099' / 'optimizer.safetensors'})")
    assert {path: sorted(file.name for file in path.iterdir()) for path in checkpoint_dirs(out)} == before
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == [path.name for path in before]


def test_intervals_parse_like_budgets_or_off():
    assert parse_every("30m", "--checkpoint-every") == Budget("seconds", 1800.0, "30m")
    assert parse_every("off", "--validate-every") is None
    with pytest.raises(ValueError, match="^--validate-every: cannot read 'often'.*or off"):
        parse_every("often", "--validate-every")


def test_intermediate_validation_is_a_curve(wiki_slice):
    _, result = cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET, long_run=LongRun(validate_every=Budget.parse("5000tokens")))
    assert [tokens // 5000 for tokens, _ in result.validation_curve] == [1, 2, 3]  # at the step that crossed each
    assert result.validation_curve[0][1] > result.validation_curve[-1][1]
    assert result.validation_curve[-1][1] == pytest.approx(result.validation_loss)  # the same weights, the same set


# ---- the command line --------------------------------------------------------------------------

def cli(tmp_path: Path, data_dir: Path, cache: Path, *extra: str) -> list[str]:
    return ["--config", str(slice_config(tmp_path)), "--budget", "2e4tokens", "--data", str(data_dir),
            "--cache-dir", str(cache), "--checkpoint-every", "4000tokens", *extra]


@pytest.fixture(scope="module")
def cli_run(wiki_slice_dir, slice_cache, tmp_path_factory) -> Path:
    """The --out directory of a finished `python -m trainer.cram` run."""
    root = tmp_path_factory.mktemp("cli")
    with single_thread():
        assert main(cli(root, wiki_slice_dir, slice_cache, "--out", str(root / "run"))) == 0
    return root / "run"


def test_cli_resumes_past_a_damaged_checkpoint_to_the_same_result(cli_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(cli_run, out)
    newest = checkpoint_dirs(out)[-1]
    with open(newest / "optimizer.safetensors", "r+b") as state:  # a copy cut short
        state.truncate(1000)
    assert main(["--resume", str(out)]) == 0  # its config, budget, data and cache come from the checkpoint
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == [f"warning: refusing checkpoint {newest}: optimizer.safetensors has 1000 bytes, "
                        f"{(checkpoint_dirs(cli_run)[-1] / 'optimizer.safetensors').stat().st_size} expected; "
                        "trying the one before"]
    finished, resumed = (json.loads((run / "result.json").read_text()) for run in (cli_run, out))
    for key in ("tokens", "steps", "validation_loss", "loss_curve", "epochs"):
        assert resumed[key] == finished[key], key


def test_cli_refuses_a_new_run_over_checkpoints_and_a_changed_resume(cli_run, wiki_slice_dir, slice_cache, tmp_path,
                                                                     capsys):
    smaller = tmp_path / "smaller.yaml"
    config = yaml.safe_load(slice_config(tmp_path).read_text())
    config["arch"]["hidden"] = 32
    smaller.write_text(yaml.safe_dump(config))
    cases = {
        "--out": (cli(tmp_path, wiki_slice_dir, slice_cache, "--out", str(cli_run)),
                  f"error: --out: {cli_run} holds the checkpoints of a run; continue it with --resume {cli_run}"),
        "budget": (["--resume", str(cli_run), "--budget", "3e4tokens"],
                   "error: --resume: budget is 3e4tokens but"),
        "arch": (["--resume", str(cli_run), "--config", str(smaller)], "error: --resume: arch.hidden is 32 but"),
        "seed": (["--resume", str(cli_run), "--seed", "9"], "error: --resume: train.seed is 9 but"),
        "empty": (["--resume", str(tmp_path)], f"error: --resume: {tmp_path} holds no checkpoints"),
    }
    before = sorted(path.name for path in checkpoint_dirs(cli_run))
    for name, (argv, message) in cases.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, (name, err)
    assert sorted(path.name for path in checkpoint_dirs(cli_run)) == before


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_writes_a_checkpoint_that_resumes(wiki_slice_dir, slice_cache, wiki_slice, tmp_path):
    out = tmp_path / "run"
    log = (tmp_path / "stdout").open("w"), (tmp_path / "stderr").open("w")
    args = cli(tmp_path, wiki_slice_dir, slice_cache, "--out", str(out))
    args[args.index("2e4tokens")] = "1e8tokens"  # far more than the test waits for
    process = subprocess.Popen([sys.executable, "-m", "trainer.cram", *args], stdout=log[0], stderr=log[1],
                               env=cli_env(OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 300
        while not checkpoint_dirs(out):  # training runs: the signal handlers are in place
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        process.kill()
    err = (tmp_path / "stderr").read_text()
    assert f"stopped by SIGTERM: checkpoint {out / 'checkpoints'}" in err and f"--resume {out}" in err
    checkpoint = latest_checkpoint(out, pytest.fail)
    saved = checkpoint.progress()
    run, stop = checkpoint.run_config(), threading.Event()
    with pytest.raises(Interrupted) as info:  # one more step, then stop again
        cram_with_model(run.arch, run.train, wiki_slice, Budget.parse(checkpoint.run["budget"]), out_dir=out,
                        before_forward=lambda rows: stop.set(), long_run=LongRun(resume_from=checkpoint, stop=stop))
    again = latest_checkpoint(out, pytest.fail).progress()
    assert info.value.checkpoint != checkpoint.path
    assert again["tokens"] > saved["tokens"] and again["steps"] > saved["steps"]
    assert again["loss_curve"][:len(saved["loss_curve"])] == saved["loss_curve"]


# ---- epochs ------------------------------------------------------------------------------------

def test_epochs_are_tokens_over_the_corpus(uninterrupted, wiki_slice):
    _, result, _ = uninterrupted
    assert corpus_tokens(wiki_slice) == len(wiki_slice.train) * SLICE_SEQ
    assert result.epochs == result.tokens / corpus_tokens(wiki_slice)


def test_repeat_warning_names_the_epochs_and_the_fix():
    tokens = Budget.parse("1e6tokens")
    line = repeat_warning(tokens, 250_000, flops_per_token=1.0)
    assert line.startswith("warning: the 1e6tokens budget trains on ~1e+06 tokens, 4.0 times the corpus's 250,000")
    assert "--corpus" in line and "\n" not in line
    assert repeat_warning(tokens, 2_000_000, flops_per_token=1.0) is None
    assert repeat_warning(Budget.parse("1e9flops"), 100, flops_per_token=1e3) .startswith(
        "warning: the 1e9flops budget trains on ~1e+06 tokens, 10000.0 times")
    timed = repeat_warning(Budget.parse("1h"), 1_000_000, flops_per_token=1.0, tokens_per_s=1000.0)
    assert "at ~1,000 tokens/s" in timed and "3.6 times" in timed
    assert repeat_warning(Budget.parse("1h"), 1_000_000, flops_per_token=1.0) is None  # speed unknown


def test_cram_warns_before_the_first_step(wiki_slice, tmp_path):
    stop, lines = threading.Event(), []
    stop.set()  # stopped before any step: whatever was printed came before training
    for budget in (Budget("tokens", 3 * corpus_tokens(wiki_slice), "3x"), Budget.parse("24h")):
        with pytest.raises(Interrupted):
            cram_with_model(ARCH, TRAIN, wiki_slice, budget, out_dir=tmp_path / budget.text,
                            long_run=LongRun(stop=stop, warn=lines.append))
    assert len(lines) == 2 and "3.0 times the corpus's" in lines[0] and "tokens/s (timed before training)" in lines[1]


def test_timing_the_speed_leaves_the_training_state_alone(wiki_slice):
    torch.manual_seed(0)
    model = CrammedBert(ARCH)
    before, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    assert measure_speed(model, wiki_slice, 0.25, 4, torch.device("cpu")) > 0
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
