"""The proving ground: does the search beat hand design? One command, resumable.

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/proving_ground.py --data ../shared/data [--out proving-ground]

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
`search.confirm` skips finished runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from accounting import LADDER
from fidelity import correlation

from search.analysis.crams import UNIT
from search.analysis.stats import interval, paired
from search.base import tags as tag
from search.run import CONFIGS, PROFILES, load_profile
from search.run import parse_args as search_run_args
from search.tracking.params import params_under
from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.regimes import regime_of

COLUMNS = {"validation_loss": "validation loss", "nats_below_floor": "nats below corruption floor",
           "probe_average": "probe average"}
BASELINES = "crammed-bert-cpu,bert-original-cpu,neobert-cpu,modernbert-cpu,sized-cpu"
CONTROL = "random"  # the control every searched controller is held against
POLL_S = 0.5  # how often a stage of several commands looks for one that ended
SEED, BUDGET = tag.column(tag.SEED), tag.column(tag.BUDGET)


class Stages:
    """Runs the stages once each, recording their wall times in `<out>/state.json`."""

    def __init__(self, out: Path) -> None:
        self.out, self.path = out, out / "state.json"
        self.state = json.loads(self.path.read_text()) if self.path.exists() else {}

    def started(self, name: str) -> bool:
        return name in self.state

    def run(self, name: str, commands: list[list[str]], env: dict[str, str], jobs: int = 1) -> None:
        """Run `commands` as stage `name`, `jobs` at a time, unless it finished before."""
        entry = self.state.setdefault(name, {"seconds": 0.0})
        if entry.get("done"):
            print(f"{name}: done before ({entry['seconds']:.0f} s), skipped")
            return
        self._save()
        logs = [self.out / f"{name}{'-' + str(i) if len(commands) > 1 else ''}.log" for i in range(len(commands))]
        print(f"{name}, {jobs} at a time:" if len(commands) > 1 else f"{name}:", flush=True)
        for command, log in zip(commands, logs):
            print(f"  {' '.join(command[1:]).removeprefix('-m ')}  > {log.name}", flush=True)
        started = time.perf_counter()
        codes = side_by_side(commands, logs, env, jobs)
        entry["seconds"] += time.perf_counter() - started  # summed over interrupted attempts
        self._save()
        if any(codes):
            raise SystemExit(f"error: stage {name} failed (exit {codes}); see {self.out}/{name}*.log, then run the "
                             "same command again to resume")
        entry["done"] = True
        self._save()
        print(f"{name}: {entry['seconds']:.0f} s", flush=True)

    def _save(self) -> None:
        self.path.write_text(json.dumps(self.state, indent=2))


def side_by_side(commands: list[list[str]], logs: list[Path], env: dict[str, str], jobs: int) -> list[int]:
    """Run `commands` in their order, at most `jobs` at once, each appending to its log; their exit codes."""
    waiting, running, codes = list(range(len(commands))), {}, [0] * len(commands)
    while waiting or running:
        while waiting and len(running) < jobs:
            i = waiting.pop(0)
            with logs[i].open("a") as log:  # the child keeps its own descriptor
                running[i] = subprocess.Popen(commands[i], stdout=log, stderr=subprocess.STDOUT, env=env)
        time.sleep(POLL_S)
        for i in [i for i, process in running.items() if process.poll() is not None]:
            codes[i] = running.pop(i).returncode
    return codes


# ---- the studies and their commands ---------------------------------------------------------------

class Study(NamedTuple):
    """One study of the proving ground: a controller with one controller seed."""

    controller: str
    seed: int

    @property
    def name(self) -> str:
        return f"pg-{self.controller}-s{self.seed}"


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


# ---- reading the runs back ------------------------------------------------------------------------

@dataclass
class Configuration:
    """A confirmed candidate or a hand-designed baseline, its finished runs by budget."""

    name: str
    architecture: str
    seeds: dict[str, pd.DataFrame] = field(default_factory=dict)  # budget text -> seed-indexed metrics
    trial: int | None = None  # a candidate's trial number
    trial_loss: float | None = None  # a candidate's trial's own validation loss: one seed, the trial budget

    def loss(self, budget: str) -> float:
        """Mean validation loss under `budget`; infinite without a run there, so never the best."""
        return float(self.seeds[budget]["validation_loss"].mean()) if budget in self.seeds else math.inf


@dataclass
class Results:
    candidates: dict[Study, list[Configuration]]
    baselines: list[Configuration]


def per_seed(frame: pd.DataFrame, keys: list[str]) -> dict[tuple[str, ...], pd.DataFrame]:
    """Finished runs grouped by the columns `keys`, each group as seed-indexed metrics."""
    frame = frame[frame["status"] == "FINISHED"]
    if frame.empty or any(key not in frame for key in keys):
        return {}
    groups = {}
    for names, runs in frame.groupby(keys):
        table = runs.set_index(runs[SEED].astype(int))
        groups[tuple(map(str, names))] = table[[c for c in table if c.startswith("metrics.")]].rename(columns=lambda c: c[8:])
    return groups


def by_budget(groups: dict[tuple[str, ...], pd.DataFrame], make: Callable[[str], Configuration]) -> list[Configuration]:
    """Groups keyed (budget, what ran) as one configuration per what ran, made by `make(what)`."""
    found: dict[str, Configuration] = {}
    for (budget, what), seeds in groups.items():
        if what not in found:
            found[what] = make(what)
        found[what].seeds[budget] = seeds
    return list(found.values())


def read(uri: str, studies: list[Study], baselines_in: str) -> Results:
    """Every study's confirmed candidates and the baselines of `baselines_in`, from MLflow."""
    from search.tracking.tracker import StudyTracker

    groups = per_seed(StudyTracker(uri, baselines_in).baseline_table(), [BUDGET, tag.column(tag.BASELINE_NAME)])
    baselines = by_budget(groups, lambda name: Configuration(
        f"{name} (hand-designed)", describe(load_run_config(CONFIGS / f"{name}.yaml").arch.to_dict())))
    return Results({study: confirmed(uri, study) for study in studies}, baselines)


def confirmed(uri: str, study: Study) -> list[Configuration]:
    """The study's confirmed candidates."""
    from search.tracking.tracker import StudyTracker

    tracker = StudyTracker(uri, study.name)
    trials = tracker.trial_table().set_index("run_id")

    def candidate(run_id: str) -> Configuration:
        trial = trials.loc[run_id]
        return Configuration(f"{study.name} trial {int(trial['trial'])}", describe(params_under(trial.to_dict(), "arch")),
                             trial=int(trial["trial"]), trial_loss=float(trial["metrics.validation_loss"]))

    return by_budget(per_seed(tracker.confirmation_table(), [BUDGET, tag.column(tag.CONFIRMATION_OF)]), candidate)


def winners(results: Results, long: str) -> dict[Study, Configuration]:
    """Each study's candidate of lowest mean validation loss at the long budget (none: not confirmed there)."""
    found = {study: min(configurations, key=lambda c: c.loss(long), default=None)
             for study, configurations in results.candidates.items()}
    return {study: winner for study, winner in found.items() if winner is not None and long in winner.seeds}


def accounted(best: dict[Study, Configuration], long: str, account: str) -> tuple[Study, Configuration]:
    """The study whose winner the accounting takes: the best winner of all (`best`) or of one controller's."""
    eligible = [(study, winner) for study, winner in best.items() if account in ("best", study.controller)]
    if not eligible:
        raise SystemExit(f"error: --account {account}: none of its studies has a candidate confirmed at {long}; see "
                         "the confirmations' logs, then run the same command again")
    return min(eligible, key=lambda pair: pair[1].loss(long))


# ---- the table ----------------------------------------------------------------------------------

def describe(arch: dict) -> str:
    return ArchConfig.from_dict({**ArchConfig().to_dict(), **arch}).describe()


def interval_text(values) -> str:
    values = [float(v) for v in values if pd.notna(v)]
    return interval(values).text() if values else "-"


def paired_text(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> str:
    """a - b over the seeds both have, with its 95% interval and whether it excludes 0."""
    difference = paired(a[metric].astype(float).to_dict(), b[metric].astype(float).to_dict())
    return difference.text(show_n=True) if difference.n >= 2 else "-"


def transfer(pairs: list[tuple[float, float]]) -> str:
    """Whether the trial budget ranks the confirmed candidates as the confirmation budget does: the
    Spearman correlation of (trial loss, confirmed mean loss) with its bootstrap 95% interval."""
    if len(pairs) < 3:
        return f"Transfer from the trial budget to the confirmation budget: {len(pairs)} candidates, too few to rank."
    rho, low, high = correlation(*map(list, zip(*pairs)), "spearman")
    return (f"Transfer from the trial budget to the confirmation budget: Spearman {rho:.2f} (95% bootstrap interval "
            f"{low:.2f} to {high:.2f}) over the {len(pairs)} confirmed candidates, each trial's loss (one seed) against "
            "its confirmed mean.")


def references(results: Results) -> list[str]:
    """The data's reference losses, as the first run recorded them (the same for every run of the data)."""
    configurations = [*(c for found in results.candidates.values() for c in found), *results.baselines]
    first = next((seeds.iloc[0] for c in configurations for seeds in c.seeds.values()), None)
    if first is None or "corruption_floor" not in first:
        return []
    return [f"References (trainer/references.py): corruption floor {first['corruption_floor']:.3f} (frequencies + "
            f"copying: learned nothing), two-neighbour count model {first['context_reference']:.3f}, unigram floor "
            f"{first['unigram_floor']:.3f}.", ""]


def configuration_table(configurations: list[Configuration], budget: str) -> list[str]:
    lines = ["| configuration | architecture | seeds | " + " | ".join(COLUMNS.values()) + " | regime | tokens/s | params |",
             "|---|---|---|---|---|---|---|---|---|"]
    for configuration in sorted((c for c in configurations if budget in c.seeds), key=lambda c: c.loss(budget)):
        seeds = configuration.seeds[budget]
        cells = [interval_text(seeds[m]) if m in seeds else "-" for m in COLUMNS]
        mean = seeds.mean(numeric_only=True).to_dict()
        lines.append(f"| {configuration.name} | {configuration.architecture} | {len(seeds)} | {' | '.join(cells)} | "
                     f"{regime_of(mean) or '-'} | {seeds['tokens_per_s'].mean():,.0f} | {seeds['params'].mean() / 1e6:.2f}M |")
    return lines


def comparisons(results: Results, best: dict[Study, Configuration], budget: str) -> list[str]:
    """Controller seed by controller seed: each study's winner against each baseline, then the
    searched controller's winner against random's, all under `budget`."""
    pairs = []
    for seed in dict.fromkeys(study.seed for study in results.candidates):
        found = [(study, best[study]) for study in results.candidates if study.seed == seed and study in best]
        pairs += [(winner, baseline) for _, winner in found for baseline in results.baselines]
        searched = [winner for study, winner in found if study.controller != CONTROL]
        control = [winner for study, winner in found if study.controller == CONTROL]
        pairs += [(a, b) for a in searched for b in control]
    lines = ["| comparison (paired by seed: first minus second) | validation loss | nats below corruption floor |",
             "|---|---|---|"]
    for a, b in pairs:
        if budget in a.seeds and budget in b.seeds:
            lines.append(f"| {a.name} vs {b.name} | {paired_text(a.seeds[budget], b.seeds[budget], 'validation_loss')} | "
                         f"{paired_text(a.seeds[budget], b.seeds[budget], 'nats_below_floor')} |")
    return lines


def table(results: Results, budgets: dict[str, str]) -> str:
    """The markdown tables of `budgets` (text -> its name, the long budget first, which crowns each
    study's winner)."""
    long = next(iter(budgets))
    best = winners(results, long)
    configurations = [*(c for found in results.candidates.values() for c in found), *results.baselines]
    lines = references(results)
    for budget, label in budgets.items():
        lines += [f"## Under {budget} ({label})", "", *configuration_table(configurations, budget), "",
                  f"Each study's winner is its candidate of lowest mean validation loss under {long}.", "",
                  *comparisons(results, best, budget), ""]
    pairs = [(c.trial_loss, c.loss(long)) for found in results.candidates.values() for c in found if long in c.seeds]
    return "\n".join([*lines, transfer(pairs)])


def budget_names(trial: Budget, long: str) -> dict[str, str]:
    """The long budget and the trial budget (once, where they are the same), each with its name."""
    other = Budget.parse(long)
    factor = f"{other.amount / trial.amount:g}x the trial budget" if other.kind == trial.kind else "the long budget"
    return {long: factor, trial.text: "1x, the trial budget"}


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
    args = parser.parse_args(argv)
    if args.account not in ("best", args.controller, CONTROL):
        parser.error(f"--account: best, {args.controller} or {CONTROL}, got {args.account!r}")
    return args


def main() -> None:
    args = parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget.parse(args.budget or load_profile(PROFILES / f"{args.profile}.yaml")["budget"])
    long = args.long_budget or f"{budget.amount * args.long_factor:g}{UNIT[budget.kind]}"
    budgets = budget_names(budget, long)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    studies = [Study(controller, seed) for seed in args.controller_seeds for controller in (args.controller, CONTROL)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    stages = Stages(out)
    for study in studies:
        stage = f"search-{study.name}"
        stages.run(stage, [search_command(args, study, budget, uri, resume=stages.started(stage))], env)
    # One thread per process: `--jobs` of them share the cores.
    stages.run("confirmations", confirm_commands(args, studies, list(budgets), uri),
               {**env, "OMP_NUM_THREADS": "1"}, jobs=args.jobs)
    holder = studies[0].name  # the study whose experiment holds the baselines
    stages.run("report", [[sys.executable, "-m", "dashboards.report", "--study", holder, "--tracking-uri", uri,
                           "--out", str(out / "report.html")]], env)
    results = read(uri, studies, holder)
    study, winner = accounted(winners(results, long), long, args.account)
    # The accounting of that winner against the baselines of today; its own directory, since its
    # crams are kept by name ("winner") and another --account accounts another winner.
    modern = ",".join(name for name in args.baselines.split(",") if name != "bert-original-cpu")
    stage = f"accounting-{study.name}"
    stages.run(stage, [[sys.executable, str(Path(__file__).parent / "accounting.py"), "--data", args.data,
                        "--study", study.name, "--trial", str(winner.trial), "--storage", f"sqlite:///{out / 'optuna.db'}",
                        "--tracking-uri", uri, "--baselines", modern, "--budget", budget.text, "--multiples", args.multiples,
                        "--out", str(out / stage)]], env)
    walls = ", ".join(f"{name} {entry['seconds'] / 60:.1f} min" for name, entry in stages.state.items())
    text = (f"Trial budget {budget.text}, long budget {long}, {args.trials} trials per study, {args.controller} and "
            f"{CONTROL} with controller seeds {','.join(map(str, args.controller_seeds))}, top {args.top} x {args.seeds} "
            f"seeds; accounted (--account {args.account}): {winner.name}, {out / stage / 'accounting.md'}; stage wall "
            f"times: {walls}.\n\n{table(results, budgets)}\n")
    (out / "proving_ground.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
