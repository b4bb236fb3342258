"""`python -m trainer.cram --tracking-uri URI`: a finished cram recorded as one MLflow run.

The run, in the experiment `cram` and named after the checkpoint directory, holds the architecture
and training settings as params (`arch.*`, `train.*`), the result's numbers as metrics, the loss
curve, the checkpoint's arch.yaml, train.yaml and result.json, and its Hugging Face export under
`hf_model/` (`trainer.export_hf`): the MLflow UI leads from the run to a model that
`from_pretrained` loads. A SQLite store keeps its artifacts beside the database, as studies do.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from trainer.export_hf import log_to_mlflow

EXPERIMENT = "cram"
CONFIGS = ("arch.yaml", "train.yaml", "result.json")


def check_tracking_store(uri: str | None) -> str:
    """The resolved URI of a store the run can be recorded in: checked before training, so that a
    wrong --tracking-uri is one line now rather than a traceback after the cram."""
    from search.stores import check_store

    return check_store(uri)


class RecordError(Exception):
    """The cram trained but could not be recorded (the store went away): one line, checkpoint kept."""


def record_cram(uri: str, checkpoint: str | Path) -> str:
    """Record the cram whose checkpoint directory is `checkpoint` in MLflow at `uri`; returns the run id."""
    from mlflow.exceptions import MlflowException

    try:
        return _record(uri, Path(checkpoint).resolve())
    except (MlflowException, OSError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise RecordError(f"recording the run in MLflow at {uri} failed ({lines[0]}); the checkpoint {checkpoint} "
                          "is complete") from error


def _record(uri: str, checkpoint: Path) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from search.stores import sqlite_path

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        database = sqlite_path(uri)
        location = (database.parent / "mlruns").resolve().as_uri() if database is not None else None
        experiment_id = client.create_experiment(EXPERIMENT, artifact_location=location)
    arch, train = (yaml.safe_load((checkpoint / name).read_text()) for name in ("arch.yaml", "train.yaml"))
    result = json.loads((checkpoint / "result.json").read_text())
    run_id = client.create_run(experiment_id, run_name=checkpoint.name, tags={
        "cramnas.kind": "cram", "cramnas.checkpoint": str(checkpoint),
        "cramnas.fingerprint": str(result.get("arch_fingerprint", "")),
        "cramnas.data_fingerprint": str(result.get("data_fingerprint", "")),
    }).info.run_id
    now = int(time.time() * 1000)
    params = [Param(f"{group}.{key}", str(value)) for group, values in (("arch", arch), ("train", train))
              for key, value in values.items()]
    numbers = {key: float(value) for key, value in result.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    metrics = [Metric(key, value, now, 0) for key, value in numbers.items()]
    metrics += [Metric("train_loss", float(loss), now, int(tokens)) for tokens, loss in result.get("loss_curve", [])]
    client.log_batch(run_id, metrics=metrics, params=params)
    for name in CONFIGS:
        client.log_artifact(run_id, str(checkpoint / name))
    log_to_mlflow(client, run_id, checkpoint)
    client.set_terminated(run_id)
    return run_id
