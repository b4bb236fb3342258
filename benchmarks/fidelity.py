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
what is there (resumable).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np
from scipy import stats

from search.analysis.crams import UNIT, cram_job, worker_died
from search.run import CONFIGS, PROFILES, SPACES, load_profile
from space.search_space import load_space
from trainer.budget import Budget
from trainer.config import TrainConfig, load_run_config


def profile_setup(name: str) -> tuple[dict, TrainConfig, object]:
    """The profile, the trials' training settings (run config + profile overrides) and its run config."""
    path = PROFILES / f"{name}.yaml"
    profile = load_profile(path)
    run = load_run_config(CONFIGS / profile["run_config"])
    train = TrainConfig.from_dict({**run.train.to_dict(), **profile.get("train", {})})
    return profile, train, run


def draw_architectures(profile: dict, count: int, seed: int) -> list[tuple[str, dict]]:
    """`count` distinct architectures from the profile's space, named by fingerprint."""
    space = load_space(SPACES / profile["space"])
    rng, drawn = random.Random(seed), {}
    while len(drawn) < count:
        arch = space.sample_random(rng)
        drawn.setdefault(arch.fingerprint(), arch.to_dict())
    return list(drawn.items())


def correlation(x: list[float], y: list[float], kind: str, resamples: int = 5000) -> tuple[float, float, float]:
    """Rank correlation of paired values and its bootstrap 95% interval (architectures resampled)."""
    statistic = {"spearman": lambda a, b: stats.spearmanr(a, b)[0], "kendall": lambda a, b: stats.kendalltau(a, b)[0]}[kind]
    point = float(statistic(x, y))
    interval = stats.bootstrap((np.asarray(x), np.asarray(y)), statistic, paired=True, vectorized=False,
                               n_resamples=resamples, method="percentile", random_state=np.random.default_rng(0))
    return point, float(interval.confidence_interval.low), float(interval.confidence_interval.high)


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
    out = Path(args.out)
    done = {json.loads(line)["key"]: json.loads(line) for line in out.read_text().splitlines()} if out.exists() else {}
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    jobs = [{"key": f"{name}|{budget.text}", "name": name, "arch": arch, "train": train.to_dict(), "budget": budget.text,
             "data": args.data, "cache_dir": args.cache_dir, "threads": threads}
            for budget in (long, short) for name, arch in architectures]  # long ones first: the pool ends evenly
    todo = [job for job in jobs if job["key"] not in done]
    print(f"{len(architectures)} architectures x budgets {short.text}, {long.text}: {len(todo)} crams to run "
          f"({len(jobs) - len(todo)} in {out}), {args.jobs} at once on {threads} thread(s) each")
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for count, finished in enumerate(concurrent.futures.as_completed([pool.submit(cram_job, job) for job in todo])):
            try:
                result = finished.result()
            except concurrent.futures.process.BrokenProcessPool:
                raise worker_died(count, len(todo), out) from None
            done[result["key"]] = result
            with out.open("a") as file:
                file.write(json.dumps(result) + "\n")
            print(f"  {result['name']} @ {result['budget']}: validation loss {result['validation_loss']:.4f} "
                  f"({result['nats_below_unigram']:+.3f} nats below the unigram floor), {result['tokens']:,} tokens",
                  flush=True)
    print(f"crams took {time.perf_counter() - started:.0f} s")
    report(architectures, done, short, long, profile["early_stop"]["grace_reports"])


def report(architectures: list[tuple[str, dict]], done: dict, short: Budget, long: Budget, grace: int) -> None:
    rows = [(name, done[f"{name}|{short.text}"], done[f"{name}|{long.text}"]) for name, _ in architectures]
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
