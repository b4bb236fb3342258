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
is shown at these budgets and this data, not at GPU scale.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from fidelity import correlation

from search.analysis.crams import SEEDS, Crams
from search.analysis.stats import interval, mean_interval, paired
from space.arch import ArchConfig, ArchError
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import TrainConfig, load_run_config
from trainer.regimes import regime

CONFIGS = Path(__file__).resolve().parents[1] / "trainer" / "configs"
LADDER = (1, 2, 4, 8, 16)  # the default --multiples
SIZE_FIELDS = ("layers", "hidden", "heads", "ffn_mult")  # what "size" means in the 2x2; the rest is design


# ---- the arithmetic (tests/test_accounting.py) ---------------------------------------------------

def compute_equivalent(multiples: list[float], losses: list[float], target: float) -> float | None:
    """The smallest multiple of compute at which a loss curve (measured at increasing `multiples`)
    reaches `target`, interpolating linearly in log-compute; 1.0 when it is there at the first,
    None when it never is (the caller says "more than" the largest)."""
    if losses[0] <= target:
        return float(multiples[0])
    for (m0, l0), (m1, l1) in zip(zip(multiples, losses), zip(multiples[1:], losses[1:])):
        if l1 <= target < l0:
            share = (l0 - target) / (l0 - l1)
            return float(2 ** (math.log2(m0) + share * (math.log2(m1) - math.log2(m0))))
    return None


def payback(search_flops: float, final_flops: float, factor: float | None) -> dict[str, float | None]:
    """The search's compute in final runs (K), the compute one final run saves (a baseline needs
    `factor` x `final_flops` for the winner's loss), and after how many final runs the search has
    paid for itself: K / (factor - 1). None where the winner saves nothing measurable."""
    runs = search_flops / final_flops
    if factor is None or factor <= 1:
        return {"search_in_final_runs": runs, "saved_per_run": None, "payback_runs": None}
    return {"search_in_final_runs": runs, "saved_per_run": (factor - 1) * final_flops,
            "payback_runs": runs / (factor - 1)}


def split_win(grid: dict[tuple[str, str], float]) -> dict[str, float]:
    """The 2x2 of mean losses keyed (design, size), each "winner" or "baseline": the whole win
    (baseline corner minus winner corner), its size part and its design part, each the effect
    averaged over the other factor's two levels (they add up to the win), and the interaction:
    how much more the baseline's size costs under the baseline's design than under the winner's."""
    ww, wb, bw, bb = (grid[key] for key in (("winner", "winner"), ("winner", "baseline"), ("baseline", "winner"),
                                             ("baseline", "baseline")))
    return {"win": bb - ww, "size": ((wb - ww) + (bb - bw)) / 2, "design": ((bw - ww) + (bb - wb)) / 2,
            "interaction": (bb - bw) - (wb - ww)}


def study_compute(storage: str, study_name: str) -> dict[str, float]:
    """FLOPs and device-seconds of every trial of a study, stopped ones included; a repeat trained
    nothing (its result is another trial's) and a trial that failed before reporting counts 0."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    flops = seconds = 0.0
    trials = 0
    mlm_rate = TrainConfig.from_dict(study.user_attrs.get("train", {})).mlm_rate  # every trial's
    for trial in study.get_trials(deepcopy=False):
        metrics, arch = trial.user_attrs.get("metrics", {}), trial.user_attrs.get("arch")
        if "repeat_of" in trial.user_attrs or arch is None or not metrics.get("tokens"):
            continue
        config = ArchConfig.from_dict(arch)
        flops += metrics["tokens"] * config.flops_per_token(config.max_seq_len, mlm_rate)
        seconds += metrics["tokens"] / metrics["tokens_per_s"] if metrics.get("tokens_per_s") else 0.0
        trials += 1
    return {"flops": flops, "device_seconds": seconds, "trials": trials}


def path_compute(tracking_uri: str, study_name: str) -> dict[str, float]:
    """FLOPs of every confirmation and baseline run `search.confirm` recorded for the study in MLflow,
    a promotion ladder's rungs included: what the path from the study to the final run spent besides
    the study's own trials (issue 26 §3). A run that reported no tokens (failed early) counts 0."""
    from search.tracking.params import params_under
    from search.tracking.tracker import StudyTracker

    tracker = StudyTracker(tracking_uri, study_name)
    flops, runs = 0.0, 0
    for frame in (tracker.confirmation_table(), tracker.baseline_table()):
        for row in frame.to_dict("records"):
            tokens = row.get("metrics.tokens")
            if not tokens or not math.isfinite(tokens):
                continue
            arch = ArchConfig.from_dict(params_under(row, "arch"))
            mlm_rate = TrainConfig.from_dict(params_under(row, "train")).mlm_rate
            flops += tokens * arch.flops_per_token(arch.max_seq_len, mlm_rate)
            runs += 1
    return {"flops": flops, "runs": runs}


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


def study_winner(storage: str, study_name: str, trial: int | None = None) -> tuple[dict, dict, str]:
    """The architecture of the best complete trial (or of trial number `trial`), the study's
    training settings and its trial budget."""
    import optuna

    from search.analysis.ranking import ranked_trials
    from search.base.objectives import OBJECTIVES

    study = optuna.load_study(study_name=study_name, storage=storage)
    ranked = ranked_trials(study, OBJECTIVES["mlm"])
    chosen = ranked[:1] if trial is None else [t for t in ranked if t.number == trial]
    if not chosen:
        missing = ("no complete trial with a validation loss yet; let it run on, or pass --winner CONFIG"
                   if trial is None else f"no complete trial {trial} with a validation loss")
        raise SystemExit(f"error: --study {study_name}: {missing}")
    # The study keeps the trials' training settings and budget.
    return chosen[0].user_attrs["arch"], study.user_attrs["train"], study.user_attrs["budget"]



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


def core_table(crams: Crams, configs: dict) -> list[str]:
    reference = crams.any("winner")
    rows = ["| configuration | architecture | params | validation loss (95% CI) | regime | tokens | seconds per run |",
            "|---|---|---|---|---|---|---|"]
    for name in sorted(configs, key=lambda n: statistics.mean(crams.losses(n, 1))):
        row = crams.any(name)
        losses = crams.losses(name, 1)
        where = regime(statistics.mean(losses), row["corruption_floor"], row["context_reference"])
        rows.append(f"| {name} | {ArchConfig.from_dict(configs[name][0]).describe()} | {row['params'] / 1e6:.2f}M | "
                    f"{interval(losses).text(show_n=True)} | {where} | {row['tokens']:,} | "
                    f"{statistics.mean(crams.seconds(name, 1)):.0f} |")
    return ["## 1x, 3 seeds", "", f"corruption floor {reference['corruption_floor']:.3f}, two-neighbour count model "
            f"{reference['context_reference']:.3f}, unigram floor {reference['unigram_floor']:.3f}", "", *rows, ""]


def ladder_tables(crams: Crams, ladder: list[str], budget: Budget, search: dict | None,
                  multiples: tuple[int, ...], path: dict | None = None) -> list[str]:
    winner = crams.losses("winner", 1)
    target, half = mean_interval(winner)
    half = half or 0.0
    lines = ["## Compute-equivalent multiple (loss of the winner at 1x reached by a baseline at m x)", "",
             "| baseline | " + " | ".join(f"{m}x" for m in multiples) + " | multiple (95% CI) |",
             "|---|" + "---|" * (len(multiples) + 1)]
    factors = {}
    for name in ladder:
        curve = [statistics.mean(crams.losses(name, m) or [math.nan]) for m in multiples]
        point, low, high = (compute_equivalent(list(multiples), curve, t) for t in (target, target + half, target - half))
        factors[name] = point
        shown = lambda m: f"{m:.1f}x" if m is not None else f"> {multiples[-1]}x"
        lines.append(f"| {name} | " + " | ".join(f"{loss:.3f}" for loss in curve) +
                     f" | {shown(point)} ({shown(low)} to {shown(high)}) |")
    lines += ["", "The interval carries the winner's seed noise at 1x; the baseline's own at 1x and 4x is in the "
              "3-seed columns of the core table and below.", ""]
    longest = multiples[-1]
    names = ["winner", *ladder]
    points = sorted({1, 4, longest})
    lines += ["## Longer budgets (seed 0: validation loss, training seconds)", "",
              "| | " + " | ".join(f"{m}x" for m in points) + " |", "|---|" + "---|" * len(points)]
    at = {name: [crams.losses(name, m, seeds=(0,))[0] for m in points] for name in names}
    for name in names:
        seconds = [crams.seconds(name, m, seeds=(0,))[0] for m in points]
        lines.append(f"| {name} | " + " | ".join(f"{loss:.3f} ({s:.0f} s)" for loss, s in zip(at[name], seconds)) + " |")
    best = min(ladder, key=lambda name: at[name][0])
    leads = " | ".join(f"{b - w:+.3f}" for w, b in zip(at["winner"], at[best]))
    lines.append(f"| lead of the winner over {best} | {leads} |")
    context = crams.any("winner")["context_reference"]
    for name in names:
        below = next((m for m, loss in zip(points, at[name]) if loss < context), None)
        lines.append(f"\n{name} goes below the two-neighbour count model ({context:.3f}) at "
                     + (f"{below}x" if below else "none of " + ", ".join(f"{m}x" for m in points)))
    if len(names) >= 3:
        rho, low, high = correlation([at[n][0] for n in names], [at[n][-1] for n in names], "spearman")
        lines.append(f"\nSpearman 1x against {longest}x over {len(names)} configurations: {rho:.2f} "
                     f"({low:.2f} to {high:.2f})")
    if search is not None:
        factor = factors[best]
        final = statistics.mean(crams.flops("winner", 1))  # one final run: the winner at 1x
        if path is None:  # the winner's confirmation seeds count as search too
            spent, besides = search["flops"] + 3 * final, "the winner's 3 confirmation seeds"
        else:  # what search.confirm (and its ladder) recorded: every candidate's and baseline's runs
            spent, besides = search["flops"] + path["flops"], f"the {path['runs']} confirmation and baseline runs in MLflow"
        account = payback(spent, final, factor)
        lines += ["", "## Payback", "",
                  f"the study: {search['trials']} trials, {search['flops']:.3g} FLOPs, {search['device_seconds'] / 3600:.2f} "
                  f"device-hours (one core each); with {besides} {spent:.3g} FLOPs",
                  f"= {account['search_in_final_runs']:.0f} final runs of {budget.text}; against {best} the winner saves "
                  + (f"a factor {factor:.1f} per final run, so the search pays back after {account['payback_runs']:.1f} runs"
                     if account["payback_runs"] is not None else
                     f"nothing: {best} reaches the winner's loss already at 1x" if factor is not None and factor <= 1
                     else f"a factor beyond the ladder (> {longest}x); payback not measurable here")]
        spent_multiple = 1 + account["search_in_final_runs"]
        lines.append(f"Spending it instead on {best}'s cram means {spent_multiple:.0f}x its budget: "
                     + (f"beyond the measured ladder ({longest}x)" if spent_multiple > longest else "inside the ladder"))
    return lines + [""]


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
