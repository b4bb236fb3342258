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
command stops and resumes at any point (`search.analysis.cram_table.table_store`: a row is found
again by its source, seed and budget); a cram that diverged or ran out of memory is a row with its
reason and no loss.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from fidelity import profile_setup

from search.analysis.cram_table import table_store
from search.analysis.crams import Cram, cram_job, worker_job
from search.run import SPACES
from search.study.warm_start import hand_designs
from space.arch import ArchConfig
from space.design import covering_design
from space.search_space import load_space

DEFAULT_OUT = Path(__file__).parent / "cram_table.csv"


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


def planned(space, rows: int, repeats: int, study_archs: list[tuple[str, ArchConfig]],
            profile: str) -> list[tuple[str, ArchConfig, int]]:
    """Every cram of the table as (source, architecture, seed), in the order it runs."""
    plan = [(f"hand:{name}", config, seed) for seed in (0, 1, 2) for name, config in hand_designs(profile)]
    plan += [(source, config, 0) for source, config in recorded_trials(profile) if space.contains(config)]
    design = covering_design(space, random.Random(0), rows=rows)
    random.Random(1).shuffle(design)  # the balanced rows come out in runs; any prefix should spread
    repeated = iter(design[:repeats])
    for index, config in enumerate(design):
        plan.append((f"design:{index}", config, 0))
        if index % 10 == 9 and (again := next(repeated, None)) is not None:
            plan += [(f"design:{design.index(again)}", again, seed) for seed in (1, 2)]
    return plan + [(source, config, 0) for source, config in study_archs]


def table_cram(source: str, config: ArchConfig, seed: int, train: dict, args: argparse.Namespace) -> Cram:
    """One cram of the table: its row before the result (the table's columns) and `cram_job`'s work."""
    key = f"{config.fingerprint()}|{seed}|{args.budget}"  # informative only: rows are found by `row_id`
    row = {"key": key, "source": source, "seed": seed, "budget": args.budget, **config.to_dict()}
    work = worker_job(key, config.to_dict(), {**train, "seed": seed}, args.budget, args.data, args.cache_dir, args.jobs)
    return Cram(row, config, work, source, f"{source} seed {seed} {config.describe()}")


def study_members(space, storage: str, name: str) -> list[tuple[str, ArchConfig]]:
    import optuna
    from optuna.trial import TrialState

    from search.base import attrs

    study = optuna.load_study(study_name=name, storage=storage)
    found = [(f"trial:{name}:{t.number}", ArchConfig.from_dict(t.user_attrs[attrs.ARCH]))
             for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if attrs.ARCH in t.user_attrs]
    return [(source, config) for source, config in found if space.contains(config)]


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
    parser.add_argument("--dry-run", action="store_true", help="say what is planned and kept, check it, cram nothing")
    args = parser.parse_args()

    profile, train, _ = profile_setup(args.profile)
    space = load_space(SPACES / profile["space"])
    extra = study_members(space, args.storage, args.study) if args.study else []
    crams = [table_cram(*planned_cram, train.to_dict(), args)
             for planned_cram in planned(space, args.rows, args.repeats, extra, args.profile)]
    store = table_store(args.out)
    todo = store.pending(crams)
    print(f"{len(crams)} crams at {args.budget}: {len(todo)} to run, {len(crams) - len(todo)} in {args.out}; "
          f"{args.jobs} at once", flush=True)
    if args.dry_run:
        store.check(crams)  # a kept row under a planned row's id is that row's architecture
        return
    store.run(crams, cram_job, args.jobs)


if __name__ == "__main__":
    main()
