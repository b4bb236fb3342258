"""`python -m search.export --study NAME`: the study's best architecture as a trainer config.

The file is what `python -m trainer.cram --config` runs unchanged (the study's training settings,
the winner's `arch`), plus `provenance`: study, trial, MLflow run id, score, budget, controller.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from search.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, Objective, objective_named
from space.errors import CramnasError
from trainer.console import CliParser, one_line_on_ctrl_c

PROJECT = Path(__file__).resolve().parents[1]


class ExportError(CramnasError):
    pass


def ranked_trials(study: optuna.Study, objective: Objective) -> list[FrozenTrial]:
    """The study's complete trials that reported the objective's ranking metric, best first (a tie:
    the earlier trial first). Repeats copy an earlier trial's result, so they do not compete."""
    key = objective.rank_metric
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "repeat_of" not in t.user_attrs and key in t.user_attrs.get("metrics", {})]
    return sorted(trials, key=lambda t: objective.sort_key(t.user_attrs["metrics"][key]))


def best_trial(study: optuna.Study, objective: Objective) -> FrozenTrial:
    trials = ranked_trials(study, objective)
    if not trials:
        others = sorted({o.name for o in OBJECTIVES.values() if o.rank_metric != objective.rank_metric})
        raise ExportError(f"study {study.study_name} has no completed trial with {objective.rank_metric}; "
                          f"run more trials or choose --rank-by {' | '.join(others)}")
    return trials[0]


def export(study_name: str, rank_by: str | None = None, out: str | Path | None = None, tracking_uri: str | None = None,
           storage: str | None = None, force: bool = False, register: str | None = None) -> Path:
    from search.retry import TrackingError
    from search.stores import existing_store, existing_study
    from search.tracking import StudyTracker
    from space.arch import ArchConfig
    from trainer.config import RunConfig, TrainConfig

    storage = existing_study(study_name, tracking_uri, storage, "pass the --tracking-uri or --storage the search used")
    study = optuna.load_study(study_name=study_name, storage=storage)
    objective = objective_named(rank_by or study.user_attrs.get("objective", DEFAULT_OBJECTIVE), "--rank-by")
    trial = best_trial(study, objective)
    key = objective.rank_metric
    path = Path(out) if out else PROJECT / "trainer" / "configs" / f"{study_name}-best.yaml"
    if not force and not path.resolve().is_relative_to(PROJECT):
        raise ExportError(f"--out: {path} is outside the project {PROJECT}; pass --force to write there")
    uri = existing_store(tracking_uri)
    try:
        run = StudyTracker(uri, study_name).find_trial_run(trial.number)
    except TrackingError as error:  # the study's runs are in another store, or its server is away
        raise ExportError(f"--tracking-uri: {error}; pass the --tracking-uri the search used") from None
    provenance = {
        "study": study_name, "trial": trial.number, "mlflow_run_id": run.info.run_id if run else None,
        "rank_by": key, "score": trial.user_attrs["metrics"][key], "budget": study.user_attrs.get("budget"),
        "controller": study.user_attrs.get("controller"), "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if register:  # the winner's HF export, in MLflow's model registry (search/registry.py)
        from search.registry import register_winner

        version = register_winner(StudyTracker(uri, study_name), trial.number, register)
        provenance["registered_model"] = f"models:/{version.name}/{version.version}"
    config = RunConfig(f"{study_name}-best", ArchConfig.from_dict(trial.user_attrs["arch"]),
                       TrainConfig.from_dict(study.user_attrs["train"]), provenance)
    path.parent.mkdir(parents=True, exist_ok=True)
    config.save(path)
    return path


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    parser = CliParser(prog="python -m search.export", description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--rank-by", choices=sorted(OBJECTIVES), help="an objective (default: the study's)")
    parser.add_argument("--out", help="default: trainer/configs/<study>-best.yaml")
    parser.add_argument("--tracking-uri", help="the MLflow store the search used")
    parser.add_argument("--storage", help="the Optuna storage the search used (default: beside the MLflow store)")
    parser.add_argument("--force", action="store_true", help="allow writing outside the project")
    parser.add_argument("--register", metavar="NAME", help="also register the winner's Hugging Face export in the "
                        "MLflow model registry as NAME (needs search.run --save-checkpoints)")
    args = parser.parse_args(argv)
    try:
        path = export(args.study, args.rank_by, args.out, args.tracking_uri, args.storage, args.force, args.register)
    except CramnasError as error:  # ExportError, and every other cramnas user error
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}\ncram it:  python -m trainer.cram --config {path} --budget 24h")
    if args.register:
        print(f"registered the winner in MLflow as {args.register} (its models:/ URI: provenance.registered_model in {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
