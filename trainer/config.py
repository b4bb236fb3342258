"""Training settings and the run-config file (`trainer/configs/*.yaml`).

A run config is `name`, `arch` (an `ArchConfig`), `train` (a `TrainConfig`) and an optional
`provenance` (what `search.export` records: study, run id, score, budget). Loaded with
`yaml.safe_load`; an unknown key is an error naming the file, the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from space.arch import ArchConfig, ArchError, yaml_number_hint
from space.errors import CramnasError


class ConfigError(CramnasError):
    pass


@dataclass(frozen=True)
class TrainConfig:
    """Cramming's final recipe (`bert-o4`) by default; the batch sizes are for a GPU."""

    lr: float = 1e-3
    weight_decay: float = 0.01  # none on norms, biases and scalars
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-12
    batch_size: int = 8192  # target sequences per optimizer step, reached by the ramp
    micro_batch: int = 128  # sequences per forward/backward
    batch_ramp: float = 0.6  # fraction of the budget at which batch_size is reached
    lr_base: float = 0.25  # one-cycle triangle: starts at lr_base x lr ...
    lr_peak_at: float = 0.75  # ... peaks here, then falls to 0 at the end of the budget
    gradient_clip: float = 0.5
    mlm_rate: float = 0.25  # masked with the 80/10/10 rule; only these tokens are predicted
    dropout: float = 0.0  # Cramming pretrains without dropout
    seed: int = 0
    compile: bool = False  # torch.compile: worth it on GPUs, 0-4% on CPU (docs/stack.md)
    report_every: float = 1 / 16  # progress callback cadence, as a fraction of the budget
    # Recovery from a diverging step (trainer/rollback.py): a non-finite loss, or one above
    # spike_factor x the recent median (generous: divergence, not noise; 0 turns it off), returns
    # to the copy kept every snapshot_every steps; the run fails after max_rollbacks of them.
    spike_factor: float = 4.0
    max_rollbacks: int = 3
    snapshot_every: int = 100

    def __post_init__(self) -> None:
        self._check_types()
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        positive = ("lr", "eps", "batch_size", "micro_batch", "gradient_clip", "report_every", "snapshot_every")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name}: must be positive, got {getattr(self, name)}")
        if not 0 < self.mlm_rate < 1:
            raise ConfigError(f"train.mlm_rate: must be in (0, 1), got {self.mlm_rate}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"train.dropout: must be in [0, 1), got {self.dropout}")
        if not 0 < self.lr_peak_at < 1 or not 0 <= self.lr_base <= 1:
            raise ConfigError("train.lr_peak_at must be in (0, 1) and train.lr_base in [0, 1]")
        # Checked here because AdamW and numpy's seeding would refuse them only once training starts.
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ConfigError(f"train.betas: each must be in [0, 1), got {list(self.betas)}")
        if self.seed < 0:
            raise ConfigError(f"train.seed: must not be negative, got {self.seed}")
        if self.max_rollbacks < 0:
            raise ConfigError(f"train.max_rollbacks: must not be negative, got {self.max_rollbacks}")
        if self.spike_factor != 0 and self.spike_factor <= 1:
            raise ConfigError(f"train.spike_factor: must be above 1 (or 0: off), got {self.spike_factor}")

    def _check_types(self) -> None:
        """Each setting has its default's type, so that a wrong one is named rather than failing
        later in a comparison or in the optimizer."""
        for spec in fields(self):
            value, default = getattr(self, spec.name), spec.default
            if isinstance(default, bool):
                ok, expected = isinstance(value, bool), "true or false"
            elif isinstance(default, int):
                ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
            elif isinstance(default, float):
                ok, expected = _is_finite_number(value), "a finite number"
            else:  # betas
                ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_finite_number, value))
                expected = "two numbers, e.g. [0.9, 0.98]"
            if not ok:
                hint = yaml_number_hint(value) if isinstance(default, float) else ""  # its fix writes a float
                raise ConfigError(f"train.{spec.name}: expected {expected}, got {value!r}{hint}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "train") -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown training setting; allowed: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except ConfigError as error:  # "train.lr: ..." becomes "<where>.lr: ...", the file named
            raise ConfigError(f"{where}{str(error).removeprefix('train')}") from None


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class RunConfig:
    name: str
    arch: ArchConfig
    train: TrainConfig
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {"name": self.name, "arch": self.arch.to_dict(), "train": self.train.to_dict()}
        if self.provenance:
            data["provenance"] = self.provenance
        return data

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; see trainer/configs/ for examples")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path.name}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name}: expected a mapping with name, arch and train")
    for section in ("arch", "train", "provenance"):
        if not isinstance(data.get(section) or {}, dict):
            raise ConfigError(f"{path.name}: {section}: expected a mapping of settings, "
                              f"got {type(data[section]).__name__}; see trainer/configs/ for examples")
    unknown = sorted(set(data) - {"name", "arch", "train", "provenance"})
    if unknown:
        raise ConfigError(f"{path.name}: {unknown[0]}: unknown key; allowed: name, arch, train, provenance")
    try:
        arch = ArchConfig.from_dict(data.get("arch") or {})
    except (ArchError, TypeError) as error:
        raise ConfigError(f"{path.name}: arch.{error}") from None
    train = TrainConfig.from_dict(data.get("train") or {}, where=f"{path.name}: train")
    return RunConfig(str(data.get("name", path.stem)), arch, train, data.get("provenance") or {})
