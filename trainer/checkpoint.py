"""Checkpoint directories: safetensors weights, the configs that rebuild the model, the tokenizer.

    out/model.safetensors  arch.yaml  train.yaml  tokenizer.json  result.json

This is the final checkpoint, written once at the end of a cram; the resumable ones a long cram
writes on the way are trainer/resume.py's (`save_resumable`). Weights go through safetensors only
(no pickle); tied embeddings are stored once. Writes are atomic and checked for a full disk
(`save_checkpoint`, through `trainer.atomic`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from tokenizers import Tokenizer

from space.arch import ArchConfig, ArchError
from trainer.atomic import atomic_directory
from trainer.config import ConfigError, TrainConfig
from trainer.model import CrammedBert

FILES = ("model.safetensors", "arch.yaml", "train.yaml", "tokenizer.json")


def check_writable(out_dir: str | Path) -> Path:
    """Fail now, before training, if the checkpoint could not be written later."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"--out: cannot write to {out} ({error.strerror}); choose a writable directory") from None
    return out


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions): one line naming the path."""


def save_checkpoint(out_dir, model: CrammedBert, arch: ArchConfig, train: TrainConfig, tokenizer_path,
                    result: dict, after_write: Callable[[Path], None] | None = None) -> Path:
    """Write the final checkpoint into `out_dir` so that a failure leaves no half-written file behind.

    Every file goes to a temporary name in `out_dir` and is synced to disk; only once all are
    written are they renamed into place (`atomic_directory`'s "merge", weights last), so `out_dir`
    holds either the new checkpoint or what it held before. A failed write (ENOSPC: the disk is
    full) removes the temporary files and raises `CheckpointWriteError`. `after_write` is called
    with each temporary file once written: fault injection raises `OSError` there (search trials'
    `diskfull@N`).
    """
    out = Path(out_dir)
    contents: dict[str, Callable[[Path], None]] = {
        "arch.yaml": lambda path: path.write_text(yaml.safe_dump(arch.to_dict(), sort_keys=False)),
        "train.yaml": lambda path: path.write_text(yaml.safe_dump(train.to_dict(), sort_keys=False)),
        "tokenizer.json": lambda path: shutil.copyfile(tokenizer_path, path),
        "result.json": lambda path: path.write_text(json.dumps(result, indent=2)),
        # Last to land: a directory with model.safetensors holds a complete checkpoint.
        "model.safetensors": lambda path: save_weights(model, path),
    }
    target = out
    try:
        with atomic_directory(out, if_exists="merge") as staged:
            for name, write in contents.items():
                target = out / name
                staged.write(name, write)
                if after_write is not None:
                    after_write(staged.path(name))
    except OSError as error:
        raise CheckpointWriteError(f"checkpoint write failed: {error.strerror or error} ({target})") from error
    return out


@contextlib.contextmanager
def safetensors_os_errors() -> Iterator[None]:
    """safetensors' I/O errors (a full disk) are not OSErrors: make them one."""
    try:
        yield
    except SafetensorError as error:
        code = re.search(r"os error (\d+)", str(error))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1]))) from error


def save_weights(model: torch.nn.Module, path: Path) -> None:
    with safetensors_os_errors():
        save_model(model, str(path))


def load_checkpoint(path: str | Path, dropout: float = 0.0) -> tuple[CrammedBert, Path]:
    """The model of a checkpoint directory (eval mode, CPU) and its tokenizer.json path."""
    path = Path(path)
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing:
        raise ConfigError(f"checkpoint: {path} lacks {', '.join(missing)}; pass a directory written by trainer.cram")
    # Each check names the file at fault: an edited or mixed-up checkpoint is one line, not a traceback.
    try:
        arch = ArchConfig.from_dict(yaml.safe_load((path / "arch.yaml").read_text()))
    except (yaml.YAMLError, ArchError, TypeError) as error:
        raise ConfigError(f"checkpoint: {path / 'arch.yaml'}: {_one_line(error)}; restore the arch.yaml that "
                          "trainer.cram wrote with these weights") from None
    tokenizer = path / "tokenizer.json"
    try:
        tokens = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception for an invalid file
        raise ConfigError(f"checkpoint: cannot read {tokenizer} ({_one_line(error)}); restore the tokenizer.json "
                          "the checkpoint was trained with") from None
    if tokens != arch.vocab_size:
        raise ConfigError(f"checkpoint: {tokenizer} has {tokens} tokens but the model's vocab_size is "
                          f"{arch.vocab_size} (arch.yaml); restore the tokenizer.json the checkpoint was trained with")
    model = CrammedBert(arch, dropout=dropout)
    try:
        load_model(model, str(path / "model.safetensors"))
    except (RuntimeError, SafetensorError) as error:
        raise ConfigError(f"checkpoint: {path / 'model.safetensors'} does not hold the weights arch.yaml describes "
                          f"({_one_line(error)}); pass a directory written by trainer.cram, unchanged") from None
    return model.eval(), tokenizer


def _one_line(error: BaseException) -> str:
    """The telling line of a library's message (torch's first line is only a heading)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]
