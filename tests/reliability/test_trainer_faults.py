"""Faults in the trainer itself: out of memory that halving cannot cure, and a checkpoint write that
fails (a full disk) in the library and in `python -m trainer.cram`."""

from __future__ import annotations

import errno
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB, cli_env, requires_shared_data, slice_config
from trainer.budget import Budget
from trainer.checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint
from trainer.config import TrainConfig
from trainer.cram import cram
from trainer.loop import OutOfMemory
from trainer.model import CrammedBert

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)


@requires_shared_data
@pytest.mark.slow
def test_out_of_memory_at_micro_batch_one_fails_with_a_clear_reason(wiki_slice):
    tried = []

    def no_memory(rows: int) -> None:
        tried.append(rows)
        raise torch.OutOfMemoryError("simulated")

    with pytest.raises(OutOfMemory) as info:
        cram(ARCH, TrainConfig(batch_size=16, micro_batch=8), wiki_slice, Budget.parse("1e4tokens"),
             before_forward=no_memory)
    assert tried == [8, 4, 2, 1]  # halved down to one row, then given up
    assert str(info.value) == ("out of cpu memory even at micro_batch 1 (halved 3 times from 8); "
                               "choose a smaller architecture or max_seq_len")
    assert isinstance(info.value, torch.OutOfMemoryError)  # still an out-of-memory for generic handlers


def write(out: Path, after_write=None, result: dict | None = None) -> Path:
    tokenizer = out.parent / "tokenizer-source.json"  # a stand-in with the architecture's vocabulary size
    Tokenizer(WordLevel({f"w{i}": i for i in range(ARCH.vocab_size)}, unk_token="w0")).save(str(tokenizer))
    model = CrammedBert(ARCH)
    return save_checkpoint(out, model, ARCH, TrainConfig(), tokenizer, result or {"run": 1}, after_write)


def disk_full_at(name: str):
    def fail(path: Path) -> None:
        if path.name.startswith(f".{name}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return fail


def test_a_full_disk_leaves_no_half_written_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    with pytest.raises(CheckpointWriteError) as info:
        write(out, disk_full_at("model.safetensors"))
    assert str(info.value) == f"checkpoint write failed: No space left on device ({out / 'model.safetensors'})"
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert list(out.iterdir()) == []  # the other files were written, but only under temporary names


def test_a_failed_rewrite_keeps_the_previous_checkpoint_whole(tmp_path):
    out = write(tmp_path / "ckpt", result={"run": 1})
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    with pytest.raises(CheckpointWriteError, match=r"No space left on device \(.*result.json\)"):
        write(out, disk_full_at("result.json"), result={"run": 2})
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    model, _ = load_checkpoint(out)
    assert model.num_params() == CrammedBert(ARCH).num_params()


@requires_shared_data
@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_reports_a_failed_checkpoint_write_in_one_line(wiki_slice_dir, wiki_slice, slice_cache, tmp_path):
    """A real failing write: the CLI runs with a 300 KB file-size limit (RLIMIT_FSIZE; Python
    ignores SIGXFSZ, so writes past it fail with EFBIG), which the tokenizer fits and the weights
    do not. The slice is prepared already (`slice_cache`): the CLI only reads its cache."""
    assert wiki_slice.from_cache
    limit = 300_000
    assert wiki_slice.tokenizer_path.stat().st_size < limit
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "trainer.cram", "--config", str(slice_config(tmp_path)), "--budget", "2e3tokens",
         "--data", str(wiki_slice_dir), "--out", str(out), "--cache-dir", str(slice_cache)],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    # The first write after training is the resumable checkpoint's (trainer/resume.py), weights first.
    written = re.escape(str(out / "checkpoints"))
    assert len(errors) == 1 and re.fullmatch(rf"error: checkpoint write failed: File too large \({written}/step-\d+/"
                                             r"model\.safetensors\)", errors[0]), done.stderr
    assert "Traceback" not in done.stderr
    assert list(out.iterdir()) == []
