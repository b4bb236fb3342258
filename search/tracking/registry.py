"""`search.export --register NAME`: the study winner as a model in MLflow's model registry.

The winner's checkpoint (kept by `search.run --save-checkpoints`) is exported for transformers
(`trainer.export_hf`), logged as the artifact `hf_model/` of the winner's trial run, and registered
as a new version of NAME tagged with its lineage: study, trial, run, architecture and data
fingerprints, and the seeds `search.confirm` re-trained it with. The MLflow UI then leads from the
study's table to the model, and

    AutoModelForMaskedLM.from_pretrained(mlflow.artifacts.download_artifacts("models:/NAME/1"),
                                         trust_remote_code=True)

loads it.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from search.base import tags as tag
from search.tracking.tracker import StudyTracker
from space.errors import CramnasError
from trainer.export_hf import log_to_mlflow


class RegisterError(CramnasError):
    """The winner cannot be registered: one line naming the problem and the fix."""


def confirmation_seeds(tracker: StudyTracker, run_id: str) -> list[int]:
    """The seeds `search.confirm` re-trained trial run `run_id` with (empty before any confirmation)."""
    table = tracker.confirmation_table()
    column, seed = tag.column(tag.CONFIRMATION_OF), tag.column(tag.SEED)
    if column not in table:
        return []
    return sorted({int(value) for value in table.loc[table[column] == run_id, seed].dropna()})


def register_winner(tracker: StudyTracker, trial_number: int, name: str) -> ModelVersion:
    """Log the HF export of trial `trial_number` to its run and register it as a version of `name`."""
    run = tracker.find_trial_run(trial_number)
    if run is None:
        raise RegisterError(f"--register: trial {trial_number} has no MLflow run in {tracker.uri}; "
                            "pass the --tracking-uri the search used")
    checkpoint = run.data.tags.get(tag.CHECKPOINT)
    if not checkpoint or not (Path(checkpoint) / "model.safetensors").is_file():
        where = f" (none at {checkpoint})" if checkpoint else ""
        raise RegisterError(f"--register: trial {trial_number} has no saved checkpoint{where}; run the search with "
                            "--save-checkpoints, or cram the exported config and export it with trainer.export_hf")
    run_id = run.info.run_id
    source = log_to_mlflow(tracker.client, run_id, checkpoint)
    result = tracker.read_artifact(run_id, "result.json") or {}
    seeds = confirmation_seeds(tracker, run_id)
    lineage = {
        "study": tracker.study_name, "trial": str(trial_number), "run_id": run_id,
        "fingerprint": run.data.tags.get(tag.FINGERPRINT, ""),
        "data_fingerprint": (result.get("cram") or {}).get("data_fingerprint") or "",
        "confirmation_seeds": ",".join(map(str, seeds)) or "none",
        "checkpoint": checkpoint,
    }
    try:
        tracker.client.create_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":  # a later winner is a new version of the same model
            raise RegisterError(f"--register: MLflow at {tracker.uri} cannot register {name!r} ({error.message}); "
                                "use a database store (sqlite:///mlflow.db) and a plain name") from None
    return tracker.client.create_model_version(name, source, run_id=run_id,
                                               tags=tag.as_tags(lineage))
