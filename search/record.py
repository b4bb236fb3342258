"""`python -m search.record runs/<name>`: a finished `trainer.cram` run recorded as one MLflow run.

    python -m trainer.cram --config ... --budget 24h --out runs/best && python -m search.record runs/best

The trainer writes a run directory and knows nothing of MLflow (layers: trainer sits below
search); this records that directory. The run, in the experiment `cram` and named after the
directory, holds the architecture and training settings as params (`arch.*`, `train.*`), the
result's numbers as metrics, the loss curve, the directory's arch.yaml, train.yaml and
result.json, and its Hugging Face export under `hf_model/` (`trainer.export_hf`): the MLflow UI
leads from the run to a model that `from_pretrained` loads. A SQLite store keeps its artifacts
beside the database, as studies do.

The run is found again by its tag `cramnas.checkpoint` (the directory's absolute path): recording
a directory twice returns the first run, and recording again after a failed attempt completes the
run that attempt started, without duplicating a metric point.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from search.base import tags as tag
from search.tracking.retry import TrackingError, first_line
from space.errors import CramnasError, UsageError
from trainer.console import CliParser, one_line_on_ctrl_c

EXPERIMENT = "cram"
CONFIGS = ("arch.yaml", "train.yaml", "result.json")


class RecordError(TrackingError):
    """The store was usable but the recording failed part way (the store went away): one line;
    the run directory is untouched and recording it again completes the run."""


def check_run_dir(run_dir: str | Path) -> Path:
    """The absolute path of a finished `trainer.cram` run directory; a one-line UsageError otherwise."""
    path = Path(run_dir).resolve()
    if not path.is_dir():
        raise UsageError(f"RUN_DIR: {run_dir} is not a directory; pass the --out of a finished trainer.cram run")
    missing = [name for name in CONFIGS if not (path / name).is_file()]
    if missing:
        raise UsageError(f"RUN_DIR: {run_dir} has no {', '.join(missing)}: not a finished trainer.cram run "
                         f"(an interrupted one continues with python -m trainer.cram --resume {run_dir})")
    return path


def record_cram(uri: str, run_dir: str | Path) -> str:
    """Record the finished cram in `run_dir` in MLflow at `uri` (a checked store, see
    `search.tracking.stores.check_store`); returns the run id, the existing one if it was recorded before."""
    from mlflow.exceptions import MlflowException

    path = check_run_dir(run_dir)
    try:
        return _record(uri, path)
    except (MlflowException, OSError) as error:
        raise RecordError(f"recording {run_dir} in MLflow at {uri} failed ({first_line(error)}); the run "
                          "directory is complete: record it again once the store is back") from error


def _record(uri: str, checkpoint: Path) -> str:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from search.tracking.stores import sqlite_path
    from trainer.export_hf import log_to_mlflow

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        database = sqlite_path(uri)
        location = (database.parent / "mlruns").resolve().as_uri() if database is not None else None
        experiment_id = client.create_experiment(EXPERIMENT, artifact_location=location)
    found = client.search_runs([experiment_id], tag.where(tag.CHECKPOINT, checkpoint), max_results=1)
    if found and found[0].info.status == "FINISHED":
        return found[0].info.run_id
    arch, train = (yaml.safe_load((checkpoint / name).read_text()) for name in ("arch.yaml", "train.yaml"))
    result = json.loads((checkpoint / "result.json").read_text())
    run_id = found[0].info.run_id if found else client.create_run(experiment_id, run_name=checkpoint.name, tags={
        tag.KIND: tag.CRAM, tag.CHECKPOINT: str(checkpoint),
        tag.FINGERPRINT: str(result.get("arch_fingerprint", "")),
        tag.DATA_FINGERPRINT: str(result.get("data_fingerprint", "")),
        **({tag.REGIME: result["regime"]} if "regime" in result else {}),  # trainer/regimes.py
    }).info.run_id
    # When the cram ended, not now: a second attempt logs identical points, which MLflow keeps once.
    stamp = int((checkpoint / "result.json").stat().st_mtime * 1000)
    params = [Param(f"{group}.{key}", str(value)) for group, values in (("arch", arch), ("train", train))
              for key, value in values.items()]
    numbers = {key: float(value) for key, value in result.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    numbers.update({f"validation_loss.{kind}": float(loss) for kind, loss in result.get("validation_loss_by_kind", {}).items()})
    metrics = [Metric(key, value, stamp, 0) for key, value in numbers.items()]
    metrics += [Metric("train_loss", float(loss), stamp, int(tokens)) for tokens, loss in result.get("loss_curve", [])]
    client.log_batch(run_id, metrics=metrics, params=params)
    for name in CONFIGS:
        client.log_artifact(run_id, str(checkpoint / name))
    log_to_mlflow(client, run_id, checkpoint)
    client.set_terminated(run_id)
    return run_id


def build_parser() -> CliParser:
    """The command line of `python -m search.record` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m search.record", description="Record a finished trainer.cram run in MLflow.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (trainer.cram's --out), e.g. runs/<name>")
    parser.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from search.tracking.stores import check_store

    try:
        check_run_dir(args.run_dir)
        uri = check_store(args.tracking_uri)
        run_id = record_cram(uri, args.run_dir)
    except RecordError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"MLflow run {run_id} in {uri} (experiment {EXPERIMENT}), with its Hugging Face export as the "
          "artifact hf_model/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
