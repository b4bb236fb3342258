"""`python -m search.export --study NAME`: the study's best architecture as a trainer config.

The winner is the best *confirmed* configuration when `search.confirm` has re-trained the top
trials: the one with the best mean over seeds, since a trial's own score is one seed's and the best
of many lucky draws. Its budget is the highest the confirmations ran under (after `search.confirm
--ladder`, the ladder's top rung: ranks move with compute, and the winner is crammed longer still);
when their budgets count different things (seconds and FLOPs) the latest, and a budget where no
configuration completed a seed gives way to the next. Without confirmations it is the search's best
trial. The file is what `python -m trainer.cram --config` runs unchanged (the study's training
settings, the winner's `arch`), plus `provenance`: study, trial, MLflow run id, score, budget,
controller and, for a confirmed winner, `confirmed`: its budget, seeds, mean and 95% interval, and
against each baseline (`search.confirm --baselines`) the paired difference and whether it beat it;
for the pick of a ladder, `ladder`: its rungs (budgets, lowest first) and the one it was `picked_at`.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from search.analysis.ranking import ranked_trials
from search.base import attrs
from search.base import tags as tag
from search.base.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, Objective, objective_named
from search.base.states import COMPLETE
from search.study.next_steps import StudyFlags
from space.errors import CramnasError
from trainer.console import CliParser, one_line_on_ctrl_c

if TYPE_CHECKING:
    import pandas as pd

    from search.tracking.tracker import StudyTracker

PROJECT = Path(__file__).resolve().parents[1]


class ExportError(CramnasError):
    pass


def best_trial(study: optuna.Study, objective: Objective) -> FrozenTrial:
    trials = ranked_trials(study, objective)
    if not trials:
        others = sorted({o.name for o in OBJECTIVES.values() if o.rank_metric != objective.rank_metric})
        raise ExportError(f"study {study.study_name} has no completed trial with {objective.rank_metric}; "
                          f"run more trials or choose --rank-by {' | '.join(others)}")
    return trials[0]


@dataclass
class Confirmed:
    """The best confirmed configuration: its trial, `provenance.confirmed`, and the baselines it
    did not beat (their verdicts, in words)."""

    trial: int
    record: dict[str, Any]
    not_beaten: list[str] = field(default_factory=list)
    ladder: dict[str, Any] | None = None  # `provenance.ladder`, when picked at a ladder's rung (`ladder_record`)


def budgets_by_preference(confirmations: pd.DataFrame) -> list[str]:
    """The confirmations' budgets, the one to export from first: the highest when all count one
    kind, else the latest (seconds and FLOPs do not compare)."""
    from trainer.budget import Budget, BudgetError

    dated = confirmations.dropna(subset=["params.budget"]).sort_values("start_time", kind="stable")
    latest_first = list(dict.fromkeys(reversed(dated["params.budget"].astype(str).tolist())))
    try:
        budgets = {text: Budget.parse(text) for text in latest_first}
    except BudgetError:  # a budget this version cannot read has no amount to order by
        return latest_first
    if len({budget.kind for budget in budgets.values()}) > 1:
        return latest_first
    return sorted(latest_first, key=lambda text: -budgets[text].amount)  # stable: of equal amounts, the latest


def ladder_record(confirmations: pd.DataFrame, budget: str) -> dict[str, Any] | None:
    """`provenance.ladder` when `budget` is a rung of a ladder (`search.analysis.ladder`, runs tagged
    `cramnas.rung`): the rungs that have runs, lowest first, and `picked_at`: `budget`. None otherwise."""
    column = tag.column(tag.RUNG)
    if column not in confirmations:
        return None
    laddered = confirmations.dropna(subset=[column, "params.budget"])
    if budget not in set(laddered["params.budget"]):
        return None
    ordered = laddered.assign(rung=laddered[column].astype(int)).sort_values(["rung", "start_time"], kind="stable")
    return {"rungs": list(dict.fromkeys(ordered["params.budget"].astype(str))), "picked_at": budget}


def confirmed_best(tracker: StudyTracker, objective: Objective) -> Confirmed | None:
    """The configuration `search.confirm` found best by its mean over seeds under one budget (runs
    under other budgets answer another question): the first of `budgets_by_preference` where one
    completed a seed. Set against each baseline trained under that budget, seed by seed: the
    report's statistics (`search.analysis.run_frames`). None when no confirmation has a complete seed."""
    from search.analysis import run_frames as analysis  # pandas and scipy: only for a study that has confirmations

    confirmations = analysis.prepare(tracker.confirmation_table())
    if confirmations.empty or "params.budget" not in confirmations:
        return None
    trials = analysis.prepare(tracker.trial_table())
    score = analysis.Score(objective)
    for budget in budgets_by_preference(confirmations):
        runs = confirmations[confirmations["params.budget"] == budget]
        ranking = analysis.confirmation_ranking(runs, trials, score)
        ranking = ranking[ranking["mean"].astype(float).map(math.isfinite)]
        if not ranking.empty:
            break
    else:
        return None
    best = ranking.iloc[0]
    number = int(best["trial"])
    mine = runs[(analysis.original_trials(runs, trials) == number) & (runs["state"] == COMPLETE)
                & runs[score.column].astype(float).map(math.isfinite)]
    record: dict[str, Any] = {
        "budget": budget, "rank_by": objective.rank_metric,
        "seeds": sorted(int(seed) for seed in mine[tag.column(tag.SEED)]), "mean": float(best["mean"]),
        "ci95": [float(best["low"]), float(best["high"])] if int(best["n"]) >= 2 else None,
        "failed_seeds": int(best["failed"]),
    }
    confirmed = Confirmed(number, record, ladder=ladder_record(confirmations, budget))
    baselines = analysis.prepare(tracker.baseline_table())
    if not baselines.empty and "params.budget" in baselines:
        baselines = baselines[baselines["params.budget"] == budget]
    if baselines.empty:
        return confirmed
    result = analysis.hand_design(runs, baselines, trials, score)
    names = list(result.table.loc[result.table["kind"] == "baseline", "configuration"])
    record["baselines"] = {}
    for row in analysis.paired_differences(result.runs, f"trial {number}", names, score).itertuples():
        verdict = analysis.paired_verdict(row, score)
        beat = bool(row.best_ahead and row.outside_noise)
        record["baselines"][row.baseline] = {
            "paired_seeds": int(row.n), "difference": float(row.mean),
            "ci95": [float(row.low), float(row.high)] if row.outside_noise is not None else None,
            "beat": beat, "verdict": verdict}
        if not beat:
            confirmed.not_beaten.append(f"{row.baseline}: {verdict}")
    return confirmed


@dataclass
class Exported:
    path: Path
    trial: int
    confirmed: Confirmed | None  # None: no confirmation, the search's best trial
    search_best: int  # the search's best trial by its own score
    flags: StudyFlags  # for the next command (trainer.cram with the study's data)
    sizing: Any = None  # search.sizing.SizeChoice with --target-budget: the size the fit picked


def export(study_name: str, rank_by: str | None = None, out: str | Path | None = None, tracking_uri: str | None = None,
           storage: str | None = None, force: bool = False, register: str | None = None,
           target_budget: str | None = None, size_fit: str | None = None) -> Exported:
    from search.tracking.retry import TrackingError
    from search.tracking.stores import existing_store, existing_study
    from search.tracking.tracker import StudyTracker
    from space.arch import ArchConfig
    from trainer.config import RunConfig, TrainConfig

    sizing = target_sizing(target_budget, size_fit)  # bad flags fail before any store is opened
    storage = existing_study(study_name, tracking_uri, storage, "pass the --tracking-uri or --storage the search used")
    study = optuna.load_study(study_name=study_name, storage=storage)
    objective = objective_named(rank_by or study.user_attrs.get(attrs.OBJECTIVE, DEFAULT_OBJECTIVE), "--rank-by")
    search_best = best_trial(study, objective)
    key = objective.rank_metric
    path = Path(out) if out else PROJECT / "trainer" / "configs" / f"{study_name}-best.yaml"
    if not force and not path.resolve().is_relative_to(PROJECT):
        raise ExportError(f"--out: {path} is outside the project {PROJECT}; pass --force to write there")
    uri = existing_store(tracking_uri)
    tracker = StudyTracker(uri, study_name)
    try:
        confirmed = confirmed_best(tracker, objective)
        trial = study.get_trials(deepcopy=False)[confirmed.trial] if confirmed else search_best
        run = tracker.find_trial_run(trial.number)
        study_run = tracker.study_run() if tracker.has_study_run() else None  # where the data came from
    except TrackingError as error:  # the study's runs are in another store, or its server is away
        raise ExportError(f"--tracking-uri: {error}; pass the --tracking-uri the search used") from None
    provenance = {
        "study": study_name, "trial": trial.number, "mlflow_run_id": run.info.run_id if run else None,
        "rank_by": key, "score": trial.user_attrs.get(attrs.METRICS, {}).get(key), "budget": study.user_attrs.get(attrs.BUDGET),
        "controller": study.user_attrs.get(attrs.CONTROLLER), "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if confirmed:
        provenance["confirmed"] = {**confirmed.record, "search_best_trial": search_best.number}
    if confirmed and confirmed.ladder:
        provenance["ladder"] = confirmed.ladder
    if register:  # the winner's HF export, in MLflow's model registry (search/tracking/registry.py)
        from search.tracking.registry import register_winner

        version = register_winner(tracker, trial.number, register)
        provenance["registered_model"] = f"models:/{version.name}/{version.version}"
    config = RunConfig(f"{study_name}-best", ArchConfig.from_dict(trial.user_attrs[attrs.ARCH]),
                       TrainConfig.from_dict(study.user_attrs[attrs.TRAIN]), provenance)
    choice = None
    if sizing is not None:  # the winning design at the size the fit calls for at the user's budget
        from search.sizing import resized

        config, choice = resized(config, *sizing, provenance, name=config.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    config.save(path)
    return Exported(path, trial.number, confirmed, search_best.number,
                    StudyFlags.of_run(study_name, uri, study_run, storage), choice)


def target_sizing(target_budget: str | None, size_fit: str | None):
    """(SizeFit, Budget) for `--target-budget` with `--size-fit`, None without; ExportError naming the flag."""
    if target_budget is None:
        if size_fit is not None:
            raise ExportError("--size-fit: only with --target-budget (the budget to size the winner for), "
                              "e.g. --target-budget 6e13flops")
        return None
    from search.sizing import load_size_fit, parse_budgets

    if size_fit is None:
        raise ExportError("--target-budget: needs --size-fit FILE, the fit of how the best size grows with compute: "
                          "python -m search.sizing --config <the exported config> --budgets 2e12flops,6e12flops,2e13flops "
                          "writes sizing-<name>/size-fit.json")
    budgets = parse_budgets(target_budget, "--target-budget")  # FLOPs only: a size fit is over compute
    if len(budgets) != 1:
        raise ExportError(f"--target-budget: one FLOP budget, e.g. 6e13flops, got {target_budget!r}")
    budget = budgets[0]
    if not Path(size_fit).is_file():
        raise ExportError(f"--size-fit: {size_fit} not found; python -m search.sizing writes <out>/size-fit.json")
    return load_size_fit(size_fit), budget


def build_parser() -> CliParser:
    """The command line of `python -m search.export` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m search.export", description=__doc__)
    parser.add_argument("--study", required=True, help="the study whose best trial to export (its MLflow experiment)")
    parser.add_argument("--rank-by", choices=sorted(OBJECTIVES), help="an objective (default: the study's)")
    parser.add_argument("--out", help="default: trainer/configs/<study>-best.yaml")
    parser.add_argument("--tracking-uri", help="the MLflow store the search used")
    parser.add_argument("--storage", help="the Optuna storage the search used (default: beside the MLflow store)")
    parser.add_argument("--force", action="store_true", help="allow writing outside the project")
    parser.add_argument("--register", metavar="NAME", help="also register the winner's Hugging Face export in the "
                        "MLflow model registry as NAME (needs search.run --save-checkpoints)")
    parser.add_argument("--target-budget", metavar="B", help="write the winning design at the size --size-fit predicts "
                        "for this FLOP budget, the one you will cram at (e.g. 6e13flops)")
    parser.add_argument("--size-fit", metavar="FILE", help="size-fit.json of python -m search.sizing (with --target-budget)")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        done = export(args.study, args.rank_by, args.out, args.tracking_uri, args.storage, args.force, args.register,
                      args.target_budget, args.size_fit)
    except CramnasError as error:  # ExportError, and every other cramnas user error
        print(f"error: {error}", file=sys.stderr)
        return 2
    path, confirmed = done.path, done.confirmed
    if confirmed is None:
        print(f"trial {done.trial}: the search's best by its own score (one seed); `{done.flags.confirm()}` "
              "re-trains the top trials with new seeds, and export then takes the best confirmed")
    else:
        record = confirmed.record
        ci = f" [{record['ci95'][0]:.4g}, {record['ci95'][1]:.4g}]" if record["ci95"] else " (one seed: no interval)"
        instead = "" if done.trial == done.search_best else f", not the search's best trial {done.search_best}"
        if confirmed.ladder:
            instead += f", the pick of the ladder {', '.join(confirmed.ladder['rungs'])}"
        print(f"trial {done.trial}: the best confirmed configuration{instead}: mean {record['rank_by']} "
              f"{record['mean']:.4g}{ci} over seeds {', '.join(map(str, record['seeds']))} under {record['budget']}")
        for line in confirmed.not_beaten:
            print(f"note: it did not beat baseline {line}")
    if done.sizing is not None:
        print(f"sized for {args.target_budget}: {done.sizing.arch.describe()}, the size nearest the fit's "
              f"N={done.sizing.predicted:,.0f} (provenance.sizing)")
        if done.sizing.warning:
            print(f"warning: {done.sizing.warning}")
    print(f"wrote {path}\ncram it:  {done.flags.cram(str(path), args.target_budget or '24h')}")
    if args.register:
        print(f"registered the winner in MLflow as {args.register} (its models:/ URI: provenance.registered_model in {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
