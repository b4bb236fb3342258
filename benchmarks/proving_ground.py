"""The proving ground: does the search beat hand design? One command, resumable.

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/proving_ground.py --data ../shared/data [--out proving-ground]

Stages, each the command a user would type (their output goes to `<out>/<stage>.log`):
1. `search.run`: a TPE study of `--trials` trials on the CPU profile;
2. `search.run`: a random-search study with the same trial count, the control;
3. `search.confirm` of each study's top `--top` with `--seeds` seeds at the long budget
   (`--long-budget`, default `--long-factor` x the trial budget), and the hand-designed
   `--baselines` crammed with the same seeds and budget in the TPE study's experiment
   (`search.confirm --top 0 --baselines ...`: `cramnas.kind=baseline`); the three run side by
   side, one thread each;
4. `dashboards.report` of the TPE study (its "search vs hand design" section);
5. `benchmarks/accounting.py` of the TPE study's winner against the baselines of today (all but
   bert-original-cpu): compute-equivalent multiple over the ladder `--multiples`, payback, longer
   budgets, size or design (its tables in `<out>/accounting/accounting.md`);
6. the table: per configuration, mean validation loss, nats below the corruption floor and probe
   average with 95% Student-t intervals over the seeds, its regime, tokens/s and params; the search winner
   against each baseline and TPE's best against random's best as paired per-seed differences with
   95% intervals; and whether the trial budget ranks the confirmed candidates as the confirmation
   budget does (Spearman with its bootstrap interval). Written to `<out>/proving_ground.md` and printed.
Both studies and all confirmations share one MLflow store, `<out>/mlflow.db`. `<out>/state.json`
keeps each finished stage and its wall time: running the command again skips finished stages and
resumes an interrupted one (`search.run --resume`; `search.confirm` skips finished runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from accounting import LADDER
from fidelity import correlation

from search.params import params_under
from search.run import CONFIGS, PROFILES, load_profile
from search.stats import mean_interval
from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.regimes import regime_of

UNIT = {"seconds": "s", "tokens": "tokens", "flops": "flops", "refs": "refs"}  # Budget.kind -> the unit Budget.parse reads
COLUMNS = {"validation_loss": "validation loss", "nats_below_floor": "nats below corruption floor",
           "probe_average": "probe average"}
BASELINES = "crammed-bert-cpu,bert-original-cpu,neobert-cpu,modernbert-cpu,sized-cpu"


class Stages:
    """Runs the stages once each, recording their wall times in `<out>/state.json`."""

    def __init__(self, out: Path) -> None:
        self.out, self.path = out, out / "state.json"
        self.state = json.loads(self.path.read_text()) if self.path.exists() else {}

    def started(self, name: str) -> bool:
        return name in self.state

    def run(self, name: str, commands: list[list[str]], env: dict[str, str]) -> None:
        """Run `commands` side by side as stage `name`, unless it finished before."""
        entry = self.state.setdefault(name, {"seconds": 0.0})
        if entry.get("done"):
            print(f"{name}: done before ({entry['seconds']:.0f} s), skipped")
            return
        self._save()
        print(f"{name}: {' & '.join(' '.join(command[2:]) for command in commands)}", flush=True)
        started = time.perf_counter()
        logs = [(self.out / f"{name}{'-' + str(i) if len(commands) > 1 else ''}.log").open("a") for i in range(len(commands))]
        processes = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
                     for command, log in zip(commands, logs)]
        codes = [process.wait() for process in processes]
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


def per_seed(frame: pd.DataFrame, key: str) -> dict[str, pd.DataFrame]:
    """Finished runs grouped by `key` (a column), each as seed-indexed metrics."""
    frame = frame[frame["status"] == "FINISHED"]
    groups = {}
    for name, runs in frame.groupby(key):
        table = runs.set_index(runs["tags.cramnas.seed"].astype(int))
        groups[str(name)] = table[[c for c in table if c.startswith("metrics.")]].rename(columns=lambda c: c[8:])
    return groups


def describe(arch: dict) -> str:
    return ArchConfig.from_dict({**ArchConfig().to_dict(), **arch}).describe()


def interval(values) -> str:
    values = [float(v) for v in values if pd.notna(v)]
    if not values:
        return "-"
    mean, half = mean_interval(values)
    return f"{mean:.3f} ± {half:.3f}" if half is not None else f"{mean:.3f}"


def paired(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> str:
    """a - b over the seeds both have, with its 95% interval and whether it excludes 0."""
    seeds = sorted(set(a.index) & set(b.index))
    differences = [float(a.loc[s, metric]) - float(b.loc[s, metric]) for s in seeds]
    if len(differences) < 2:
        return "-"
    mean, half = mean_interval(differences)
    verdict = "outside noise" if abs(mean) > half else "within noise"
    return f"{mean:+.3f} ± {half:.3f} ({verdict}, n={len(differences)})"


def transfer(pairs: list[tuple[float, float]]) -> str:
    """Whether the trial budget ranks the confirmed candidates as the confirmation budget does: the
    Spearman correlation of (trial loss, confirmed mean loss) with its bootstrap 95% interval."""
    if len(pairs) < 3:
        return f"Transfer from the trial budget to the confirmation budget: {len(pairs)} candidates, too few to rank."
    rho, low, high = correlation(*map(list, zip(*pairs)), "spearman")
    return (f"Transfer from the trial budget to the confirmation budget: Spearman {rho:.2f} (95% bootstrap interval "
            f"{low:.2f} to {high:.2f}) over the {len(pairs)} confirmed candidates, each trial's loss (one seed) against "
            "its confirmed mean.")


def table(uri: str, studies: dict[str, str], baselines_in: str) -> str:
    """The markdown table of the experiment, read back from MLflow."""
    from search.tracking import StudyTracker

    rows, best, pairs_1x = [], {}, []
    for label, study in studies.items():
        tracker = StudyTracker(uri, study)
        trials = tracker.trial_table().set_index("run_id")
        for run_id, seeds in per_seed(tracker.confirmation_table(), "tags.cramnas.confirmation_of").items():
            trial = int(trials.loc[run_id, "trial"])
            rows.append((f"{label} trial {trial}", seeds, describe(params_under(trials.loc[run_id].to_dict(), "arch"))))
            pairs_1x.append((float(trials.loc[run_id, "metrics.validation_loss"]), float(seeds["validation_loss"].mean())))
            if label not in best or seeds["validation_loss"].mean() < best[label][1]["validation_loss"].mean():
                best[label] = (f"{label} trial {trial}", seeds)
    tracker = StudyTracker(uri, baselines_in)
    baselines = per_seed(tracker.baseline_table(), "tags.cramnas.baseline")
    rows += [(f"{name} (hand-designed)", seeds, describe(load_run_config(CONFIGS / f"{name}.yaml").arch.to_dict()))
             for name, seeds in baselines.items()]

    references = rows[0][1].iloc[0] if rows else None
    lines = [] if references is None or "corruption_floor" not in references else [
        f"References (trainer/references.py): corruption floor {references['corruption_floor']:.3f} (frequencies + "
        f"copying: learned nothing), two-neighbour count model {references['context_reference']:.3f}, unigram floor "
        f"{references['unigram_floor']:.3f}.", ""]
    lines += ["| configuration | architecture | seeds | " + " | ".join(COLUMNS.values()) + " | regime | tokens/s | params |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, seeds, architecture in sorted(rows, key=lambda row: row[1]["validation_loss"].mean()):
        cells = [interval(seeds[m]) if m in seeds else "-" for m in COLUMNS]
        mean = seeds.mean(numeric_only=True).to_dict()
        lines.append(f"| {name} | {architecture} | {len(seeds)} | {' | '.join(cells)} | {regime_of(mean) or '-'} | "
                     f"{seeds['tokens_per_s'].mean():,.0f} | {seeds['params'].mean() / 1e6:.2f}M |")
    lines += ["", "| comparison (paired by seed: first minus second) | validation loss | nats below corruption floor |",
              "|---|---|---|"]
    pairs = []
    if "TPE" in best:
        winner = best["TPE"]
        pairs += [(winner, (f"{name} (hand-designed)", seeds)) for name, seeds in baselines.items()]
        if "random" in best:
            pairs.append((winner, best["random"]))
    if "random" in best:
        pairs += [(best["random"], (f"{name} (hand-designed)", seeds)) for name, seeds in baselines.items()]
    for (name_a, a), (name_b, b) in pairs:
        lines.append(f"| {name_a} vs {name_b} | {paired(a, b, 'validation_loss')} | "
                     f"{paired(a, b, 'nats_below_floor')} |")
    lines += ["", transfer(pairs_1x)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--out", default="proving-ground", help="stores, logs, state and the table (default: %(default)s)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--trials", type=int, default=50, help="trials per study")
    parser.add_argument("--top", type=int, default=3, help="candidates confirmed per study")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", help="the trials' budget (default: the profile's)")
    parser.add_argument("--long-factor", type=float, default=3.0, help="the confirmation budget, in trial budgets")
    parser.add_argument("--long-budget", help="the confirmation budget (default: --long-factor x the trials')")
    parser.add_argument("--baselines", default=BASELINES)
    parser.add_argument("--seed", type=int, default=0, help="the studies' controller seed")
    parser.add_argument("--multiples", default=",".join(map(str, LADDER)),
                        help="the accounting's compute ladder, in trial budgets (benchmarks/accounting.py --multiples)")
    parser.add_argument("--no-probe", action="store_true",
                        help="studies without the GLUE probe (ranked by MLM loss; the probe separates nothing at CPU "
                             "scale, benchmarks/RESULTS.md): confirmations follow their study")
    args = parser.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget.parse(args.budget or load_profile(PROFILES / f"{args.profile}.yaml")["budget"])
    long = args.long_budget or f"{budget.amount * args.long_factor:g}{UNIT[budget.kind]}"
    uri = f"sqlite:///{out / 'mlflow.db'}"
    studies = {"TPE": "pg-tpe", "random": "pg-random"}
    python = [sys.executable, "-m"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    stages = Stages(out)
    for label, controller in (("TPE", "tpe"), ("random", "random")):
        study = studies[label]
        resume = ["--resume"] if stages.started(f"search-{controller}") else []
        stages.run(f"search-{controller}", [python + ["search.run", "--trials", str(args.trials), "--controller", controller,
                                                      "--study", study, "--profile", args.profile, "--budget", budget.text,
                                                      "--data", args.data,
                                                      "--seed", str(args.seed), "--tracking-uri", uri,
                                                      *(["--no-probe"] if args.no_probe else []), *resume]], env)
    confirm = ["search.confirm", "--seeds", str(args.seeds), "--budget", long, "--data", args.data,
               "--tracking-uri", uri]
    # Three processes of one thread each share the cores: both studies' confirmations and the
    # baselines (in the TPE study's experiment), so that no one of them is left running alone.
    one_thread = {**env, "OMP_NUM_THREADS": "1"}
    top = ["--top", str(args.top)]
    stages.run("confirm", [python + confirm + top + ["--study", studies["TPE"]],
                           python + confirm + top + ["--study", studies["random"]],
                           python + confirm + ["--study", studies["TPE"], "--top", "0", "--baselines", args.baselines]],
               one_thread)
    stages.run("report", [python + ["dashboards.report", "--study", studies["TPE"], "--tracking-uri", uri,
                                    "--out", str(out / "report.html")]], env)
    # The accounting of the TPE study's win (benchmarks/accounting.py) against the baselines of today.
    modern = ",".join(name for name in args.baselines.split(",") if name != "bert-original-cpu")
    stages.run("accounting", [[sys.executable, str(Path(__file__).parent / "accounting.py"), "--data", args.data,
                               "--study", studies["TPE"], "--storage", f"sqlite:///{out / 'optuna.db'}",
                               "--baselines", modern, "--budget", budget.text, "--multiples", args.multiples,
                               "--out", str(out / "accounting")]], env)
    markdown = table(uri, studies, studies["TPE"])
    walls = ", ".join(f"{name} {entry['seconds'] / 60:.1f} min" for name, entry in stages.state.items())
    text = (f"Trial budget {budget.text}, confirmation budget {long}, {args.trials} trials per study, top {args.top} "
            f"x {args.seeds} seeds; stage wall times: {walls}.\n\n{markdown}\n")
    (out / "proving_ground.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
