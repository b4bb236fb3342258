"""The proving ground without Ray Tune or MLflow: issue 25's test of the default controller against
random search, for a machine that has neither (the GPU session carries no Ray or MLflow wheels).

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/direct_proving_ground.py --data ../shared/data \\
        [--studies gp:0,gp:1,gp:2,random:0,random:1,random:2] [--trials 32] [--budget 2e12flops] \\
        [--deadline-s 600] [--jobs 12] [--out direct-proving-ground]

Stages, each resumable (a second call does only what is missing):
1. one study per `controller:seed`, side by side in processes of their own, on the CPU profile's space
   and trial settings, each as `search.run` opens it (`search.controllers.open_study` with the
   profile's warm starts and the covering design, the same sampler and start-up count) and drives it
   with the same `ask`/`tell`, in `<out>/<study>.db`. Each trial is crammed to its whole budget in
   the driver's process: there is no ASHA here, so a study spends its full 32 trials (the compute
   `benchmarks/accounting.py`'s payback counts is what it spent). No trial starts after
   `--deadline-s`; a trial cut short by a kill is failed and re-run by the next call, as
   `search.run --resume` does;
2. each study's winner (its best complete trial) and the hand designs `--baselines` (sized-cpu,
   neobert-cpu and modernbert-cpu) crammed with seeds 0, 1 and 2 at `--confirm-at` (1x and 3x the
   trial budget), and sized-cpu at `--curve` (1x to 8x) for the compute-equivalent multiple
   (with `--curve-seeds` seeds each; `benchmarks/accounting.py`'s `Crams`, `--jobs` at a time, in `<out>/crams.jsonl`);
3. the table, seed by seed (`<out>/proving_ground.md`, printed): each winner at 1x and 3x against
   sized-cpu (paired by seed, with whether the difference is outside noise), its compute-equivalent
   multiple over sized-cpu's curve (Primer's), and how many final runs pay back its study's compute,
   and the whole path's: the study and the winner's confirmation crams (issue 26 §3).

On a GPU every cram runs in bf16 autocast (`trainer.device`), on a CPU in fp32: compare numbers from
one machine only. `benchmarks/proving_ground.py` is the same test through `search.run`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from accounting import CONFIGS, SEEDS, Crams, compute_equivalent, paired, payback, study_compute, study_winner  # noqa: E402
from fidelity import profile_setup  # noqa: E402

from search.controllers import DEFAULT_CONTROLLER  # noqa: E402
from search.paths import SPACES  # noqa: E402
from search.stats import mean_interval  # noqa: E402
from space.arch import ArchConfig  # noqa: E402
from space.errors import UsageError  # noqa: E402
from space.search_space import load_space  # noqa: E402
from trainer.budget import Budget  # noqa: E402
from trainer.regimes import regime  # noqa: E402

STUDIES = ",".join(f"{c}:{seed}" for c in (DEFAULT_CONTROLLER, "random") for seed in range(3))  # the default against random
BASELINES = "sized-cpu,neobert-cpu,modernbert-cpu"  # sized-cpu always: the winners are read against it
CONFIRM = "1,3"  # the multiples every winner and baseline is crammed at, with SEEDS
CURVE = (1, 2, 3, 4, 8)  # sized-cpu's multiples: the compute-equivalent multiple reads its loss curve
PAYBACK_RUNS = 10  # issue 25's target: each study pays back its compute within this many final runs


def study_name(spec: str) -> str:
    controller, seed = spec.split(":")
    return f"pg-{controller}-s{seed}"


def storage_of(out: str, name: str) -> str:
    """One SQLite file a study: the studies run side by side, and SQLite takes one writer at a time."""
    return f"sqlite:///{Path(out).resolve() / name}.db"


# ---- 1. the studies -----------------------------------------------------------------------------

def drive(job: dict) -> str:
    """Run study `job["spec"]` to `job["trials"]` finished trials, or until the deadline."""
    import optuna
    import torch

    from search import attrs
    from search.controllers import ask, fail_stale_running, open_study, rerun_cut_short, study_counts, tell
    from search.states import COMPLETE, FAILED, PRUNED, REPEAT
    from search.warm_start import warm_starts
    from trainer.corpus import CorpusSource
    from trainer.cram import cram
    from trainer.data import prepare_data

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(job["threads"])
    controller, seed = job["spec"].split(":")
    name = study_name(job["spec"])
    storage = storage_of(job["out"], name)
    profile, train, _ = profile_setup("cpu")
    space = load_space(SPACES / profile["space"])
    resume = name in optuna.study.get_all_study_names(storage)
    study = open_study(name, storage, controller, "mlm", space, int(seed), resume=resume,
                       warm_starts=() if resume else warm_starts("profile", profile, space),
                       cover=True, trials=job["trials"])
    if not resume:
        study.set_user_attr(attrs.TRAIN, train.to_dict())
        study.set_user_attr(attrs.BUDGET, job["budget"])
    def finished() -> int:  # trials cut short by a kill are not counted: they are trained again
        counts = study_counts(study)
        return sum(counts[state] for state in (COMPLETE, PRUNED, FAILED))

    fail_stale_running(study)  # what a kill left running: failed, then trained again first
    rerun_cut_short(study, job["trials"] - finished())
    data = prepare_data(CorpusSource.from_args(data_dir=job["data"]), vocab_size=space.fixed["vocab_size"],
                        seq_len=space.fixed["max_seq_len"], cache_dir=job["cache_dir"])
    budget = Budget.parse(job["budget"])
    while time.time() < job["deadline"] and finished() < job["trials"]:
        proposal = ask(study, space)
        if proposal.repeat_of is not None:  # the same architecture again: its result, told again
            original = study.trials[proposal.repeat_of]
            tell(study, proposal.number, original.values, state=REPEAT, metrics=original.user_attrs.get(attrs.METRICS))
            continue
        try:
            result = cram(proposal.config, train, data, budget)
        except Exception as error:  # recorded with its reason; the study goes on
            tell(study, proposal.number, state=FAILED, reason=f"{type(error).__name__}: {error}".splitlines()[0])
            continue
        metrics = {key: value for key, value in result.to_dict().items() if isinstance(value, (int, float))}
        tell(study, proposal.number, [result.validation_loss], metrics=metrics)
        print(f"{name} trial {proposal.number}"
              + (f" ({proposal.warm_start or proposal.first_draw})" if proposal.warm_start or proposal.first_draw else "")
              + f": {proposal.config.describe()} {result.validation_loss:.4f}", flush=True)
    counts = study_counts(study)
    done = finished()
    cut = (f"; the deadline (--deadline-s) came at {done} of {job['trials']} trials: the same command goes on"
           if done < job["trials"] else "")
    return f"{name}: {counts[COMPLETE]} complete, {counts[FAILED]} failed{cut}"


def run_studies(args: argparse.Namespace) -> None:
    from trainer.corpus import CorpusSource
    from trainer.data import prepare_data

    specs = args.studies.split(",")
    profile, _, _ = profile_setup("cpu")
    fixed = load_space(SPACES / profile["space"]).fixed
    # Tokenised once here, before the processes would race to write the same cache.
    prepare_data(CorpusSource.from_args(data_dir=args.data), vocab_size=fixed["vocab_size"],
                 seq_len=fixed["max_seq_len"], cache_dir=args.cache_dir)
    deadline = time.time() + args.deadline_s  # counted from here: the data's first preparation takes a minute
    threads = max(1, (os.cpu_count() or 1) // len(specs))
    jobs = [{"spec": spec, "out": args.out, "trials": args.trials, "budget": args.budget, "data": args.data,
             "cache_dir": args.cache_dir, "deadline": deadline, "threads": threads} for spec in specs]
    with concurrent.futures.ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(drive, jobs):
            print(line, flush=True)


# ---- 2. the confirmations -----------------------------------------------------------------------

def confirm(args: argparse.Namespace, names: list[str]) -> tuple[Crams, dict]:
    from trainer.config import load_run_config

    winners = {}
    for name in names:
        arch, train, _ = study_winner(storage_of(args.out, name), name)
        winners[name] = (arch, train)
    baselines = {name: load_run_config(CONFIGS / f"{name}.yaml") for name in args.baselines}
    configs = {**winners, **{name: (run.arch.to_dict(), run.train.to_dict()) for name, run in baselines.items()}}
    crams = Crams(Path(args.out), args.data, args.cache_dir, Budget.parse(args.budget), args.jobs)
    crams.run([(name, arch, train, m, seed) for name, (arch, train) in configs.items() for m in args.confirm_at for seed in SEEDS]
              + [("sized-cpu", *configs["sized-cpu"], m, seed) for m in args.curve for seed in SEEDS[:args.curve_seeds]])
    return crams, configs


# ---- 3. the table -------------------------------------------------------------------------------

def mean_text(values: list[float]) -> str:
    if not values:
        return "–"
    mean, half = mean_interval(values)
    return f"{mean:.3f}" + (f" ± {half:.3f}" if half is not None else "")


def payback_text(paid: dict, what: str, beyond: float | None = None) -> str:
    """`beyond`: the largest multiple of sized-cpu's curve when the winner's loss lies past it (the
    saving, so the payback, is not measured there, rather than none)."""
    if beyond is not None:
        return f"not measured (multiple beyond the curve's {beyond:g}x)"
    if paid["payback_runs"] is None:
        return "never"
    return f"{paid['payback_runs']:.1f} runs ({what} = {paid['search_in_final_runs']:.0f} finals)"


def table(crams: Crams, configs: dict, names: list[str], out: str, budget: Budget, curve_at: tuple[float, ...],
          confirm_at: tuple[float, ...]) -> str:
    reference = crams.any("sized-cpu")
    floor, count = reference["corruption_floor"], reference["context_reference"]
    curve_at = [m for m in curve_at if crams.losses("sized-cpu", m)]  # what has run
    curve = [statistics.mean(crams.losses("sized-cpu", m)) for m in curve_at]
    lines = [f"# The proving ground at {budget.text} per trial ({len(SEEDS)} seeds per cram, on {reference['device']})", "",
             f"References: corruption floor {floor:.3f}, two-neighbour count model {count:.3f}; sized-cpu's curve "
             + ", ".join(f"{m:g}x {loss:.3f} ({len(crams.losses('sized-cpu', m))} seeds)" for m, loss in zip(curve_at, curve))
             + ".", "",
             "| configuration | 1x | 3x | regime at 1x | 1x − sized-cpu | 3x − sized-cpu | multiple | payback "
             "| payback of the whole path |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in [name for name in configs if name not in names] + names:
        arch = ArchConfig.from_dict(configs[name][0])
        ones, threes = crams.losses(name, 1), crams.losses(name, 3)
        if not ones:
            continue
        cells = [f"{name}: {arch.describe()}", mean_text(ones), mean_text(threes),
                 regime(statistics.mean(ones), floor, count) if ones else "–"]
        if name in names:
            cells += [paired(base, losses) if losses and (base := crams.losses("sized-cpu", m)) else "–"
                      for m, losses in ((1, ones), (3, threes))]
            factor = compute_equivalent(curve_at, curve, statistics.mean(ones))
            cost = study_compute(storage_of(out, name), name)
            final = statistics.mean(crams.flops(name, 1))
            # The whole path (issue 26 §3): the study and the winner's confirmation crams at every multiple.
            confirmations = sum(sum(crams.flops(name, m)) for m in confirm_at)
            beyond = curve_at[-1] if factor is None else None
            cells += [f">{curve_at[-1]:g}x" if factor is None else f"{factor:.2f}x",
                      payback_text(payback(cost["flops"], final, factor), f"{cost['trials']} trials", beyond),
                      payback_text(payback(cost["flops"] + confirmations, final, factor), "with the confirmations", beyond)]
        else:
            cells += ["", "", "", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "multiple: the compute sized-cpu needs for the winner's 1x mean loss (interpolated in log compute "
              "over its curve); payback: final runs at 1x after which the study's compute is paid back "
              f"(target ≤ {PAYBACK_RUNS}), its size in final runs beside it; of the whole path: the study and the "
              "winner's confirmation crams together (what a user spends before the final run)."]
    return "\n".join(lines) + "\n"


def multiples(text: str) -> tuple[float, ...]:
    return tuple(float(m) for m in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--studies", default=STUDIES, help="controller:seed, comma-separated")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--budget", default="2e12flops", help="each trial's (the 1x budget)")
    parser.add_argument("--deadline-s", type=float, default=float("inf"), help="no trial starts after this many seconds")
    parser.add_argument("--stages", default="studies,confirm", help="studies, confirm (the table follows confirm)")
    parser.add_argument("--baselines", default=BASELINES, type=lambda text: list(dict.fromkeys(["sized-cpu", *text.split(",")])),
                        help=f"hand designs crammed beside the winners (default {BASELINES}; sized-cpu always)")
    parser.add_argument("--confirm-at", default=CONFIRM, type=multiples, help=f"multiples (default {CONFIRM})")
    parser.add_argument("--curve", default=CURVE, type=multiples,
                        help="sized-cpu's multiples for the compute-equivalent multiple (default 1,2,3,4,8)")
    parser.add_argument("--curve-seeds", type=int, default=len(SEEDS), choices=range(1, len(SEEDS) + 1),
                        help="seeds of sized-cpu's curve where --confirm-at has none (default %(default)s; its 8x alone "
                             "costs 8 trial budgets a seed)")
    parser.add_argument("--jobs", type=int, default=2, help="confirmation crams at once")
    parser.add_argument("--cache-dir")
    parser.add_argument("--out", default="direct-proving-ground")
    args = parser.parse_args()
    Budget.parse(args.budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [study_name(spec) for spec in args.studies.split(",")]
    stages = set(args.stages.split(","))
    if "studies" in stages:
        run_studies(args)
    if "confirm" in stages:
        crams, configs = confirm(args, names)
        text = table(crams, configs, names, args.out, Budget.parse(args.budget), args.curve, args.confirm_at)
        (out / "proving_ground.md").write_text(text)
        print("\n" + text)


if __name__ == "__main__":
    try:
        main()
    except UsageError as error:  # e.g. a kept cram of another architecture: said before anything is crammed
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
