"""The proving ground: does the search beat hand design? One command, resumable.

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/proving_ground.py --data ../shared/data [--out proving-ground]
    python benchmarks/proving_ground.py --data ../shared/data --dry-run     # the commands it would run

The searched controller (`--controller`, default search.run's) and random search, its control, each
run once per controller seed (`--controller-seeds`, default 0,1,2): one seed of a controller says
nothing about the controller in general. Stages, each the command a user would type (their output
goes to `<out>/<stage>.log`, or `<out>/<stage>-<i>.log` for a stage of several commands):
1. `search.run`, per controller seed, for each controller: studies `pg-<controller>-s<seed>` and
   `pg-random-s<seed>` of `--trials` trials on the CPU profile, one stage each;
2. `search.confirm` of each study's top `--top` with `--seeds` seeds at the long budget
   (`--long-budget`, default `--long-factor` x the trial budget) and at the trial budget, and each
   hand-designed `--baselines` config crammed with the same seeds at both budgets in the first
   searched study's experiment (`search.confirm --top 0 --baselines NAME`: `cramnas.kind=baseline`);
   `--jobs` processes of one thread each at a time, longest first, so that the last to end are short;
3. `dashboards.report` of the study holding the baselines (its "search vs hand design" section is of
   one budget: that of the baseline run started last);
4. `benchmarks/accounting.py` of one study's winner (`--account`: by default the best winner of all
   studies, or the best of one controller's) against the baselines of today (all but
   bert-original-cpu): compute-equivalent multiple over the ladder `--multiples`, payback of that
   study's compute (not of the other studies it was picked from), longer budgets, size or design
   (its tables in `<out>/accounting-<study>/accounting.md`);
5. the table, per budget: per configuration, mean validation loss, nats below the corruption floor
   and probe average with 95% Student-t intervals over the seeds, its regime, tokens/s and params;
   controller seed by controller seed, each study's winner (its candidate of lowest mean validation
   loss at the long budget) against each baseline, and the searched controller's winner against
   random's, as paired per-seed differences with 95% intervals; and whether the trial budget ranks
   the confirmed candidates as the long budget does (Spearman with its bootstrap interval). Written
   to `<out>/proving_ground.md` and printed.
All studies and confirmations share one MLflow store, `<out>/mlflow.db`, and one Optuna store,
`<out>/optuna.db`. `<out>/state.json` keeps each finished stage and its wall time: running the
command again skips finished stages and resumes an interrupted one (`search.run --resume`;
`search.confirm` skips finished runs; search.study.stages). Reading the runs back and the tables:
search.analysis.proving_ground.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from accounting import LADDER  # benchmarks/accounting.py: run as a script, this file's folder is on sys.path

from search.analysis.crams import UNIT
from search.analysis.proving_ground import CONTROL, Study, accounted, budget_names, read, table, winners
from search.run import PROFILES, load_profile
from search.run import parse_args as search_run_args
from search.study.stages import Stages
from space.errors import CramnasError
from trainer.budget import Budget

BASELINES = "crammed-bert-cpu,bert-original-cpu,neobert-cpu,modernbert-cpu,sized-cpu"


# ---- the studies and their commands ---------------------------------------------------------------

def search_command(args: argparse.Namespace, study: Study, budget: Budget, uri: str, resume: bool) -> list[str]:
    return [sys.executable, "-m", "search.run", "--trials", str(args.trials), "--controller", study.controller,
            "--study", study.name, "--profile", args.profile, "--budget", budget.text, "--data", args.data,
            "--seed", str(study.seed), "--tracking-uri", uri, "--executor", args.executor,
            *(["--no-probe"] if args.no_probe else []), *(["--resume"] if resume else [])]


def confirm_commands(args: argparse.Namespace, studies: list[Study], budgets: list[str], uri: str) -> list[list[str]]:
    """Every study's top and every baseline at each of `budgets` in turn (give the longest first: the
    runs left at the end are then short). A study's top is one process and each baseline another
    (`--top` x `--seeds` runs and `--seeds`), so that no process holds many times the runs of the
    others and is left running alone at the end."""
    confirm = [sys.executable, "-m", "search.confirm", "--seeds", str(args.seeds), "--data", args.data,
               "--tracking-uri", uri]
    commands = []
    for budget in budgets:
        commands += [confirm + ["--budget", budget, "--study", study.name, "--top", str(args.top)] for study in studies]
        commands += [confirm + ["--budget", budget, "--study", studies[0].name, "--top", "0", "--baselines", name]
                     for name in args.baselines.split(",")]
    return commands


# ---- the command --------------------------------------------------------------------------------

def seed_list(text: str) -> list[int]:
    return list(dict.fromkeys(int(seed) for seed in text.split(",")))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from search.study.controllers import CONTROLLERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--out", default="proving-ground", help="stores, logs, state and the table (default: %(default)s)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--executor", choices=("ray", "local"), default="ray",
                        help="search.run's: local on a machine without Ray (default: %(default)s)")
    parser.add_argument("--trials", type=int, default=50, help="trials per study")
    parser.add_argument("--controller", default=search_run_args([]).controller,
                        choices=sorted(set(CONTROLLERS) - {CONTROL}),
                        help="the searched controller, against random search (default: search.run's, %(default)s)")
    parser.add_argument("--controller-seeds", type=seed_list, default="0,1,2",
                        help="one study of each controller per seed (default: %(default)s)")
    parser.add_argument("--top", type=int, default=3, help="candidates confirmed per study")
    parser.add_argument("--seeds", type=int, default=3, help="confirmation seeds per candidate and baseline")
    parser.add_argument("--budget", help="the trials' budget (default: the profile's)")
    parser.add_argument("--long-factor", type=float, default=3.0, help="the long budget, in trial budgets")
    parser.add_argument("--long-budget", help="the long confirmation budget (default: --long-factor x the trials')")
    parser.add_argument("--baselines", default=BASELINES)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="confirmation processes at once, one thread each (default: the cores, %(default)s)")
    parser.add_argument("--account", default="best",
                        help="whose winner benchmarks/accounting.py accounts: best (of all studies), the searched "
                             f"controller or {CONTROL} (its best seed's)")
    parser.add_argument("--multiples", default=",".join(map(str, LADDER)),
                        help="the accounting's compute ladder, in trial budgets (benchmarks/accounting.py --multiples)")
    parser.add_argument("--no-probe", action="store_true",
                        help="studies without the GLUE probe (ranked by MLM loss; the probe separates nothing at CPU "
                             "scale, benchmarks/RESULTS.md): confirmations follow their study")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands of the studies, confirmations and report, run nothing (the "
                             "accounting's command needs the confirmed winner)")
    args = parser.parse_args(argv)
    if args.account not in ("best", args.controller, CONTROL):
        parser.error(f"--account: best, {args.controller} or {CONTROL}, got {args.account!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    budget = Budget.parse(args.budget or load_profile(PROFILES / f"{args.profile}.yaml")["budget"])
    long = args.long_budget or f"{budget.amount * args.long_factor:g}{UNIT[budget.kind]}"
    budgets = budget_names(budget, long)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    studies = [Study(controller, seed) for seed in args.controller_seeds for controller in (args.controller, CONTROL)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    stages = Stages(out)
    holder = studies[0].name  # the study whose experiment holds the baselines
    planned = [*((f"search-{study.name}", [search_command(args, study, budget, uri,
                                                            resume=stages.started(f"search-{study.name}"))], env, 1)
                 for study in studies),
               # One thread per process: `--jobs` of them share the cores.
               ("confirmations", confirm_commands(args, studies, list(budgets), uri), {**env, "OMP_NUM_THREADS": "1"},
                args.jobs),
               ("report", [[sys.executable, "-m", "dashboards.report", "--study", holder, "--tracking-uri", uri,
                            "--out", str(out / "report.html")]], env, 1)]
    if args.dry_run:
        for stage, commands, _, _ in planned:
            print(f"{stage}:", *(f"  {shlex.join(command)}" for command in commands), sep="\n")
        print(f"then the accounting of the winner (--account {args.account}) and the table, in {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    try:
        for stage, commands, stage_env, jobs in planned:
            stages.run(stage, commands, stage_env, jobs=jobs)
        results = read(uri, studies, holder)
        study, winner = accounted(winners(results, long), long, args.account)
        # The accounting of that winner against the baselines of today; its own directory, since its
        # crams are kept by name ("winner") and another --account accounts another winner.
        modern = ",".join(name for name in args.baselines.split(",") if name != "bert-original-cpu")
        stage = f"accounting-{study.name}"
        stages.run(stage, [[sys.executable, str(Path(__file__).parent / "accounting.py"), "--data", args.data,
                            "--study", study.name, "--trial", str(winner.trial), "--storage",
                            f"sqlite:///{out / 'optuna.db'}", "--tracking-uri", uri, "--baselines", modern,
                            "--budget", budget.text, "--multiples", args.multiples, "--out", str(out / stage)]], env)
    except CramnasError as error:  # a failed stage, or no winner to account: one line; run again to resume
        print(f"error: {error}", file=sys.stderr)
        return 2
    walls = ", ".join(f"{name} {entry['seconds'] / 60:.1f} min" for name, entry in stages.state.items())
    text = (f"Trial budget {budget.text}, long budget {long}, {args.trials} trials per study, {args.controller} and "
            f"{CONTROL} with controller seeds {','.join(map(str, args.controller_seeds))}, top {args.top} x {args.seeds} "
            f"seeds; accounted (--account {args.account}): {winner.name}, {out / stage / 'accounting.md'}; stage wall "
            f"times: {walls}.\n\n{table(results, budgets)}\n")
    (out / "proving_ground.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
