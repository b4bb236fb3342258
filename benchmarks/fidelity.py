"""Fidelity: do short trials rank architectures as longer crams do?

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/fidelity.py --data ../shared/data [--archs 10] [--factor 5]

`--archs` architectures drawn at random from the profile's space (seed `--seed`), plus the
profile's hand-designed run config (crammed-bert-cpu), are each crammed with the profile's trial
settings at the trial budget and at `--factor` times it, with the same seed. Printed: Spearman and
Kendall rank correlations of the validation MLM loss between the two budgets, with bootstrap 95%
intervals (resampling architectures), and the same for what ASHA stops trials on (the train loss
at its first rung, report `grace_reports` of the trial's 16) against each full budget. Also the
distribution of `nats_below_unigram` at the trial budget: how far trials get beyond token
frequencies. `--jobs` crams run side by side, each on cpus // jobs threads (a study's trials, one
CPU each, run the same way); every finished cram is appended to `--out`, and a second call skips
what is there (resumable: `search.analysis.crams.CramStore`). An architecture whose cram diverged or
ran out of memory is left out of the tables, with a note.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from search.analysis.crams import UNIT, Cram, CramStore, cram_job, worker_job
from search.analysis.stats import correlation
from search.run import CONFIGS, PROFILES, SPACES, load_profile, trial_train
from space.arch import ArchConfig
from space.search_space import load_space
from trainer.budget import Budget
from trainer.config import TrainConfig, load_run_config


def profile_setup(name: str) -> tuple[dict, TrainConfig, object]:
    """The profile, the trials' training settings (run config + profile overrides) and its run config."""
    path = PROFILES / f"{name}.yaml"
    profile = load_profile(path)
    return profile, trial_train(profile, path), load_run_config(CONFIGS / profile["run_config"])


def draw_architectures(profile: dict, count: int, seed: int) -> list[tuple[str, dict]]:
    """`count` distinct architectures from the profile's space, named by fingerprint."""
    space = load_space(SPACES / profile["space"])
    rng, drawn = random.Random(seed), {}
    while len(drawn) < count:
        arch = space.sample_random(rng)
        drawn.setdefault(arch.fingerprint(), arch.to_dict())
    return list(drawn.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--profile", default="cpu", help="search/profiles/<name>.yaml (default: cpu)")
    parser.add_argument("--archs", type=int, default=10, help="random architectures (plus the run config's)")
    parser.add_argument("--factor", type=float, default=5.0, help="the long budget, in trial budgets")
    parser.add_argument("--budget", help="the trial budget (default: the profile's)")
    parser.add_argument("--seed", type=int, default=0, help="draws the architectures")
    parser.add_argument("--jobs", type=int, default=2, help="crams at once")
    parser.add_argument("--out", default="fidelity.jsonl", help="finished crams, one JSON line each (resumable)")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    profile, train, run = profile_setup(args.profile)
    short = Budget.parse(args.budget or profile["budget"])
    long = Budget.parse(f"{short.amount * args.factor:g}{UNIT[short.kind]}")
    architectures = [(f"{run.name} (hand-designed)", run.arch.to_dict())]
    architectures += [(f"random {i + 1} ({fp[:8]})", arch)
                      for i, (fp, arch) in enumerate(draw_architectures(profile, args.archs, args.seed))]
    store = CramStore(Path(args.out), cram_id)
    crams = [fidelity_cram(name, arch, budget, train, args)
             for budget in (long, short) for name, arch in architectures]  # long ones first: the pool ends evenly
    todo = store.pending(crams)
    print(f"{len(architectures)} architectures x budgets {short.text}, {long.text}: {len(todo)} crams to run "
          f"({len(crams) - len(todo)} in {store.path}), {args.jobs} at once")
    store.run(crams, cram_job, args.jobs)
    report(architectures, store, short, long, profile["early_stop"]["grace_reports"])


def fidelity_cram(name: str, arch: dict, budget: Budget, train: TrainConfig, args: argparse.Namespace) -> Cram:
    key = f"{name}|{budget.text}"
    work = worker_job(key, arch, train.to_dict(), budget.text, args.data, args.cache_dir, args.jobs)
    return Cram({"key": key, "name": name, "budget": budget.text, "arch": arch}, ArchConfig.from_dict(arch), work,
                name, f"{name} @ {budget.text}")


def cram_id(row: dict) -> tuple[str, str]:
    """A cram by its architecture's name and budget; a random architecture's name without the
    fingerprint it shows, which a change of `ArchConfig.canonical` may respell."""
    return row["name"].split(" (")[0], row["budget"]


def report(architectures: list[tuple[str, dict]], store: CramStore, short: Budget, long: Budget, grace: int) -> None:
    rows = [(name, *(store.done[cram_id({"name": name, "budget": budget.text})] for budget in (short, long)))
            for name, _ in architectures]
    failed = [name for name, s, lng in rows if s["validation_loss"] is None or lng["validation_loss"] is None]
    if failed:
        print(f"note: left out, a cram failed: {', '.join(failed)}")
        rows = [row for row in rows if row[0] not in failed]
    print(f"\n| architecture | params | loss @ {short.text} | below floor @ {short.text} | rung-{grace} train loss "
          f"| loss @ {long.text} | below floor @ {long.text} |\n|---|---|---|---|---|---|---|")
    for name, s, lng in sorted(rows, key=lambda row: row[2]["validation_loss"]):
        rung = s["reports"][grace - 1] if len(s["reports"]) >= grace else float("nan")
        print(f"| {name} | {s['params'] / 1e6:.2f}M | {s['validation_loss']:.3f} | {s['nats_below_unigram']:+.3f} | "
              f"{rung:.3f} | {lng['validation_loss']:.3f} | {lng['nats_below_unigram']:+.3f} |")
    below = [s["nats_below_unigram"] for _, s, _ in rows]
    print(f"\nnats below the unigram floor at {short.text}: median {statistics.median(below):+.3f}, "
          f"min {min(below):+.3f}, max {max(below):+.3f} (floor {rows[0][1]['unigram_floor']:.3f})")
    short_loss = [s["validation_loss"] for _, s, _ in rows]
    long_loss = [lng["validation_loss"] for _, _, lng in rows]
    rung_loss = [s["reports"][grace - 1] if len(s["reports"]) >= grace else float("nan") for _, s, _ in rows]
    print("\n| ranking | against | n | Spearman (95% CI) | Kendall (95% CI) |\n|---|---|---|---|---|")
    for label, x, y, against in ((f"validation loss @ {short.text}", short_loss, long_loss, long.text),
                                 (f"ASHA rung {grace} train loss", rung_loss, short_loss, short.text),
                                 (f"ASHA rung {grace} train loss", rung_loss, long_loss, long.text)):
        cells = [f"{p:.2f} ({lo:.2f} to {hi:.2f})" for p, lo, hi in (correlation(x, y, kind) for kind in ("spearman", "kendall"))]
        print(f"| {label} | validation loss @ {against} | {len(x)} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
