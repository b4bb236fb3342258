"""`python -m search.audit --study NAME [--trials N]`: do a study's two stores agree?

A study lives in two stores (the Optuna study and MLflow, `search.tracking.stores`); every fault a study can
meet (a trial that raises or diverges, a worker or driver killed, a tracking server away for a
while) must leave them agreeing. The audit checks, and says what it found:
- no trial is left running in either store (while no driver is running the study);
- every counted Optuna trial (infeasible draws are told PRUNED and redrawn: they do not count)
  has exactly one MLflow trial run, and no trial run lacks its Optuna trial;
- the states agree (`search.base.states`): complete, repeat and pruned are FINISHED, failed
  is FAILED (or KILLED, for a trial whose driver died under it, `search.study.driver.reconcile`);
- every failed trial run says why (`cramnas.failure_reason`);
- with `--trials N`: complete + pruned + failed is exactly N (a trial the driver's death cut short
  does not count: its re-run does, `search.study.controllers.rerun_cut_short`).
Exit code 0 when all hold, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

from search.base import attrs
from search.base import tags as tag
from space.errors import CramnasError
from trainer.console import CliParser, one_line_on_ctrl_c


@dataclass
class Audit:
    study: str
    counts: dict[str, int]  # Optuna trials by state (complete, pruned, failed, running, infeasible, cut_short)
    runs: dict[str, int]  # MLflow trial runs by run status
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        optuna_counts = ", ".join(f"{n} {state}" for state, n in self.counts.items() if n)
        runs = ", ".join(f"{n} {status}" for status, n in sorted(self.runs.items()))
        verdict = "consistent" if self.ok else f"{len(self.problems)} problem(s)"
        return f"study {self.study}: Optuna {optuna_counts or 'no trials'}; MLflow {runs or 'no runs'}: {verdict}"


def audit_study(study_name: str, tracking_uri: str | None = None, storage: str | None = None,
                trials: int | None = None) -> Audit:
    """Compare the study's Optuna trials with its MLflow trial runs (see the module docstring)."""
    import optuna

    from search.base.states import COMPLETE, FAILED, PRUNED, RUNNING, run_statuses, state_of_trial
    from search.study.controllers import study_counts
    from search.tracking.stores import study_storage
    from search.tracking.tracker import StudyTracker

    study = optuna.load_study(study_name=study_name, storage=study_storage(tracking_uri, storage))
    counts = study_counts(study)
    counted = {t.number: state_of_trial(t) for t in study.get_trials(deepcopy=False)
               if attrs.INFEASIBLE not in t.user_attrs}
    frame = StudyTracker(tracking_uri, study_name).trial_table()
    runs = frame.to_dict("records")
    audit = Audit(study_name, counts, dict(Counter(r["status"] for r in runs)))
    problems = audit.problems

    if counts[RUNNING]:
        problems.append(f"{counts[RUNNING]} Optuna trial(s) still RUNNING: resume the study "
                        f"(search.run --study {study_name} --resume) to close them")
    if trials is not None:
        finished = sum(counts[state] for state in (COMPLETE, PRUNED, FAILED))
        if finished != trials:
            problems.append(f"complete + pruned + failed = {finished}, expected {trials}")
    by_trial: dict[int, list[dict]] = {}
    for run in runs:
        by_trial.setdefault(int(run["trial"]), []).append(run)
    for number, state in sorted(counted.items()):
        found = by_trial.get(number, [])
        if not found:
            problems.append(f"trial {number} ({state}): no MLflow run")
            continue
        if len(found) > 1:
            problems.append(f"trial {number}: {len(found)} MLflow runs ({', '.join(r['run_id'] for r in found)})")
        run = found[0]
        if run["status"] == "RUNNING":
            problems.append(f"trial {number}: MLflow run {run['run_id']} still RUNNING")
        elif state != RUNNING and run["status"] not in run_statuses(state):
            problems.append(f"trial {number}: Optuna says {state}, MLflow run {run['run_id']} is {run['status']}")
        reason = run.get(tag.column(tag.FAILURE_REASON))
        if state == FAILED and not (isinstance(reason, str) and reason):
            problems.append(f"trial {number}: failed without a {tag.FAILURE_REASON}")
    for number in sorted(set(by_trial) - set(counted)):
        problems.append(f"MLflow trial run(s) for trial {number}, which the Optuna study does not count")
    return audit


def build_parser() -> CliParser:
    """The command line of `python -m search.audit` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m search.audit", description=__doc__)
    parser.add_argument("--study", required=True, help="the study to check (its MLflow experiment and Optuna study)")
    parser.add_argument("--trials", type=int, help="the total the study should have reached")
    parser.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    parser.add_argument("--storage", help="Optuna study storage (default: optuna.db beside a SQLite MLflow store)")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from search.tracking.stores import check_store, existing_store, existing_study

    try:
        storage = existing_study(args.study, args.tracking_uri, args.storage,
                                 "pass --tracking-uri/--storage as given to search.run")
        audit = audit_study(args.study, check_store(existing_store(args.tracking_uri)), storage, args.trials)
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(audit.summary())
    for problem in audit.problems:
        print(f"  - {problem}")
    return 0 if audit.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
