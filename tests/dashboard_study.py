"""A synthetic cramnas study written straight to its two stores, for dashboard tests: no training.

`write_study` records trials through `search.tracking.tracker.StudyTracker`, exactly as the search does
(study run, nested trial runs, lineage and status tags, final metrics), and the matching Optuna
study in the Optuna store beside the MLflow database (`search.tracking.stores.study_storage`), so that
parameter importance runs on it. The scores are a known function of the architecture, so tests
can assert what the dashboards must find: `position` matters most, `norm_placement` a little,
everything else not at all. `write_confirmations` adds the runs `search.confirm` would write; `scratch_store` gives a store to
write them to.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from search.base.objectives import OBJECTIVES
from search.base.states import STATES
from search.tracking.stores import study_storage
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig

# The searched fields and their choices; every other field keeps a small fixed value.
CHOICES: dict[str, tuple[Any, ...]] = {
    "layers": (2, 3, 4),
    "hidden": (128, 256),
    "ffn_kind": ("gelu", "geglu", "swiglu"),
    "norm_placement": ("pre", "post"),
    "position": ("learned", "rotary", "alibi"),
}
FIXED = {"heads": 4, "vocab_size": 2048, "max_seq_len": 64}
# The true effect of each choice on the probe score (the MLM loss moves the other way).
POSITION_EFFECT = {"learned": 0.0, "rotary": 0.12, "alibi": 0.06}
PLACEMENT_EFFECT = {"pre": 0.02, "post": 0.0}
TRAIN = {"lr": 0.002, "batch_size": 64}
UNIGRAM_FLOOR = 6.95  # the prepared data's unigram floor (trainer/unigram.py), as search.run records it
POPULATION = 6  # evolution: the first trials are random (generation 0), then each has a parent


@dataclass
class Trial:
    number: int
    state: str  # complete, repeat, pruned or failed (the `cramnas.state` tag)
    arch: dict[str, Any]
    metrics: dict[str, float]
    run_id: str = ""
    parent: int | None = None
    mutation: str | None = None
    generation: int | None = None
    reason: str | None = None


@dataclass
class SyntheticStudy:
    uri: str
    name: str
    objective: str
    budget: str
    study_run_id: str
    experiment_id: str
    trials: list[Trial] = field(default_factory=list)

    def by_state(self, *states: str) -> list[Trial]:
        return [t for t in self.trials if t.state in states]


@contextmanager
def scratch_store(prefix: str) -> Iterator[str]:
    """The URI of a new SQLite MLflow store in a temporary directory, on tmpfs where there is one
    (SQLite commits dominate the time to write a study), removed on leaving the block."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        yield f"sqlite:///{root}/mlflow.db"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def score(arch: dict[str, Any], noise: float) -> float:
    return 0.55 + POSITION_EFFECT[arch["position"]] + PLACEMENT_EFFECT[arch["norm_placement"]] + noise


def _arch(values: dict[str, Any]) -> dict[str, Any]:
    return ArchConfig(**FIXED, **values).to_dict()


def _metrics(arch: dict[str, Any], rng: random.Random, probe: bool) -> dict[str, float]:
    """Every metric an objective may rank by; `probe_average` only for a study that probes."""
    probe_score = score(arch, rng.gauss(0, 0.01))
    loss = 7.0 - 4.0 * probe_score + rng.gauss(0, 0.02)
    metrics = {"validation_loss": loss, "unigram_floor": UNIGRAM_FLOOR, "nats_below_unigram": UNIGRAM_FLOOR - loss,
               "tokens": float(rng.randrange(200_000, 400_000)), "seconds": 60.0 + rng.random(),
               "tokens_per_s": 9000.0 / arch["layers"] + rng.gauss(0, 100),
               "params": float(ArchConfig.from_dict(arch).num_params())}
    if probe:
        metrics["probe_average"] = probe_score
    return metrics


def write_study(uri: str, name: str, n_trials: int, *, controller: str = "evolution", objective: str = "probe",
                budget: str = "60s", failed: tuple[int, ...] = (), pruned: tuple[int, ...] = (),
                repeats: tuple[int, ...] = (), seed: int = 0, optuna_store: bool = True,
                floor: bool = True) -> SyntheticStudy:
    """Trials 0..n_trials-1: those in `failed`/`pruned`/`repeats` get that status (a repeat copies
    the previous complete trial's architecture and metrics, as the search's de-duplication does).
    `floor=False`: a study recorded before the unigram floor was (no study setting, no metrics)."""
    rng = random.Random(seed)
    tracker = StudyTracker(uri, name)
    study_run_id = tracker.start_study({"controller": controller, "objective": objective, "budget": budget,
                                        "space": "tests/synthetic", "train": TRAIN,
                                        **({"unigram_floor": UNIGRAM_FLOOR} if floor else {})})
    evolution = controller == "evolution"
    result = SyntheticStudy(uri, name, objective, budget, study_run_id, tracker.experiment_id())
    for number in range(n_trials):
        previous = [t for t in result.trials if t.state == "complete"]
        trial = Trial(number, "complete", {}, {})
        if number in repeats and previous:
            original = previous[-1]
            trial.state, trial.arch, trial.metrics = "repeat", original.arch, dict(original.metrics)
        elif evolution and len(previous) >= POPULATION:
            parent = rng.choice(previous[-POPULATION:])
            key = rng.choice(sorted(CHOICES))
            old = parent.arch[key]
            new = rng.choice([c for c in CHOICES[key] if c != old])
            trial.arch = {**parent.arch, key: new}
            trial.parent, trial.mutation = parent.number, f"{key}: {old} -> {new}"
            trial.generation = parent.generation + 1
        else:
            trial.arch = _arch({key: rng.choice(options) for key, options in CHOICES.items()})
            trial.generation = 0 if evolution else None
        if trial.state != "repeat":
            trial.metrics = _metrics(trial.arch, rng, probe="probe_average" in OBJECTIVES[objective].metrics)
            if not floor:
                del trial.metrics["unigram_floor"], trial.metrics["nats_below_unigram"]
        if number in failed:
            trial.state, trial.reason = "failed", f"RuntimeError: injected fault in trial {number}"
            trial.metrics = {"seconds": 3.0}
        elif number in pruned:
            trial.state, trial.reason = "pruned", "stopped early by ASHA after 4 of its reports"
            trial.metrics = {"tokens": trial.metrics["tokens"] / 4, "tokens_per_s": trial.metrics["tokens_per_s"]}
        tags = {"generation": trial.generation, "parent_trial": trial.parent, "mutation": trial.mutation,
                "repeat_of": previous[-1].number if trial.state == "repeat" else None}
        trial.run_id = tracker.open_trial_run(number, trial.arch, TRAIN, ArchConfig.from_dict(trial.arch).fingerprint(),
                                              tags)
        tracker.finish_run(trial.run_id, trial.state, trial.metrics, reason=trial.reason)
        result.trials.append(trial)
    tracker.finish_study()
    if optuna_store:
        _write_optuna_study(result)
    return result


def _write_optuna_study(study: SyntheticStudy) -> None:
    """The controller's record of the same trials: what `search.study.controllers` would have stored."""
    objective = OBJECTIVES[study.objective]
    optuna_study = optuna.create_study(study_name=study.name, storage=study_storage(study.uri),
                                       directions=list(objective.directions))
    for key, value in {"objective": study.objective, "train": TRAIN, "budget": study.budget}.items():
        optuna_study.set_user_attr(key, value)  # what search.run records and search.export reads
    distributions = {key: optuna.distributions.CategoricalDistribution(options) for key, options in CHOICES.items()}
    trials = []
    for trial in study.trials:
        attrs: dict[str, Any] = {"arch": trial.arch, "metrics": trial.metrics}
        if trial.state == "repeat":
            attrs["repeat_of"] = trial.number - 1
        state = STATES[trial.state].trial_state
        values = objective.values(trial.metrics) if state == optuna.trial.TrialState.COMPLETE else None
        trials.append(optuna.trial.create_trial(
            params={key: trial.arch[key] for key in CHOICES}, distributions=distributions,
            values=values, state=state, user_attrs=attrs))
    optuna_study.add_trials(trials)


def write_confirmations(study: SyntheticStudy, seeds: dict[int, list[float]], budget: str,
                        failed: tuple[tuple[int, int], ...] = ()) -> list[str]:
    """Confirmation runs as `search.confirm` writes them (`StudyTracker.open_confirmation_run`, then
    `finish_run`): for each original trial number, one run per seed with the given score (the
    study objective's ranking metric). `failed` lists (trial, seed index from 1) pairs recorded as
    failed instead. Returns their run ids."""
    tracker = StudyTracker(study.uri, study.name)
    metric = OBJECTIVES[study.objective].rank_metric
    run_ids = []
    for number, scores in seeds.items():
        original = study.trials[number]
        for index, value in enumerate(scores, start=1):
            run_id = tracker.open_confirmation_run(original.run_id, number, 1000 + index, index, original.arch,
                                                   TRAIN, budget)
            if (number, index) in failed:
                tracker.finish_run(run_id, "failed", {"seconds": 5.0}, reason="RuntimeError: out of memory")
            else:
                loss = value if metric == "validation_loss" else 7.0 - 4.0 * value  # as `_metrics` relates them
                tracker.finish_run(run_id, "complete", {"validation_loss": loss, metric: value, "seconds": 120.0,
                                                        "tokens": 1e6, "unigram_floor": UNIGRAM_FLOOR,
                                                        "nats_below_unigram": UNIGRAM_FLOOR - loss})
            run_ids.append(run_id)
    return run_ids
