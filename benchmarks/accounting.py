"""Accounting: what a search's win is worth, counted in compute (issue 19, sections 3-5).

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/accounting.py --data ../shared/data \\
        --study pg-tpe-s0 --storage sqlite:///pg/optuna.db \\
        --baselines crammed-bert-cpu,neobert-cpu,modernbert-cpu,sized-cpu --out accounting

The winner is the study's best complete trial (its architecture and training settings as the trial
had them), its trial `--trial N` (the proving ground passes the candidate its confirmations crowned)
or `--winner CONFIG`. Every cram runs at a multiple of the budget `--budget` (default: the study's
trial budget) with seeds 0, 1, 2; all are appended to `<out>/crams.jsonl` and a second call skips
what is there (resumable). Stages, cheapest first:

1. core: the winner and every baseline at 1x, 3 seeds: each one's mean validation loss with its
   95% Student-t interval and regime (trainer/regimes.py).
2. ladder: the `--ladder` baselines (default: crammed-bert-cpu and the best other baseline) at each
   of `--multiples` (default 2, 4, 8 and 16x; seed 0, and 4x also seeds 1, 2), the winner at 4x and
   the largest. Primer's compute-equivalent multiple (So et al. 2021): the compute a baseline needs
   to reach the winner's 1x loss, interpolated linearly in log-compute between the measured
   multiples ("more than" the largest when it never does), its interval from the winner's own 95%
   interval; the payback of the search's compute (`payback`), counted in final runs of what the
   winner's 1x crams spent (tokens x FLOPs per token, so under any kind of budget), the search being
   the study and the winner's 3 confirmation seeds, or with `--tracking-uri` the study and every
   confirmation and baseline run search.confirm recorded for it (a promotion ladder's rungs too); whether the
   winner's lead holds at 4x and the largest, the rank correlation between 1x and the largest, and
   the multiple at which each goes below the two-neighbour count model.
3. ablation: against the best baseline, each of the winner's architecture choices reverted alone,
   and the 2x2 of {winner's, baseline's design} x {winner's, baseline's size}, 3 seeds each, paired
   by seed: how much of the win is size and how much design.

The tables go to `<out>/accounting.md` and stdout. The scale is the CPU profile's: what holds here
is shown at these budgets and this data, not at GPU scale. The arithmetic and the tables are
search/analysis/accounting.py's; this script crams and writes them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from search.analysis.accounting import core_table, ladder_tables, path_compute, split_win, study_compute, study_winner
from search.analysis.crams import SEEDS, Crams
from search.analysis.stats import interval, paired
from search.base.paths import CONFIGS
from space.arch import ArchConfig, ArchError
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import load_run_config

LADDER = (1, 2, 4, 8, 16)  # the default --multiples
SIZE_FIELDS = ("layers", "hidden", "heads", "ffn_mult")  # what "size" means in the 2x2; the rest is design


def read_path_compute(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, float]:
    """`path_compute` of `--tracking-uri` for `--study`, or a one-line usage error (exit 2)."""
    from search.tracking.retry import TrackingError
    from search.tracking.stores import resolve_uri, sqlite_path

    if not (args.study and args.storage):
        parser.error("--tracking-uri: the path's payback is a study's; give --study and --storage too")
    sqlite = sqlite_path(resolve_uri(args.tracking_uri))
    if sqlite is not None and not sqlite.is_file():  # MLflow would create an empty store there
        parser.error(f"--tracking-uri: {sqlite} does not exist")
    try:
        return path_compute(args.tracking_uri, args.study)
    except TrackingError as error:
        parser.error(f"--tracking-uri: {error}")


# ---- the stages -----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--study", help="the study whose winner and compute are accounted")
    parser.add_argument("--storage", help="its Optuna storage, e.g. sqlite:///optuna.db")
    parser.add_argument("--tracking-uri", help="its MLflow store: the payback counts every confirmation and baseline "
                        "run recorded there (a promotion ladder's too), not only the winner's 3 seeds")
    parser.add_argument("--trial", type=int, help="the study's trial to account instead of its best")
    parser.add_argument("--winner", help="a run config instead of the study's best trial (search.export writes one)")
    parser.add_argument("--baselines", default="crammed-bert-cpu,neobert-cpu,modernbert-cpu,sized-cpu")
    parser.add_argument("--ladder", help="baselines to cram at the multiples (default: crammed-bert-cpu and the best other)")
    parser.add_argument("--multiples", default=",".join(map(str, LADDER)), help="of the 1x budget, from 1, with 4 among them")
    parser.add_argument("--budget", help="the 1x budget (default: the study's trial budget)")
    parser.add_argument("--stages", default="core,ladder,ablation,grid",
                        help="ablation: each choice reverted alone; grid: the 2x2 of size and design")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="accounting")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()
    path = None  # read before any cram: a wrong store is one line, not a traceback after hours of training
    if args.tracking_uri:
        path = read_path_compute(parser, args)

    if args.winner:
        run = load_run_config(args.winner)
        winner_arch, winner_train, study_budget = run.arch.to_dict(), run.train.to_dict(), None
    elif args.study and args.storage:
        winner_arch, winner_train, study_budget = study_winner(args.storage, args.study, args.trial)
    else:
        parser.error("--study with --storage, or --winner CONFIG")
    budget = Budget.parse(args.budget or study_budget or "2e12flops")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    crams = Crams(out, args.data, args.cache_dir, budget, args.jobs)
    baselines = {name: load_run_config(CONFIGS / f"{name}.yaml") for name in args.baselines.split(",")}
    configs = {"winner": (winner_arch, winner_train), **{name: (run.arch.to_dict(), run.train.to_dict())
                                                          for name, run in baselines.items()}}
    stages = set(args.stages.split(","))
    multiples = tuple(int(m) for m in args.multiples.split(","))
    if multiples[0] != 1 or 4 not in multiples:
        parser.error("--multiples: start at 1 and include 4 (the 3-seed point), e.g. 1,2,4,8,16")
    lines = [f"# Accounting at {budget.text} = 1x ({ArchConfig.from_dict(winner_arch).describe()} is the winner)", ""]

    crams.run([(name, arch, train, 1, seed) for name, (arch, train) in configs.items() for seed in SEEDS])
    lines += core_table(crams, configs)
    ranked = sorted(baselines, key=lambda name: statistics.mean(crams.losses(name, 1)))
    best = ranked[0]
    if "ladder" in stages:
        ladder = args.ladder.split(",") if args.ladder else list(dict.fromkeys(["crammed-bert-cpu", best]))
        crams.run([(name, *configs[name], m, 0) for name in ladder for m in multiples[1:]]
                  + [(name, *configs[name], 4, seed) for name in ladder for seed in SEEDS[1:]]
                  + [("winner", *configs["winner"], m, 0) for m in (4, multiples[-1])])
        search = study_compute(args.storage, args.study) if args.study and args.storage else None
        lines += ladder_tables(crams, ladder, budget, search, multiples, path)
    if stages & {"ablation", "grid"}:
        lines += ablation_tables(crams, configs, best, one_factor="ablation" in stages, grid="grid" in stages)
    text = "\n".join(lines) + "\n"
    (out / "accounting.md").write_text(text)
    print("\n" + text)


def ablation_tables(crams: Crams, configs: dict, best: str, one_factor: bool = True, grid: bool = True) -> list[str]:
    winner_arch, train = configs["winner"]
    base_arch = configs[best][0]
    differing = [f for f in winner_arch if winner_arch[f] != base_arch[f] and f not in ("vocab_size", "max_seq_len")]
    variants = {}
    for field in differing if one_factor else ():
        try:
            variants[f"winner, {field} as {best}"] = ArchConfig.from_dict({**winner_arch, field: base_arch[field]}).to_dict()
        except ArchError:  # an impossible single change (heads that do not divide hidden): the 2x2 covers it
            continue
    sized = lambda design, size: {**design, **{f: size[f] for f in SIZE_FIELDS}}
    grid_archs = {("winner", "baseline"): sized(winner_arch, base_arch), ("baseline", "winner"): sized(base_arch, winner_arch)}
    grid_archs = {key: arch for key, arch in grid_archs.items() if grid and _valid(arch)}
    crams.run([(name, arch, train, 1, seed) for name, arch in variants.items() for seed in SEEDS]
              + [(f"{d} design, {s} size", arch, train, 1, seed) for (d, s), arch in grid_archs.items() for seed in SEEDS])
    winner = crams.losses("winner", 1)
    lines = [f"## Ablation against {best} (each choice of the winner reverted alone; reverted - winner, paired by seed)", "",
             "| variant | validation loss | reverted - winner |", "|---|---|---|"] if variants else []
    for name in variants:
        losses = crams.losses(name, 1)
        lines.append(f"| {name} | {interval(losses).text(show_n=True)} | {paired(losses, winner).text()} |")
    if len(grid_archs) == 2:
        grid = {("winner", "winner"): statistics.mean(winner), ("baseline", "baseline"): statistics.mean(crams.losses(best, 1)),
                **{key: statistics.mean(crams.losses(f"{key[0]} design, {key[1]} size", 1)) for key in grid_archs}}
        parts = split_win(grid)
        lines += ["", "## Size or design? ({design} x {size}, mean of 3 seeds)", "", "| | winner's size | baseline's size |",
                  "|---|---|---|",
                  f"| winner's design | {grid['winner', 'winner']:.3f} | {grid['winner', 'baseline']:.3f} |",
                  f"| {best}'s design | {grid['baseline', 'winner']:.3f} | {grid['baseline', 'baseline']:.3f} |", "",
                  f"win {parts['win']:+.3f} nats = size {parts['size']:+.3f} + design {parts['design']:+.3f} "
                  f"(interaction {parts['interaction']:+.3f}: the size effect under {best}'s design minus under the winner's)"]
    return lines + [""]


def _valid(arch: dict) -> bool:
    try:
        ArchConfig.from_dict(arch)
    except ArchError:  # e.g. one's heads that do not divide the other's hidden
        return False
    return True


if __name__ == "__main__":
    try:
        main()
    except UsageError as error:  # e.g. a kept cram of another architecture: said before anything is crammed
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
