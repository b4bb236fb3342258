"""The driver's side of every trial, whichever executor runs it (`search.study.ray_executor` hands it to
Ray Tune as a `Searcher`; `search.study.local_executor` calls it directly).

The executor asks `suggest` for a trial; the controller (an Optuna study, `search.study.controllers`) proposes an
architecture and MLflow gets its run. Every report of the worker comes back through
`on_trial_result`, read as the typed report it was sent as (`search.study.report.from_tune`), and is
logged to MLflow in one call; `on_trial_complete` tells the study how the trial ended (complete,
pruned by ASHA, failed) and closes the MLflow run, after logging a complete trial's checkpoint as a
Hugging Face export (`search.run --save-checkpoints`). Both records are
written here, in the driver, one right after the other; `search.run` reconciles the two on resume
if the driver died between them. MLflow writes go through `PendingWrites`: while the tracking
server is down they are held, in order, and trials run on; `drain` writes what is left at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from search.base import attrs
from search.base import tags as tag
from search.base.objectives import Objective
from search.base.states import COMPLETE, FAILED, PRUNED, REPEAT
from search.study import controllers
from search.study.report import ProgressReport, TrialReport, from_tune
from search.study.spec import TrialSpec
from search.tracking.retry import PendingWrites
from search.tracking.tracker import StudyTracker


@dataclass
class LiveTrial:
    number: int
    run_id: str | None  # None until MLflow has taken the run (held while the server is down)
    proposal: controllers.Proposal
    curve: list[tuple[int, float]] = field(default_factory=list)  # (report index, train MLM loss)
    last: ProgressReport | TrialReport | None = None  # None until the worker reports


@dataclass
class TrialOutcome:
    """How a trial ended, for the terminal view."""

    number: int
    state: str  # search.base.states: complete, repeat, pruned or failed
    metrics: dict[str, float]
    proposal: controllers.Proposal
    run_id: str | None  # None while the run's creation is held (MLflow unreachable)
    reason: str | None = None


class CramnasSearcher:
    def __init__(self, study, space, objective: Objective, tracker: StudyTracker,
                 template: TrialSpec, tags: dict[str, str],
                 on_outcome: Callable[[TrialOutcome], None] | None = None):
        self.study, self.space, self.objective, self.tracker = study, space, objective, tracker
        self.template, self.tags, self.on_outcome = template, tags, on_outcome
        self.live: dict[str, LiveTrial] = {}
        self.writes = PendingWrites(tracker.reachable)

    def suggest(self, trial_id: str) -> dict[str, Any]:
        """The next trial's `TrialSpec` as a dict, its architecture drawn and its MLflow run opened."""
        proposal = controllers.ask(self.study, self.space)
        lineage = {attrs.GENERATION: proposal.generation, attrs.PARENT_TRIAL: proposal.parent_trial,
                   attrs.MUTATION: proposal.mutation, attrs.REPEAT_OF: proposal.repeat_of, attrs.RERUN_OF: proposal.rerun_of,
                   attrs.WARM_START: proposal.warm_start, attrs.FIRST_DRAW: proposal.first_draw,
                   attrs.PROMOTED_FROM: proposal.promoted_from}
        trial = self.live[trial_id] = LiveTrial(proposal.number, None, proposal)
        tags = {**self.tags, **{k: v for k, v in lineage.items() if v is not None}}

        def start_run() -> None:
            trial.run_id = self.tracker.open_trial_run(proposal.number, proposal.config.to_dict(),
                                                       self.template.train.to_dict(), proposal.fingerprint, tags)

        self.writes.submit(f"starting the run of trial {proposal.number}", start_run)
        recorded = None
        if proposal.repeat_of is not None:
            original = self.study.get_trials(deepcopy=False)[proposal.repeat_of]  # not .trials: a deep copy of all
            recorded = original.user_attrs.get(attrs.METRICS, {})
        return self.template.for_trial(proposal.number, proposal.config, proposal.repeat_of, recorded).to_dict()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self.live.get(trial_id)
        if trial is None:
            return
        report = from_tune(result)
        trial.last = report or trial.last
        if isinstance(report, ProgressReport):
            trial.curve.append((len(trial.curve) + 1, report.train_loss))
            stamp = _now_ms()
            self.writes.submit(f"trial {trial.number}'s progress",
                               lambda: self.tracker.log_progress(trial.run_id, report.tokens, report.series(), stamp))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, died: str | None = None) -> None:
        """The trial ended: with its final report in `result`, stopped early after its last progress
        report (no final one), or its worker process gone (`died`: why, in the executor's words)."""
        ended_on = from_tune(result)
        if isinstance(ended_on, ProgressReport) and trial_id in self.live and ended_on != self.live[trial_id].last:
            # Ray Tune hands its search algorithm no report on which its scheduler stops the trial, only
            # this call: counted here, the curve and the MLflow series end where the trial stopped, as
            # with the local executor, which passes every report.
            self.on_trial_result(trial_id, result)
        trial = self.live.pop(trial_id, None)
        if trial is None:
            return
        last = from_tune(result) or trial.last
        final = last if isinstance(last, TrialReport) else TrialReport()
        metrics = last.last_metrics() if isinstance(last, ProgressReport) else final.recorded_metrics()
        reason = None
        if died is not None:
            state, reason = FAILED, f"the trial's worker died ({died})"
        elif final.failed:
            state, reason = FAILED, final.reason
        elif not isinstance(last, TrialReport):
            state, reason = PRUNED, f"stopped early by ASHA after {len(trial.curve)} of its reports"
        elif trial.proposal.repeat_of is not None:
            state = REPEAT
        else:
            state = COMPLETE
        values = self.objective.values(metrics) if state in (COMPLETE, REPEAT) else None
        controllers.tell(self.study, trial.number, values=values, state=state, reason=reason,
                         intermediate=trial.curve, metrics=metrics)
        artifacts = {"arch.yaml": trial.proposal.config.to_dict()}
        if final.result:
            artifacts["result.json"] = dict(final.result)
        if final.traceback is not None:
            artifacts["traceback.txt"] = final.traceback
        checkpoint, stamp = final.checkpoint_path, _now_ms()  # written by the worker (--save-checkpoints)

        def finish_run() -> None:
            tags = {tag.CHECKPOINT: checkpoint} if checkpoint else {}
            if checkpoint and state == COMPLETE:  # exported before the run ends, so a FINISHED run has it
                problem = self.tracker.log_hf_export(trial.run_id, checkpoint)
                if problem:
                    tags[tag.HF_EXPORT_ERROR] = problem
                    print(f"warning: trial {trial.number} stays complete, but its checkpoint {checkpoint} has no "
                          f"Hugging Face export in MLflow: {problem}")
            self.tracker.finish_run(trial.run_id, state, metrics, reason=reason, tags=tags, artifacts=artifacts,
                                    timestamp_ms=stamp)

        self.writes.submit(f"finishing the run of trial {trial.number}", finish_run)
        if self.on_outcome:
            self.on_outcome(TrialOutcome(trial.number, state, metrics, trial.proposal, trial.run_id, reason))


def _now_ms() -> int:
    return int(time.time() * 1000)
