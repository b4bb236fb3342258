"""How cramnas labels its MLflow runs, once: the tags every writer and reader (search/, dashboards/)
names from here, and the run names.

Every tag is `cramnas.<key>` (`PREFIX`), besides MLflow's own `mlflow.parentRunId` (`PARENT_RUN`),
which nests trial, confirmation and baseline runs under their study run (`search.tracking.tracker`). `KIND`
tells the runs apart:
- `STUDY`: the study's scalar settings, each `cramnas.<key>` (`named`): controller, objective, ...;
- `TRIAL`: `TRIAL_NUMBER`, `FINGERPRINT`, `STATE` (`search.base.states`), lineage (`PARENT_TRIAL` and
  its `PARENT_RUN_ID`, `GENERATION`, `MUTATION`, `REPEAT_OF`; `RERUN_OF` and its `RERUN_OF_RUN_ID`
  for a re-run of a trial the driver's death cut short; `WARM_START` or `FIRST_DRAW` for a trial of
  the study's first draw; `PROMOTED_FROM` for a screened study's trial), once finished `REGIME`, a failed one's
  `FAILURE_REASON`, and with `search.run --save-checkpoints` `CHECKPOINT` (`HF_EXPORT_ERROR` says
  why its export is missing);
- `CONFIRMATION` (`search.confirm`): `CONFIRMATION_OF`, `ORIGINAL_TRIAL`, `SEED`, `BUDGET`,
  `FINGERPRINT`, `STATE`; `BASELINE`: `BASELINE_NAME`, `SEED`, `BUDGET`, `FINGERPRINT`, `STATE`;
  either, when a promotion ladder ran it (`search.confirm --ladder`, `search.analysis.ladder`), `RUNG`;
- `CRAM`: a run `search.record` made of a bare `trainer.cram` checkpoint, found by its `CHECKPOINT`.

The strings are what every existing MLflow store holds, so none may change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from search.base import attrs
from space.arch import ArchConfig, ArchError

PREFIX = "cramnas."
PARENT_RUN = "mlflow.parentRunId"

KIND = PREFIX + "kind"
STUDY, TRIAL, CONFIRMATION, BASELINE, CRAM = "study", "trial", "confirmation", "baseline", "cram"  # KIND's values

STATE = PREFIX + "state"  # search.base.states: how the run's trial stands
TRIAL_NUMBER = PREFIX + "trial"  # a trial run's trial number
FINGERPRINT = PREFIX + attrs.FINGERPRINT  # the architecture's (ArchConfig.fingerprint)
DATA_FINGERPRINT = PREFIX + "data_fingerprint"
FAILURE_REASON = PREFIX + attrs.FAILURE_REASON
REGIME = PREFIX + "regime"  # trainer/regimes.py, from the run's final metrics
CHECKPOINT = PREFIX + "checkpoint"  # where the trial's model was saved (search.run --save-checkpoints)
HF_EXPORT_ERROR = PREFIX + "hf_export_error"  # why a saved checkpoint has no hf_model/ artifact
# Lineage: the Optuna user attributes of the same names, and the run ids of the trials they name.
GENERATION, MUTATION = PREFIX + attrs.GENERATION, PREFIX + attrs.MUTATION
PARENT_TRIAL, PARENT_RUN_ID = PREFIX + attrs.PARENT_TRIAL, PREFIX + "parent_run_id"
REPEAT_OF = PREFIX + attrs.REPEAT_OF
RERUN_OF, RERUN_OF_RUN_ID = PREFIX + attrs.RERUN_OF, PREFIX + "rerun_of_run_id"
# The first draw: a warm start's source (a hand design, `study:NAME#N`), or `cover` (search.study.warm_start).
WARM_START, FIRST_DRAW = PREFIX + attrs.WARM_START, PREFIX + attrs.FIRST_DRAW
PROMOTED_FROM = PREFIX + attrs.PROMOTED_FROM  # a screened study's trial: its screen's trial (search.study.screen)
# Confirmation and baseline runs (search.confirm): what each re-trains, with which seed, under which budget.
CONFIRMATION_OF = PREFIX + "confirmation_of"  # the original trial's run id
ORIGINAL_TRIAL = PREFIX + "original_trial"  # the original trial's number
BASELINE_NAME = PREFIX + "baseline"  # the hand-designed config (trainer/configs/<name>.yaml)
SEED, BUDGET = PREFIX + "seed", PREFIX + attrs.BUDGET
RUNG = PREFIX + "rung"  # a promotion ladder's rung (0-based) a run was trained at; its BUDGET says how much
# Study settings, on the study run (any other scalar setting is `cramnas.<key>` too: `named`).
CONTROLLER, OBJECTIVE = PREFIX + attrs.CONTROLLER, PREFIX + attrs.OBJECTIVE


def named(key: str) -> str:
    """A short key as its tag (`seed` -> `cramnas.seed`); a key that names its namespace is kept."""
    return key if "." in key else PREFIX + key


def as_tags(values: Mapping[str, Any]) -> dict[str, str]:
    """Short keys and values as MLflow tags. None means "not applicable" (no parent, no mutation):
    MLflow has no null tag, so it is left out."""
    return {named(key): str(value) for key, value in values.items() if value is not None}


def column(tag: str) -> str:
    """The column of `tag` in a runs frame (`StudyTracker.trial_table`, `mlflow.search_runs`)."""
    return f"tags.{tag}"


def where(tag: str, value: Any) -> str:
    """An MLflow search filter clause: runs whose `tag` is `value`."""
    return f"tags.`{tag}` = '{value}'"


def study_run_name(study_name: str) -> str:
    """The study run's name: not the bare study name, so that it reads apart from its trials."""
    return f"study {study_name}"


def trial_run_name(trial_number: int, arch: Mapping[str, Any], fingerprint: str) -> str:
    """`t0007 4x256/4h geglu pre-norm rotary`: what the runs table shows first, so the trial and
    its architecture, not a hash. An architecture that cannot be described (an impossible one, whose
    trial fails, or none recorded: `search.study.driver.reconcile`) is named by its fingerprint instead."""
    words = fingerprint
    if arch:
        with contextlib.suppress(ArchError):  # defaults first: an older version's arch may leave fields out
            words = ArchConfig.from_dict({**ArchConfig().to_dict(), **arch}).describe()
    return f"t{int(trial_number):04d} {words}"
