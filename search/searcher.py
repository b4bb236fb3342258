"""The driver's side of every trial: the controller seen by Ray Tune as a `Searcher`.

Ray asks `suggest` for a trial; the controller (an Optuna study, `search.controllers`) proposes an
architecture and MLflow gets its run. Every report of the worker comes back through
`on_trial_result` and is logged to MLflow in one call; `on_trial_complete` tells the study how
the trial ended (complete, pruned by ASHA, failed) and closes the MLflow run, after logging a
complete trial's checkpoint as a Hugging Face export (`search.run --save-checkpoints`). Both records are
written here, in the driver, one right after the other; `search.run` reconciles the two on resume
if the driver died between them. MLflow writes go through `PendingWrites`: while the tracking
server is down they are held, in order, and trials run on; `drain` writes what is left at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.tune.search import Searcher

from search import controllers
from search.objectives import Objective
from search.retry import PendingWrites
from search.spec import TrialSpec
from search.states import COMPLETE, FAILED, PRUNED, REPEAT
from search.tracking import StudyTracker


@dataclass
class LiveTrial:
    number: int
    run_id: str | None  # None until MLflow has taken the run (held while the server is down)
    proposal: controllers.Proposal
    curve: list[tuple[int, float]] = field(default_factory=list)  # (report index, train MLM loss)
    last: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrialOutcome:
    """How a trial ended, for the terminal view."""

    number: int
    state: str  # search.states: complete, repeat, pruned or failed
    metrics: dict[str, float]
    proposal: controllers.Proposal
    run_id: str | None  # None while the run's creation is held (MLflow unreachable)
    reason: str | None = None
    regime: str | None = None  # the final report's loss regime (plateau, neighbours, beyond-ngrams), if any


class CramnasSearcher(Searcher):
    def __init__(self, study, space, objective: Objective, tracker: StudyTracker,
                 template: TrialSpec, tags: dict[str, str],
                 on_outcome: Callable[[TrialOutcome], None] | None = None):
        super().__init__()
        self.study, self.space, self.objective, self.tracker = study, space, objective, tracker
        self.template, self.tags, self.on_outcome = template, tags, on_outcome
        self.live: dict[str, LiveTrial] = {}
        self.writes = PendingWrites(tracker.reachable)

    def __getstate__(self) -> dict:
        # Ray pickles the Tuner, searcher included, for its own experiment restore, which cramnas
        # does not use: a study resumes from its stores (`search.run --resume`). The study's
        # storage engine and the terminal view do not pickle, so only the identity travels.
        return {"study_name": self.study.study_name}

    def save(self, checkpoint_path: str) -> None:
        pass  # the Optuna study is the searcher's state, saved as it changes (see __getstate__)

    def restore(self, checkpoint_path: str) -> None:
        pass

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # our objective comes from the study, not from Ray's metric/mode

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        proposal = controllers.ask(self.study, self.space)
        lineage = {"generation": proposal.generation, "parent_trial": proposal.parent_trial,
                   "mutation": proposal.mutation, "repeat_of": proposal.repeat_of}
        trial = self.live[trial_id] = LiveTrial(proposal.number, None, proposal)
        tags = {**self.tags, **{k: v for k, v in lineage.items() if v is not None}}

        def start_run() -> None:
            trial.run_id = self.tracker.open_trial_run(proposal.number, proposal.config.to_dict(),
                                                       self.template.train.to_dict(), proposal.fingerprint, tags)

        self.writes.submit(f"starting the run of trial {proposal.number}", start_run)
        recorded = None
        if proposal.repeat_of is not None:
            original = self.study.get_trials(deepcopy=False)[proposal.repeat_of]  # not .trials: a deep copy of all
            recorded = original.user_attrs.get("metrics", {})
        return self.template.for_trial(proposal.number, proposal.config, proposal.repeat_of, recorded).to_dict()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self.live.get(trial_id)
        if trial is None:
            return
        trial.last = result
        if not result.get("final"):
            trial.curve.append((len(trial.curve) + 1, float(result["train_loss"])))
            tokens, stamp = int(result["tokens"]), _now_ms()
            metrics = {key: result[key] for key in ("train_loss", "tokens_per_s", "budget_fraction")}
            self.writes.submit(f"trial {trial.number}'s progress",
                               lambda: self.tracker.log_progress(trial.run_id, tokens, metrics, stamp))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        trial = self.live.pop(trial_id, None)
        if trial is None:
            return
        last = result or trial.last
        metrics = {k: float(v) for k, v in last.items() if _is_metric(k, v)}
        reason = None
        if error:
            state, reason = FAILED, "the trial's worker died (Ray reported a trial error)"
        elif last.get("failed"):
            state, reason = FAILED, last.get("failure_reason", "unknown")
        elif not last.get("final"):
            state, reason = PRUNED, f"stopped early by ASHA after {len(trial.curve)} of its reports"
        elif trial.proposal.repeat_of is not None:
            state = REPEAT
        else:
            state = COMPLETE
        values = self.objective.values(metrics) if state in (COMPLETE, REPEAT) else None
        controllers.tell(self.study, trial.number, values=values, state=state, reason=reason,
                         intermediate=trial.curve, metrics=metrics)
        artifacts = {"arch.yaml": trial.proposal.config.to_dict()}
        result_dict = _unflatten(last, "result/")
        if result_dict:
            artifacts["result.json"] = result_dict
        if "traceback" in last:
            artifacts["traceback.txt"] = last["traceback"]
        checkpoint, stamp = last.get("checkpoint_path"), _now_ms()  # written by the worker (--save-checkpoints)

        def finish_run() -> None:
            tags = {"checkpoint": checkpoint} if checkpoint else {}
            if checkpoint and state == COMPLETE:  # exported before the run ends, so a FINISHED run has it
                problem = self.tracker.log_hf_export(trial.run_id, checkpoint)
                if problem:
                    tags["hf_export_error"] = problem
                    print(f"warning: trial {trial.number} stays complete, but its checkpoint {checkpoint} has no "
                          f"Hugging Face export in MLflow: {problem}")
            self.tracker.finish_run(trial.run_id, state, metrics, reason=reason, tags=tags, artifacts=artifacts,
                                    timestamp_ms=stamp)

        self.writes.submit(f"finishing the run of trial {trial.number}", finish_run)
        if self.on_outcome:
            self.on_outcome(TrialOutcome(trial.number, state, metrics, trial.proposal, trial.run_id, reason,
                                         last.get("regime")))


# Ray's own bookkeeping in every result, the trial's flags, and the train loss of a progress report
# (the last report of a pruned trial): a series `log_progress` has logged already.
_NOT_METRICS = {"final", "failed", "trial_id", "done", "pid", "timestamp", "time_this_iter_s",
                "time_total_s", "time_since_restore", "iterations_since_restore", "training_iteration", "train_loss"}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_metric(key: str, value: Any) -> bool:
    return (key not in _NOT_METRICS and "/" not in key  # "config/...": Ray's copy of the trial spec
            and isinstance(value, (int, float)) and not isinstance(value, bool))


def _unflatten(flat: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Ray hands searchers flattened results (`result/cram/seconds`): the nested dict under `prefix`."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if key.startswith(prefix):
            *parents, leaf = key[len(prefix):].split("/")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return nested
