"""`TrialSpec`: everything one trial needs, typed, and the plain dict it travels as through Ray;
`StudyPlan`: everything a study needs, checked (built by `search.run`, run by `search.study.driver`,
shown by `search.study.view`).

`search.run` builds the study's template (no architecture yet), `search.study.searcher` makes each
trial's spec with `for_trial`, Ray hands `to_dict()` to the worker and `search.study.trial` reads it back
with `from_dict`. `Probe` is what the GLUE probe runs, shared with `search.confirm`.

Kept free of torch and Ray, so that `search.run` checks its flags before either is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.config import TrainConfig

if TYPE_CHECKING:  # StudyPlan's field types only: this module stays importable without Optuna
    import optuna

    from search.base.objectives import Objective
    from space.search_space import SearchSpace


@dataclass(frozen=True)
class Probe:
    """GLUE tasks and the `glue.ProbeLimits` keyword arguments (data_dir included) of a probe."""

    tasks: tuple[str, ...]
    limits: Mapping[str, Any]

    def with_seed(self, seed: int) -> Probe:
        return Probe(self.tasks, {**self.limits, "seed": seed})

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks), "limits": dict(self.limits)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Probe | None:
        return None if data is None else cls(tuple(data["tasks"]), dict(data["limits"]))


@dataclass(frozen=True)
class TrialSpec:
    """One trial: what to train, how long, on what data, how to probe it, where to write.

    `arch` and `trial_number` are None in the study's template. A repeat (`repeat_of`, the trial
    that trained this architecture) reports `recorded`, the original's metrics, instead of training.
    """

    train: TrainConfig
    budget: Budget
    data_fingerprint: str  # the prepared corpus every trial opens (trainer.data.open_prepared)
    data_dir: str | None = None  # absolute: Ray workers run in another working directory
    corpus: str | None = None  # a hub dataset id, instead of data_dir
    cache_dir: str | None = None
    probe: Probe | None = None  # None: no GLUE probe (objective mlm)
    checkpoint_dir: str | None = None  # search.run --save-checkpoints: <checkpoint_dir>/t0007/
    arch: ArchConfig | None = None
    trial_number: int | None = None
    repeat_of: int | None = None
    recorded: Mapping[str, float] = field(default_factory=dict)

    def for_trial(self, number: int, arch: ArchConfig, repeat_of: int | None = None,
                  recorded: Mapping[str, float] | None = None) -> TrialSpec:
        return dataclasses.replace(self, trial_number=number, arch=arch, repeat_of=repeat_of,
                                   recorded=dict(recorded or {}))

    def checkpoint_path(self) -> Path | None:
        """Where this trial writes its checkpoint, when the study saves them."""
        if self.checkpoint_dir is None or self.trial_number is None:
            return None
        return Path(self.checkpoint_dir) / f"t{self.trial_number:04d}"

    def to_dict(self) -> dict[str, Any]:
        """Plain values only: what Ray Tune passes to the worker (and copies into its results)."""
        return {"train": self.train.to_dict(), "budget": self.budget.text, "data_fingerprint": self.data_fingerprint,
                "data_dir": self.data_dir, "corpus": self.corpus, "cache_dir": self.cache_dir,
                "probe": self.probe.to_dict() if self.probe else None, "checkpoint_dir": self.checkpoint_dir,
                "arch": self.arch.to_dict() if self.arch else None, "trial_number": self.trial_number,
                "repeat_of": self.repeat_of, "recorded": dict(self.recorded)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialSpec:
        return cls(train=TrainConfig.from_dict(dict(data["train"])), budget=Budget.parse(data["budget"]),
                   data_fingerprint=data["data_fingerprint"], data_dir=data["data_dir"], corpus=data["corpus"],
                   cache_dir=data["cache_dir"], probe=Probe.from_dict(data["probe"]),
                   checkpoint_dir=data["checkpoint_dir"],
                   arch=ArchConfig.from_dict(dict(data["arch"])) if data["arch"] is not None else None,
                   trial_number=data["trial_number"], repeat_of=data["repeat_of"], recorded=dict(data["recorded"]))


@dataclass
class StudyPlan:
    """Everything a study needs, checked: built before Ray starts."""

    study: str
    optuna_study: optuna.Study
    resume: bool
    trials: int
    controller: str
    objective: Objective
    space: SearchSpace
    space_path: Path
    budget: Budget
    template: TrialSpec  # what every trial gets, before its own arch (`TrialSpec.for_trial`)
    resources: dict[str, float]
    max_concurrent: int | None  # --max-concurrent; None: as many as the resources allow (search.study.driver)
    early_stop: dict[str, Any] | None
    tracking_uri: str
    storage: str
    address: str | None
    seed: int
    executor: str = "ray"  # search.run --executor: "ray" (search.study.ray_executor) or "local" (search.study.local_executor)
    # The prepared data's references (trainer/references.py): what every trial's loss is read
    # against. None only for a plan built without data.
    unigram_floor: float | None = None
    corruption_floor: float | None = None
    context_reference: float | None = None
    # The flags that resume it, where they are not `--study NAME --resume --trials N`: a screened
    # study's stages resume together (search.study.screen).
    resume_flags: str | None = None

    def resume_command(self) -> str:
        return f"python -m search.run {self.resume_flags or f'--study {self.study} --resume --trials {self.trials}'}"
