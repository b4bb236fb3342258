"""The names cramnas stores under (`search.base.attrs`: Optuna user attributes; `search.base.tags`: MLflow
tags): every existing study database and MLflow store holds these strings, so a change to one
would leave old studies unreadable. Pinned here, one by one."""

from __future__ import annotations

from search.base import attrs, tags


def test_optuna_user_attributes_keep_their_stored_keys():
    assert (attrs.ARCH, attrs.FINGERPRINT, attrs.METRICS, attrs.INTERMEDIATE, attrs.FAILURE_REASON, attrs.INFEASIBLE,
            attrs.REPEAT_OF, attrs.RERUN_OF, attrs.GENERATION, attrs.PARENT_TRIAL, attrs.MUTATION) == (
        "arch", "fingerprint", "metrics", "intermediate", "failure_reason", "infeasible",
        "repeat_of", "rerun_of", "generation", "parent_trial", "mutation")
    assert (attrs.CONTROLLER, attrs.OBJECTIVE, attrs.SPACE, attrs.SEED, attrs.TRAIN, attrs.BUDGET) == (
        "controller", "objective", "space", "seed", "train", "budget")


def test_mlflow_tags_keep_their_stored_names():
    assert {name: getattr(tags, name) for name in (
        "KIND", "STATE", "TRIAL_NUMBER", "FINGERPRINT", "DATA_FINGERPRINT", "FAILURE_REASON", "REGIME", "CHECKPOINT",
        "HF_EXPORT_ERROR", "GENERATION", "MUTATION", "PARENT_TRIAL", "PARENT_RUN_ID", "REPEAT_OF", "RERUN_OF",
        "RERUN_OF_RUN_ID", "CONFIRMATION_OF", "ORIGINAL_TRIAL", "BASELINE_NAME", "SEED", "BUDGET", "CONTROLLER",
        "OBJECTIVE")} == {
        "KIND": "cramnas.kind", "STATE": "cramnas.state", "TRIAL_NUMBER": "cramnas.trial",
        "FINGERPRINT": "cramnas.fingerprint", "DATA_FINGERPRINT": "cramnas.data_fingerprint",
        "FAILURE_REASON": "cramnas.failure_reason", "REGIME": "cramnas.regime", "CHECKPOINT": "cramnas.checkpoint",
        "HF_EXPORT_ERROR": "cramnas.hf_export_error", "GENERATION": "cramnas.generation",
        "MUTATION": "cramnas.mutation", "PARENT_TRIAL": "cramnas.parent_trial", "PARENT_RUN_ID": "cramnas.parent_run_id",
        "REPEAT_OF": "cramnas.repeat_of", "RERUN_OF": "cramnas.rerun_of", "RERUN_OF_RUN_ID": "cramnas.rerun_of_run_id",
        "CONFIRMATION_OF": "cramnas.confirmation_of", "ORIGINAL_TRIAL": "cramnas.original_trial",
        "BASELINE_NAME": "cramnas.baseline", "SEED": "cramnas.seed", "BUDGET": "cramnas.budget",
        "CONTROLLER": "cramnas.controller", "OBJECTIVE": "cramnas.objective"}
    assert (tags.STUDY, tags.TRIAL, tags.CONFIRMATION, tags.BASELINE, tags.CRAM) == (
        "study", "trial", "confirmation", "baseline", "cram")
    assert tags.PARENT_RUN == "mlflow.parentRunId"


def test_short_keys_become_tags_and_none_is_left_out():
    assert tags.as_tags({"seed": 3, "mutation": None, tags.REGIME: "plateau", "mlflow.note": "x"}) == {
        "cramnas.seed": "3", "cramnas.regime": "plateau", "mlflow.note": "x"}
    assert tags.where(tags.KIND, tags.TRIAL) == "tags.`cramnas.kind` = 'trial'"
    assert tags.column(tags.SEED) == "tags.cramnas.seed"
