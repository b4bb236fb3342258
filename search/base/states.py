"""How a trial stands, in both stores, once: `STATES` is the one table.

A trial is `complete`, a `repeat` (its architecture was trained before: the original's result is
told again), `pruned` (stopped early by ASHA), `failed` or still `running`. The Optuna study keeps
the trial state (a repeat is COMPLETE with the user attribute `repeat_of`); the trial's MLflow run
carries the state as the tag `cramnas.state` and ends with the matching run status. A failed trial
whose run was cut short (the driver died, Ctrl-C) ends KILLED rather than FAILED. A pruned trial
ends FINISHED: it ran as the search meant it to, and the MLflow UI marks FAILED and KILLED runs
alike with a red cross, so the state tag tells it from a complete one; its last reported
`train_loss` is its last metric value.
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from search.base import attrs


@dataclass(frozen=True)
class State:
    name: str
    trial_state: TrialState  # in the Optuna study
    run_status: str  # the MLflow status a run in this state ends with
    cut_short_status: str | None = None  # the status of a run cut short in this state, when it differs


COMPLETE, REPEAT, PRUNED, FAILED, RUNNING = "complete", "repeat", "pruned", "failed", "running"
STATES: dict[str, State] = {state.name: state for state in (
    State(COMPLETE, TrialState.COMPLETE, "FINISHED"),
    State(REPEAT, TrialState.COMPLETE, "FINISHED"),
    State(PRUNED, TrialState.PRUNED, "FINISHED"),
    State(FAILED, TrialState.FAIL, "FAILED", cut_short_status="KILLED"),
    State(RUNNING, TrialState.RUNNING, "RUNNING"),
)}
FINISHED_STATES = tuple(name for name, state in STATES.items() if state.trial_state.is_finished())


def run_statuses(state: str) -> set[str]:
    """The MLflow statuses a run in `state` may end with."""
    row = STATES[state]
    return {row.run_status, *filter(None, [row.cut_short_status])}


def state_of_trial(trial: FrozenTrial) -> str:
    """The state of an Optuna trial (WAITING counts as running: it has not ended)."""
    if trial.state == TrialState.COMPLETE:
        return REPEAT if trial.user_attrs.get(attrs.REPEAT_OF) is not None else COMPLETE
    return next((name for name, row in STATES.items() if row.trial_state == trial.state), RUNNING)


def state_of_status(status: str) -> str:
    """A run's state from its MLflow status alone, for a run without the state tag (FINISHED reads
    as complete: the first state in `STATES` with that status)."""
    return next((name for name, row in STATES.items() if row.run_status == status), RUNNING)
