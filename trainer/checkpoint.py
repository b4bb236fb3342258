"""Checkpoint directories: safetensors weights, the configs that rebuild the model, the tokenizer.

    out/model.safetensors  arch.yaml  train.yaml  tokenizer.json  result.json

Weights go through safetensors only (no pickle); tied embeddings are stored once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from safetensors.torch import load_model, save_model

from space.arch import ArchConfig
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


def save_checkpoint(out_dir, model: CrammedBert, arch: ArchConfig, train: TrainConfig, tokenizer_path,
                    result: dict) -> Path:
    out = check_writable(out_dir)
    save_model(model, str(out / "model.safetensors"))
    (out / "arch.yaml").write_text(yaml.safe_dump(arch.to_dict(), sort_keys=False))
    (out / "train.yaml").write_text(yaml.safe_dump(train.to_dict(), sort_keys=False))
    shutil.copyfile(tokenizer_path, out / "tokenizer.json")
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return out


def load_checkpoint(path: str | Path, dropout: float = 0.0) -> tuple[CrammedBert, Path]:
    """The model of a checkpoint directory (eval mode, CPU) and its tokenizer.json path."""
    path = Path(path)
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing:
        raise ConfigError(f"checkpoint: {path} lacks {', '.join(missing)}; pass a directory written by trainer.cram")
    arch = ArchConfig.from_dict(yaml.safe_load((path / "arch.yaml").read_text()))
    model = CrammedBert(arch, dropout=dropout)
    load_model(model, str(path / "model.safetensors"))
    return model.eval(), path / "tokenizer.json"
