"""Successive halving over budgets, measured (issue 38 §1): does a whole cram at a fraction of the
trial budget, with its own learning-rate schedule, rank the trial budget's final loss better than
the progress report a trial makes at the same share of its budget (ASHA's rung)?

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/budget_rungs.py --data ../shared/data [--fraction 0.25]
    python benchmarks/budget_rungs.py --report       # the RESULTS tables, from benchmarks/crams/ alone

The architectures are the distinct ones that the three default studies (crams/default-sS.csv,
`search.run`'s defaults at 2e12 FLOPs) trained to their end: each is crammed again at `--fraction`
of 2e12 FLOPs with the study's training settings and seed, two at a time on one core each. Each
cram is a row of crams/budget-rungs.csv as it finishes (the command resumes; a row is found again by
study, trial and budget, and must be of that trial's architecture). The report sets each fraction's
Spearman with the 2e12 final loss beside that of the in-run report at the same share of the budget
(default_study.py's rung table), over the same architectures, all and off the plateau.

What a budget rung costs is not what a report costs: a trial promoted from a budget rung is
crammed again from its start, so successive halving over budgets spends the rung's cram on top of
the promoted trial's whole one; ASHA's report comes free with the run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from default_study import CRAMS, TRIAL_FLOPS, cram_flops, curve, studies, trained
from fidelity import profile_setup

from search.analysis.crams import Cram, CramStore, cram_job, worker_job
from search.analysis.ladder import multiple_of
from search.study import asha
from search.study.stopped import rung_ranking
from space.arch import ArchConfig
from trainer.budget import Budget

STORE = CRAMS / "budget-rungs.csv"
COLUMNS = ["study", "trial", "budget", "seed", "validation_loss", "nats_below_floor", "tokens", "flops_per_token",
           "seconds", "error", "arch"]
OFF_PLATEAU = 0.05  # nats below the corruption floor (trainer/regimes.py), as default_study.rung_table reads it
REDUCTIONS = (2, 3, 4)  # successive halving's reduction factors replayed


def distinct_trials() -> list[dict]:
    """The default studies' trials trained to their end, the first of each architecture."""
    distinct: dict[str, dict] = {}
    for rows in studies().values():
        for row in trained(rows):
            distinct.setdefault(row["arch"], row)
    return list(distinct.values())


def arch_key(arch: dict | str) -> str:
    """An architecture as the store keeps it: its fields as JSON, keys sorted."""
    return json.dumps(json.loads(arch) if isinstance(arch, str) else arch, sort_keys=True)


def store(path: Path = STORE) -> CramStore:
    return CramStore(path, lambda row: (row["study"], str(row["trial"]), row["budget"]), COLUMNS,
                     lambda row: ArchConfig.from_dict(json.loads(row["arch"])).fingerprint())


def planned(trials: list[dict], fraction: float, train: dict, data: str, cache_dir: str | None, jobs: int) -> list[Cram]:
    budget = multiple_of(Budget.parse(f"{TRIAL_FLOPS:g}flops"), fraction).text  # 5e11flops, as a user writes it
    crams = []
    for trial in trials:
        arch = json.loads(trial["arch"])
        key = f"{trial['study']}#{trial['trial']}@{budget}"
        row = {"study": trial["study"], "trial": trial["trial"], "budget": budget, "seed": train["seed"],
               "arch": arch_key(arch)}
        crams.append(Cram(row, ArchConfig.from_dict(arch), worker_job(key, arch, train, budget, data, cache_dir, jobs),
                          key, f"{key} {trial['architecture']}"))
    return crams


def crammed(path: Path = STORE) -> list[dict]:
    """The stored crams that gave a loss (a failed one is kept with its error and no loss)."""
    return [row for row in store(path).done.values() if row["validation_loss"]]


def ranking_table(short: list[dict]) -> str:
    """Each fraction's whole crams against the trial's final, beside the in-run report at that share."""
    trials = {(row["study"], row["trial"]): row for row in distinct_trials()}
    reports = max(len(curve(row)) for row in trials.values()) + 1  # the progress reports and the final one
    lines = ["| budget rung | of the budget | architectures | whole cram at the rung: Spearman with the final loss "
             "(95% bootstrap) | the in-run report there | off the plateau: whole cram | off the plateau: in-run report |",
             "|---|---|---|---|---|---|---|"]
    for budget in sorted({row["budget"] for row in short}, key=lambda text: Budget.parse(text).amount):
        share = Budget.parse(budget).amount / TRIAL_FLOPS
        report_at = round(share * reports)
        at = {(row["study"], row["trial"]): float(row["validation_loss"]) for row in short if row["budget"] == budget}
        # In the trials' order, as default_study.rung_table takes them: the same bootstrap resamples.
        pairs = [(at[key], trial) for key, trial in trials.items() if key in at]
        cells = []
        for subset in (pairs, [(loss, trial) for loss, trial in pairs if float(trial["nats_below_floor"]) > OFF_PLATEAU]):
            finals = [float(trial["validation_loss"]) for _, trial in subset]
            whole = rung_ranking([{1: loss} for loss, _ in subset], finals)
            in_run = rung_ranking([curve(trial) for _, trial in subset], finals, reports=[report_at])
            cells += [rank_text(whole, len(subset)), rank_text(in_run, len(subset))]
        lines.append(f"| {budget} | {share:.0%} (report {report_at}) | {len(pairs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replay_table(crams: list[dict]) -> str:
    """Successive halving over budgets replayed on each default study's trials: each is crammed whole
    at the rung's budget, and crammed again at the trial budget when promoted, either as the trials
    come (ASHA's asynchronous rule, one rung: its rung loss in the best 1/reduction of those seen so
    far, as search.run would decide trial by trial) or in one bracket (all crammed at the rung first,
    then the best n // reduction, as Hyperband's brackets do; a controller would have to draw them
    all before learning from any)."""
    short = {(row["arch"], row["budget"]): float(row["validation_loss"]) for row in crams}
    budgets = sorted({budget for _, budget in short}, key=lambda text: Budget.parse(text).amount)
    lines = ["| study | rung | promoted | " + " | ".join(f"reduction {factor}" for factor in REDUCTIONS) + " |",
             "|---|---|---|" + "---|" * len(REDUCTIONS)]
    for name, rows in studies().items():
        done = sorted(trained(rows), key=lambda row: int(row["trial"]))
        costs = [cram_flops(row) for row in done]
        best = min(range(len(done)), key=lambda index: float(done[index]["validation_loss"]))
        for budget in budgets:
            losses = [short.get((arch_key(row["arch"]), budget)) for row in done]
            if None in losses:
                continue
            share = Budget.parse(budget).amount / TRIAL_FLOPS
            ranked = sorted(range(len(done)), key=lambda index: losses[index])
            rules = {"as trials come": lambda factor: asha.replay([{1: loss} for loss in losses], costs, 1, factor).kept,
                     "in one bracket": lambda factor: ranked[:max(1, len(done) // factor)]}
            for rule, promote in rules.items():
                cells = []
                for factor in REDUCTIONS:
                    kept = promote(factor)
                    spent = share * sum(costs) + sum(costs[index] for index in kept)
                    cells.append(f"{len(kept)} of {len(done)}, best {'kept' if best in kept else 'lost'}, "
                                 f"{spent / sum(costs):.0%} of the FLOPs")
                lines.append(f"| {name} | {budget} | {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables(crams: list[dict]) -> str:
    return ranking_table(crams) + "\n\n" + replay_table(crams)


def rank_text(ranks, count: int) -> str:
    if not ranks:
        return "-"
    rank = ranks[0]
    return f"{rank.spearman:.2f} ({rank.low:.2f} to {rank.high:.2f}), {count}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="data directory, e.g. ../shared/data (to cram)")
    parser.add_argument("--fraction", type=float, default=0.25, help="of the trial budget, 2e12 FLOPs")
    parser.add_argument("--jobs", type=int, default=2, help="crams at once, one core each")
    parser.add_argument("--cache-dir")
    parser.add_argument("--report", action="store_true", help="print the table from the stored crams, cram nothing")
    args = parser.parse_args(argv)
    if args.report:
        print(tables(crammed()))
        return 0
    if not args.data:
        parser.error("--data DIR is needed to cram (or --report to read the stored crams)")
    if not 0 < args.fraction < 1:
        parser.error(f"--fraction: {args.fraction} is not a share of the trial budget; give e.g. 0.25")
    _, train, _ = profile_setup("cpu")
    crams = planned(distinct_trials(), args.fraction, train.to_dict(), args.data, args.cache_dir, args.jobs)
    kept = store()
    print(f"{len(crams)} crams at {args.fraction:g} of the trial budget: {len(kept.pending(crams))} to run", flush=True)
    kept.run(crams, cram_job, args.jobs)
    print(tables(crammed()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
