"""A benchmark of real crams: many architectures of the CPU space crammed at one budget, kept as a
small table in the repository, the ground truth that `benchmarks/surrogate.py` fits and that
`benchmarks/controller_efficiency.py` runs every controller against (as NAS-Bench-301 and YAHPO do).

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/cram_table.py --data ../shared/data \
        [--rows 300] [--budget 2e12flops] [--repeats 12] [--study NAME --storage URL] [--jobs 2]

What is crammed, in this order, with the profile's trial settings and the same data:
- the profile's hand designs that are members of its space (`search.study.warm_start.HAND_DESIGNS`),
  seeds 0, 1 and 2: the baselines every controller is read against;
- a space-filling design of `--rows` architectures (`space.design.covering_design`: balanced over
  every choice and bool, Latin over every range), seed 0, in an order where every prefix is itself
  spread over the space;
- `--repeats` of those rows again with seeds 1 and 2 (one every tenth row), for the seed-to-seed
  noise the controllers' benchmark adds back;
- the recorded trials at this budget that benchmarks/RESULTS.md ("Accounting") measured: the 2e12
  TPE study's winner (sized-cpu with 9 choices changed) and each of its one-factor reversions to
  sized-cpu, among them the rotary one that beat every hand design, seed 0;
- with `--study`, every COMPLETE trial of that study whose architecture is a member, seed 0.

Every finished cram is one line appended to `--out` (default `benchmarks/cram_table.csv`), so the
command stops and resumes at any point; a failed cram is a row with its reason and no loss.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fidelity import profile_setup  # noqa: E402

from search.analysis.crams import cram_job, worker_died  # noqa: E402
from search.run import SPACES  # noqa: E402
from search.study.warm_start import hand_designs  # noqa: E402
from space.arch import FIELD_TYPES, ArchConfig  # noqa: E402
from space.design import covering_design  # noqa: E402
from space.search_space import load_space  # noqa: E402

DEFAULT_OUT = Path(__file__).parent / "cram_table.csv"
RESULT_COLUMNS = ("validation_loss", "regime", "nats_below_floor", "corruption_floor", "context_reference",
                  "tokens", "params", "seconds")
COLUMNS = ("key", "source", "seed", "budget", *FIELD_TYPES, *RESULT_COLUMNS, "error")


# The winner of the accounting's TPE study (pg-tpe trial 26, 1x64/2h geglu pre-norm alibi): sized-cpu
# with these 9 choices changed (benchmarks/RESULTS.md, "Accounting", one-factor ablation).
RECORDED_WINNER = {"position": "alibi", "hidden": 64, "heads": 2, "head_transform": True, "tie_embeddings": False,
                   "qkv_bias": True, "attn_out_bias": True, "ffn_bias": True, "embedding_norm": False}


def recorded_trials(profile: str) -> list[tuple[str, ArchConfig]]:
    """The accounting's winner and each of its choices reverted alone to sized-cpu's (the CPU profile)."""
    hand = dict(hand_designs(profile))
    if "sized-cpu" not in hand:
        return []
    base = hand["sized-cpu"]
    winner = base.replace(**RECORDED_WINNER)
    return [("recorded:pg-tpe#26", winner)] + [(f"recorded:pg-tpe#26-{field}", winner.replace(**{field: getattr(base, field)}))
                                               for field in RECORDED_WINNER]


def planned_rows(space, budget: str, rows: int, repeats: int, study_archs: list[tuple[str, ArchConfig]],
                 profile: str) -> list[dict]:
    """Every cram of the table, in the order it runs."""
    plan = [(f"hand:{name}", config, seed) for seed in (0, 1, 2) for name, config in hand_designs(profile)]
    plan += [(source, config, 0) for source, config in recorded_trials(profile) if space.contains(config)]
    design = covering_design(space, random.Random(0), rows=rows)
    random.Random(1).shuffle(design)  # the balanced rows come out in runs; any prefix should spread
    repeated = iter(design[:repeats])
    for index, config in enumerate(design):
        plan.append((f"design:{index}", config, 0))
        if index % 10 == 9 and (again := next(repeated, None)) is not None:
            plan += [(f"design:{design.index(again)}", again, seed) for seed in (1, 2)]
    plan += [(source, config, 0) for source, config in study_archs]
    return [{"key": f"{config.fingerprint()}|{seed}|{budget}", "source": source, "seed": seed, "arch": config}
            for source, config, seed in plan]


def study_members(space, storage: str, name: str) -> list[tuple[str, ArchConfig]]:
    import optuna
    from optuna.trial import TrialState

    from search.base import attrs

    study = optuna.load_study(study_name=name, storage=storage)
    found = [(f"trial:{name}:{t.number}", ArchConfig.from_dict(t.user_attrs[attrs.ARCH]))
             for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if attrs.ARCH in t.user_attrs]
    return [(source, config) for source, config in found if space.contains(config)]


def row_id(row: dict) -> tuple[str, str, str]:
    """What identifies a cram of the table: where it came from, its seed and budget. Not its `key`,
    whose fingerprint part a change of `ArchConfig.canonical` may respell (27 one-layer rows did):
    a resume would cram those again."""
    return row["source"], str(row["seed"]), row.get("budget") or row["key"].rsplit("|", 1)[1]


def read_table(path: Path) -> dict[tuple[str, str, str], dict]:
    if not path.exists():
        return {}
    with path.open(newline="") as file:
        return {row_id(row): row for row in csv.DictReader(file)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--budget", default="2e12flops", help="every cram's budget (default: the proving ground's trial budget)")
    parser.add_argument("--rows", type=int, default=300, help="architectures of the space-filling design")
    parser.add_argument("--repeats", type=int, default=12, help="design rows crammed again with seeds 1 and 2")
    parser.add_argument("--study", help="also cram this study's COMPLETE trials (with --storage)")
    parser.add_argument("--storage", default="sqlite:///optuna.db")
    parser.add_argument("--jobs", type=int, default=2, help="crams at once, one thread each")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    profile, train, _ = profile_setup(args.profile)
    space = load_space(SPACES / profile["space"])
    extra = study_members(space, args.storage, args.study) if args.study else []
    plan = planned_rows(space, args.budget, args.rows, args.repeats, extra, args.profile)
    done = read_table(args.out)
    todo = [row for row in plan if row_id(row) not in done]
    print(f"{len(plan)} crams at {args.budget}: {len(todo)} to run, {len(plan) - len(todo)} in {args.out}; "
          f"{args.jobs} at once", flush=True)
    new_file = not args.out.exists()
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    started = time.perf_counter()
    with args.out.open("a", newline="") as file, concurrent.futures.ProcessPoolExecutor(
            args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        writer = csv.DictWriter(file, COLUMNS)
        if new_file:
            writer.writeheader()
        futures = {pool.submit(cram_job, {"key": row["key"], "name": row["source"], "arch": row["arch"].to_dict(),
                                          "train": {**train.to_dict(), "seed": row["seed"]}, "budget": args.budget,
                                          "data": args.data, "cache_dir": args.cache_dir, "threads": threads}): row
                   for row in todo}
        for count, finished in enumerate(concurrent.futures.as_completed(futures), 1):
            row = futures[finished]
            line = {"key": row["key"], "source": row["source"], "seed": row["seed"], "budget": args.budget,
                    **row["arch"].to_dict()}
            try:
                result = finished.result()
                line.update({column: result.get(column) for column in RESULT_COLUMNS})
            except concurrent.futures.process.BrokenProcessPool:  # not the cram's failure: no row, crammed again
                raise worker_died(count - 1, len(todo), args.out) from None
            except Exception as error:  # a failed cram is a row with its reason; the table goes on
                line["error"] = " ".join(f"{type(error).__name__}: {error}".split())
            writer.writerow(line)
            file.flush()
            elapsed = time.perf_counter() - started
            print(f"[{count}/{len(todo)}, {elapsed / 60:.1f} min] {row['source']} seed {row['seed']} "
                  f"{row['arch'].describe()}: {line.get('validation_loss') or line.get('error')}", flush=True)


if __name__ == "__main__":
    main()
