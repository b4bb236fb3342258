"""The arithmetic and the tables of the accounting, what a search's win is worth counted in
compute (issue 19, sections 3-5): compute-equivalent multiples, the payback of the search, size or
design. `benchmarks/accounting.py` crams the winner and the baselines (its ablation too) and prints
these tables; tests/test_accounting.py checks the arithmetic on made-up numbers."""

from __future__ import annotations

import math
import statistics

from search.analysis.crams import Crams
from search.analysis.stats import correlation, interval, mean_interval
from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.regimes import regime

# ---- the arithmetic ------------------------------------------------------------------------------

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
        raise UsageError(f"--study {study_name}: {missing}")
    # The study keeps the trials' training settings and budget.
    return chosen[0].user_attrs["arch"], study.user_attrs["train"], study.user_attrs["budget"]



# ---- the tables -------------------------------------------------------------------------------

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
