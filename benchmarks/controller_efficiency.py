"""How well each controller searches the CPU space, run against a surrogate of real crams.

No training: every trained trial is scored by `benchmarks/surrogate.py`, gradient boosting fitted to
the crams of `benchmarks/cram_table.csv` (as NAS-Bench-301 and YAHPO do), plus Gaussian noise with
the seed-to-seed standard deviation measured in that table, so a controller sees what a study sees:
a noisy loss. Each controller runs through `search.study.controllers` exactly as a study would
(open_study, ask, tell; in-memory storage), single objective `mlm` (validation loss, minimised),
one study per seed. A repeat of an architecture already trained is told the recorded value for
free, as the search driver does, and is not counted as a trial. Four variants, the first draw's two
parts with and without each other (`open_study(warm_starts=, cover=)`): `plain` (the sampler from
its first trial), `warm` (the CPU profile's hand designs as the first trials), `cover` (a covering
design that trains every value of every choice first) and `warm+cover` (both: search.run's default).

Read at 32, 64 and `--trials` trained trials, as prefixes of the same study (a study of 200 trials
read after its 32nd is a 32-trial study: controllers do not know the budget), which costs one study
per seed instead of three:
- regret: the noise-free surrogate value of the trial with the best observed (noisy) value so far,
  which is what a study would report as its winner, minus the optimum (the lowest prediction over the
  table's architectures and 20,000 random members of the space); median and worst decile (90th
  percentile) over seeds. Noise can make it rise: a new trial that looks better but is not;
- how often the winner so far has the best value of each of the surrogate's 3 most important fields;
- trials until one's noise-free value beats the measured mean loss of sized-cpu (the CPU hand
  design the table crams with 3 seeds): median over seeds, ">N" when the median seed never did;
  and beside it, trials until one beats the surrogate's value of sized-cpu, the bar a surrogate
  that shrinks sized-cpu's value towards the table's mean leaves within reach.

The noise of seed s is the same sequence in every controller's study s (common random numbers).
Optuna's GP sampler slows down with every trial (here ~90 s per 200-trial study, most of a full
run's time; `CAPS`): `--cap gp=100` runs it for fewer, the output says so, reads it at its cap, and
shows what it did not run as "-".

    python benchmarks/controller_efficiency.py                 # all controllers and variants, 30 seeds x 200
    python benchmarks/controller_efficiency.py --controllers tpe random --variants plain --seeds 5
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna
import surrogate as surrogates  # benchmarks/surrogate.py: run as a script, this file's folder is on sys.path
from threadpoolctl import threadpool_limits

from search.study.controllers import CONTROLLERS, ask, open_study, tell
from search.study.warm_start import hand_designs
from space import ArchConfig, SearchSpace
from trainer.console import CliParser

VARIANTS = ("plain", "warm", "cover", "warm+cover")
READS = (32, 64)  # and --trials
BASELINE = "hand:sized-cpu"
# Trials per study at most, below --trials, for a controller too slow for it (`--cap gp=100`). None
# by default. Measured (one core, beside a cram table run), for one 200-trial study: random, nsga2
# and evolution ~0.6 s, cmaes ~1 s, tpe ~3 s, gp ~90 s (an ask takes ~0.6 s by trial 200; 36 s
# for 100 trials): the default 30 seeds x 4 variants is ~3 hours of gp, ~10 minutes of the rest.
CAPS: dict[str, int] = {}
# Asks per study at most, repeats included: a converged sampler that only proposes architectures
# already trained would otherwise never reach its trial count. The study stops, noted in the output.
MAX_ASKS_PER_TRIAL = 20


@dataclass
class Study:
    """One study's trained trials, in order: noise-free value, observed value, architecture."""

    true: list[float] = field(default_factory=list)
    observed: list[float] = field(default_factory=list)
    configs: list[ArchConfig] = field(default_factory=list)
    stalled: bool = False  # stopped early: only repeats for MAX_ASKS_PER_TRIAL x trials asks

    def winner(self, trials: int) -> int:
        """The index of the best observed value among the first `trials` (first on ties)."""
        return int(np.argmin(self.observed[:trials]))


def run_study(space: SearchSpace, score, controller: str, variant: str, seed: int, trials: int,
              noise_sd: float) -> Study:
    """One study of `trials` trained trials; `score(config)` is the noise-free value."""
    warm = hand_designs("cpu") if variant.startswith("warm") else ()
    study = open_study(f"{controller}-{variant}-{seed}", None, controller, "mlm", space, seed=seed,
                       warm_starts=warm, cover=variant.endswith("cover"))
    noise = np.random.default_rng(seed)
    result = Study()
    for _ in range(MAX_ASKS_PER_TRIAL * trials):
        if len(result.true) >= trials:
            break
        proposal = ask(study, space)
        if proposal.repeat_of is not None:
            tell(study, proposal.number, study.get_trials(deepcopy=False)[proposal.repeat_of].values)
            continue
        value = score(proposal.config)
        observed = value + noise.normal(0.0, noise_sd)
        tell(study, proposal.number, [observed])
        result.true.append(value)
        result.observed.append(observed)
        result.configs.append(proposal.config)
    result.stalled = len(result.true) < trials
    return result


class Scorer:
    """The surrogate's noise-free value of one config, remembered by fingerprint: studies revisit."""

    def __init__(self, surrogate: surrogates.Surrogate) -> None:
        self.surrogate, self.cache = surrogate, {}

    def __call__(self, config: ArchConfig) -> float:
        key = config.fingerprint()
        if key not in self.cache:
            self.cache[key] = float(self.surrogate.predict([config])[0])
        return self.cache[key]


@dataclass
class Outcome:
    """Every study of one controller x variant, read at `reads` trials (those within `cap`)."""

    controller: str
    variant: str
    cap: int
    studies: list[Study]
    seconds: float

    def regrets(self, trials: int, optimum: float) -> np.ndarray:
        """Per seed: the winner's noise-free value minus the optimum, after `trials` trials (a study
        that stalled keeps its last winner: it would train nothing new)."""
        return np.array([s.true[s.winner(trials)] - optimum for s in self.studies])

    def hits(self, trials: int, name: str, value) -> float:
        """The fraction of seeds whose winner after `trials` trials has `name` = `value`."""
        return float(np.mean([getattr(s.configs[s.winner(trials)], name) == value for s in self.studies]))

    def trials_to_beat(self, target: float) -> list[int | None]:
        """Per seed: trials until a noise-free value below `target`, None when none did."""
        return [next((i + 1 for i, v in enumerate(s.true) if v < target), None) for s in self.studies]


def benchmark(surrogate: surrogates.Surrogate, controller: str, variant: str, seeds: int, trials: int,
              score=None, noise_sd: float | None = None) -> Outcome:
    """`seeds` studies of `trials` trained trials each; the noise is the table's (`noise_sd` to change it)."""
    score = score or Scorer(surrogate)
    noise_sd = surrogate.noise_sd if noise_sd is None else noise_sd
    if not math.isfinite(noise_sd):
        raise ValueError("the table has no architecture crammed with 2+ seeds: no measured noise to add")
    start = time.perf_counter()
    studies = [run_study(surrogate.space, score, controller, variant, seed, trials, noise_sd)
               for seed in range(seeds)]
    return Outcome(controller, variant, trials, studies, time.perf_counter() - start)


def read_points(trials: int) -> list[int]:
    return sorted({r for r in READS if r < trials} | {trials})


def median_trials(results: Sequence[int | None], cap: int) -> str:
    median = float(np.median([math.inf if r is None else r for r in results]))
    return f">{cap}" if math.isinf(median) else f"{median:g}"


def report(surrogate: surrogates.Surrogate, outcomes: list[Outcome], trials: int, table: Path) -> str:
    optimum, best = surrogate.optimum()
    reads = sorted(set(read_points(trials)) | {o.cap for o in outcomes})  # a capped controller is read at its cap
    baseline = surrogates.source_mean(surrogate.crams, BASELINE)
    q = surrogate.quality.get(surrogate.model_name)
    fit = f"held-out Kendall {surrogates.interval(q.kendall)}, RMSE {q.rmse:.4f}" if q else "not cross-validated"
    lines = [f"Surrogate: {surrogate.model_name} on {len(surrogate.configs)} architectures of {table} ({fit}); "
             f"noise sd {surrogate.noise_sd:.4f} (pooled over {surrogate.noise_architectures} architectures with 2+ seeds).",
             f"Optimum {optimum:.4f} (table + {len(surrogate.members)} random members): {best.describe()}."]
    for controller, cap in dict.fromkeys((o.controller, o.cap) for o in outcomes if o.cap < trials):
        lines.append(f"Note: {controller} ran {cap} trials per study, not {trials} (capped as too slow here; "
                     f"--cap {controller}=N to change): it is read at {cap} too, and beyond shows as '-'.")
    for o in outcomes:
        stalled = sum(s.stalled for s in o.studies)
        if stalled:
            lines.append(f"Note: {o.controller} {o.variant}: {stalled} of {len(o.studies)} studies stopped early, "
                         f"proposing only architectures already trained; their later reads keep the last winner.")
    lines += ["", "Regret (nats above the optimum) of the winner so far: median / 90th percentile over seeds", "",
              "| controller | variant | seeds | " + " | ".join(f"{r} trials" for r in reads) + " | wall s |",
              "|---|---|---|" + "---|" * (len(reads) + 1)]
    below: list[float] = []  # per study whose winner at some read is below the optimum: how far
    for o in outcomes:
        cells = []
        for r in reads:
            if r > o.cap:
                cells.append("-")
                continue
            regrets = o.regrets(r, optimum)
            cells.append(f"{np.median(regrets):.4f} / {np.percentile(regrets, 90):.4f}")
        lines.append(f"| {o.controller} | {o.variant} | {len(o.studies)} | " + " | ".join(cells) + f" | {o.seconds:.0f} |")
        lowest = np.min([o.regrets(r, optimum) for r in reads if r <= o.cap], axis=0)
        below += [float(-x) for x in lowest if x < 0]
    if below:
        lines.append(f"\n{len(below)} studies reported a winner the surrogate puts below the optimum (negative "
                     f"regret; at most {max(below):.4f} nats below): the random members missed the best region.")

    fields = surrogate.top_fields(3)
    best_values = {name: surrogate.best_value(name)[0] for name in fields}
    lines += ["", "How often the winner so far has the best value of the most important fields "
              f"(fraction of seeds, at {' / '.join(map(str, reads))} trials):", "",
              "| controller | variant | " + " | ".join(f"{n}={v}" for n, v in best_values.items()) + " |",
              "|---|---|" + "---|" * len(fields)]
    for o in outcomes:
        cells = [" / ".join("-" if r > o.cap else f"{o.hits(r, n, v):.2f}" for r in reads) for n, v in best_values.items()]
        lines.append(f"| {o.controller} | {o.variant} | " + " | ".join(cells) + " |")

    if baseline is None:
        lines += ["", f"No rows of {BASELINE} in the table: no trials-to-beat-it table."]
        return "\n".join(lines)
    sized = next(c.config for c in surrogate.crams if c.source == BASELINE)
    predicted = float(surrogate.predict([sized])[0])
    # The measured mean is the asked-for bar; beside it, the surrogate's own value of sized-cpu, since
    # noise-free values are compared and a surrogate that predicts sized-cpu above its measured mean
    # (shrinkage towards the table's mean) puts that bar out of reach of every member of the space.
    lines += ["", f"Trials until a noise-free value below sized-cpu's measured mean loss {baseline:.4f}, and below "
              f"the surrogate's value of it, {predicted:.4f}: median over seeds (seeds that got there)"
              + ("; a warm start trains sized-cpu first, so it meets the first bar at trial 1 exactly when the "
                 "prediction is below the measured mean" if any(o.variant.startswith("warm") for o in outcomes) else "")
              + ":", "", "| controller | variant | below the measured mean | below the prediction |", "|---|---|---|---|"]
    for o in outcomes:
        cells = []
        for bar in (baseline, predicted):
            results = o.trials_to_beat(bar)
            cells.append(f"{median_trials(results, o.cap)} ({sum(r is not None for r in results)}/{len(results)})")
        lines.append(f"| {o.controller} | {o.variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_caps(parser: CliParser, items: Sequence[str]) -> dict[str, int]:
    caps = dict(CAPS)
    for item in items:
        name, _, value = item.partition("=")
        if name not in CONTROLLERS or not value.isdigit() or int(value) < 1:
            parser.error(f"--cap: {item!r} is not CONTROLLER=N with a controller of {', '.join(CONTROLLERS)} "
                         "and N >= 1, e.g. gp=100")
        caps[name] = int(value)
    return caps


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controllers", nargs="+", default=list(CONTROLLERS), choices=list(CONTROLLERS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--trials", type=int, default=200, help="trained trials per study")
    parser.add_argument("--cap", nargs="*", default=[], metavar="CONTROLLER=N",
                        help=f"fewer trials for a slow controller (default: {CAPS or 'none'})")
    parser.add_argument("--table", type=Path, default=surrogates.DEFAULT_TABLE)
    parser.add_argument("--members", type=int, default=surrogates.RANDOM_MEMBERS,
                        help="random members of the space the optimum is sought among")
    args = parser.parse_args()
    caps = parse_caps(parser, args.cap)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("search.study.controllers").setLevel(logging.ERROR)  # cmaes's note would repeat per study
    if "gp" in args.controllers:  # Optuna's GP runs on torch, whose threads threadpoolctl does not set
        import torch

        torch.set_num_threads(1)
    with threadpool_limits(1):  # one core: the machine crams beside it
        surrogate = surrogates.fit(args.table, members=args.members)
        score = Scorer(surrogate)
        outcomes = []
        for controller in args.controllers:
            for variant in args.variants:
                trials = min(args.trials, caps.get(controller, args.trials))
                outcome = benchmark(surrogate, controller, variant, args.seeds, trials, score)
                outcomes.append(outcome)
                print(f"{controller} {variant}: {args.seeds} studies x {trials} trials, {outcome.seconds:.0f} s",
                      flush=True)
        print()
        print(report(surrogate, outcomes, args.trials, args.table))


if __name__ == "__main__":
    main()
