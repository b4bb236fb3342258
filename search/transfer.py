"""Transfer: how far the trial budget's ranking holds at the budget a user trains at (issue 26 §4).

    CRAMNAS_CACHE=/tmp/cramnas-cache python -m search.transfer --data ../shared/data \\
        (--study NAME --storage sqlite:///proving-ground/optuna.db | --table benchmarks/cram_table.csv
         | --configs a.yaml,b.yaml,...) [--top 6] \\
        [--baselines crammed-bert-cpu,neobert-cpu,modernbert-cpu,sized-cpu] [--budget 2e12flops] \\
        [--multiples 1,3,10,30] [--seeds-at 30x=1[,NAME:30x=2]] [--size-fit sizing-sized-cpu/size-fit.json] \\
        [--ladder-pick TRIAL | --ladder 3,10,30 [--eta 3]] [--out transfer] [--report-only]

The configurations are the study's `--top` complete trials by validation loss ("trial N": their
architecture, the study's training settings), or with `--table` the `--top` architectures of a
real-cram table (benchmarks/cram_table.py: a space-filling design of the CPU space crammed at one
budget, what a random search of that many trials would confirm) by mean loss over their seeds, hand
designs left out ("design:N"/"recorded:..." as the table names them, the CPU profile's trial
settings), or with `--configs` the run configs named (e.g. `search.export`'s winner of each of
several studies; each named by its file's stem, with its own training settings; one whose design
an earlier one has, at another size, e.g. `search.sizing.size_family`'s copy, is "other size": ranked
and crammed like the rest, but no candidate of the ladder or the 1x winner), and the hand
designs of `--baselines`
(trainer/configs/<name>.yaml). Each is crammed at every multiple of the 1x budget (default: the
study's trial budget), with seeds 0..k-1: k is 3, or what `--seeds-at` says (default 30x=1; `NAME:30x=2`
for configuration NAME alone, e.g. more seeds where two are close). With
`--size-fit` each hand design is also crammed at the size the fit picks for each multiple's budget
(`search.sizing.resized`), as `<name>@sized`; where that is the hand design's own size, its crams
are the hand design's. The crams are `search.analysis.crams.Crams`: kept in `<out>/crams.jsonl`,
so a second call crams only what is missing (a kept cram of another architecture under a
configuration's name is an error: pass another `--out`), and `--report-only` writes the tables from the crams
there so far (a cell without crams is "-").

The tables (stdout and `<out>/transfer.md`): every configuration's mean ± 95% Student-t interval at
each multiple with its regime, † where the mean is below the two-neighbour count model; Spearman
and Kendall between each multiple and the largest over the fixed configurations (a resized design
is a different model at each multiple, so it has no rank to carry), with bootstrap intervals; the
best at 1x and at the largest multiple; with `--ladder-pick TRIAL` (the pick of `search.confirm
--ladder`), or with `--ladder RUNGS` the pick of that ladder replayed over these crams (successive
halving, `--eta`: the ladder would run these very crams), that pick at the largest multiple against
the 1x winner (the best candidate at 1x: what a search confirmed only at its trial budget would
export) and against the best hand design there (resized with `--size-fit`), paired by seed. Where
one design is crammed at three sizes or more, `search.sizing`'s fit of its best size against compute
over the mean losses: each multiple's best size, N_opt = a C^b and each budget held out in turn,
also written as `<out>/size-fit-<name>.json` for `search.export --target-budget B --size-fit FILE`
(a note says where it would size a hand design otherwise than the `--size-fit` its crams had).
The cells and the tables are search/analysis/transfer.py's; the size fits are made here, since
search.sizing is a command of this layer.

Cost: 72 trial budgets of crams per configuration at the defaults (3 x 1 + 3 x 3 + 3 x 10 + 1 x 30).
Measured on the 2-core AMD EPYC at 2e12 FLOPs per trial budget (benchmarks/RESULTS.md, "Transfer
from the trial budget to 30x"): one trial budget takes about 0.5 core-minutes at 2x128 and 1-1.3 at
hidden 32 (small models are slower per FLOP), so a configuration costs some 40 to 95 core-minutes
and 10 of them 7 to 16 core-hours (half that in wall time on two cores): on a CPU, run the 30x
rung for a few configurations.
"""

from __future__ import annotations

import csv
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from search.analysis.crams import Crams
from search.analysis.ladder import DEFAULT_ETA, multiple_of
from search.analysis.transfer import (
    SIZED,
    Cell,
    best_lines,
    cells,
    configuration_table,
    correlation_table,
    design_of,
    fitted_pick,
    ladder_pick_lines,
    replayed_ladder,
    resized_otherwise,
    size_families,
    write_size_fits,
)
from search.base.paths import CONFIGS, PROFILES
from search.sizing import SizingError, best_cell, fit_lines, fit_size, load_size_fit, non_embedding_params, short_count, size_name
from search.sizing import resized as sized_run
from space.arch import ArchConfig
from space.errors import CramnasError, UsageError
from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.console import CliParser, one_line_on_ctrl_c
from trainer.data_flags import CACHE_HELP

MULTIPLES = "1,3,10,30"
SEEDS = 3  # at every multiple `--seeds-at` does not name
SEEDS_AT = {30.0: 1}  # without --seeds-at: 30x costs as much as all the others together, so one seed


# ---- what is crammed -----------------------------------------------------------------------------

@dataclass
class Configuration:
    name: str
    kind: str  # "candidate" | "other size" (a candidate's design at another size) | "hand design" | "resized"
    train: dict
    archs: dict[float, dict]  # the architecture crammed at each multiple
    crammed_as: dict[float, str]  # the name its crams are kept under at each multiple
    seeds: dict[float, int] = field(default_factory=dict)  # where `--seeds-at NAME:Mx=K` names it

    def seed_count(self, seeds_at: dict[float, int], m: float) -> int:
        return self.seeds.get(m, seeds_at[m])

    def arch(self, m: float) -> ArchConfig:
        return ArchConfig.from_dict(self.archs[m])

    def size(self, m: float) -> str:
        return size_name(self.arch(m))

    @classmethod
    def fixed(cls, name: str, kind: str, arch: dict, train: dict, multiples):
        return cls(name, kind, train, {m: arch for m in multiples}, {m: name for m in multiples})


def resized_designs(baselines: list[Configuration], runs: dict, fit, budget: Budget, multiples) -> tuple[list, list[str]]:
    """Each hand design at the size `fit` picks for each multiple's FLOP budget, and the fit's
    warnings (a prediction beyond its grid). Where the pick is the design's own size, the crams
    are the hand design's: the same model, seed and budget need no second cram."""
    configs, warnings = [], []
    for base in baselines:
        archs, names = {}, {}
        for m in multiples:
            run, choice = sized_run(runs[base.name], fit, multiple_of(budget, m))
            archs[m] = run.arch.to_dict()
            names[m] = base.name if archs[m] == base.archs[m] else base.name + SIZED
            if choice.warning:
                warnings.append(f"{base.name} at {m:g}x: {choice.warning}")
        configs.append(Configuration(base.name + SIZED, "resized", base.train, archs, names))
    return configs, warnings


def wanted(configs: list[Configuration], seeds_at: dict[float, int]) -> list[tuple[str, dict, dict, float, int]]:
    """(name, arch, train, multiple, seed) of every cram, in `Crams.run`'s terms."""
    return [(c.crammed_as[m], c.archs[m], c.train, m, seed)
            for c in configs for m in seeds_at for seed in range(c.seed_count(seeds_at, m))]


# ---- the size fit: search.sizing's, over the crams' means ------------------------------------------

def family_fit(family: list[Configuration], table: dict[str, dict[float, Cell]], budget: Budget, multiples):
    """The family smallest N first and search.sizing's fit of how its best size grows with compute,
    over its mean losses at each multiple with two sizes or more (None and why, when there is too
    little to fit yet)."""
    family = sorted(family, key=lambda c: non_embedding_params(c.arch(multiples[0])))
    # a multiple with one size crammed so far says nothing of the best size there
    compared = [m for m in multiples if sum(m in table[c.name] for c in family) >= 2]
    rows = [{"budget_flops": budget.amount * m, "size": c.size(multiples[0]),
             "non_embedding_params": non_embedding_params(c.arch(multiples[0])), "validation_loss": table[c.name][m].mean}
            for c in family for m in compared if m in table[c.name]]
    try:
        return family, fit_size(rows), ""
    except SizingError as error:
        return family, None, str(error)


def size_fits(configs: list[Configuration], table: dict[str, dict[float, Cell]], budget: Budget, multiples) -> dict:
    """Each size family's `family_fit` (family, fit or None, why not), by the family's name."""
    return {name: family_fit(family, table, budget, multiples) for name, family in size_families(configs, multiples).items()}


def size_fit_lines(family: list[Configuration], fit, why: str | None, table: dict[str, dict[float, Cell]],
                   budget: Budget, multiples) -> list[str]:
    """The family's losses by size and multiple, each multiple's best size (IsoFLOP parabola), the
    fit N_opt = a C^b (None: `why` not) and each budget held out in turn."""
    lines = ["| size | configuration | N | " + " | ".join(f"{m:g}x" for m in multiples) + " |",
             "|---|---|---|" + "---|" * len(multiples)]
    best = {round(b.budget_flops / budget.amount, 6): b for b in fit.best} if fit else {}
    for c in family:
        arch, size = c.arch(multiples[0]), c.size(multiples[0])
        means = [("-" if m not in table[c.name] else f"**{table[c.name][m].mean:.3f}**"
                  if m in best and best[m].size == size else f"{table[c.name][m].mean:.3f}") for m in multiples]
        lines.append(f"| {size} | {c.name} | {short_count(non_embedding_params(arch))} | " + " | ".join(means) + " |")
    if fit is None:
        return lines + ["", f"no fit yet: {why}", ""]
    lines.append("| best N | | | " + " | ".join(best_cell(best.get(m)) for m in multiples) + " |")
    return lines + ["", "N: non-embedding parameters; the mean over each cell's seeds.", "", *fit_lines(fit), ""]


# ---- the report ----------------------------------------------------------------------------------

def report(configs: list[Configuration], table: dict[str, dict[float, Cell]], budget: Budget, multiples,
           seeds_at: dict[float, int], fits: dict, pick: str | None = None, notes: list[str] = (),
           resamples: int = 5000) -> str:
    """The whole report; `fits`: `size_fits` of these crams (also written beside the report)."""
    fixed = [c.name for c in configs if c.kind != "resized"]
    candidates = [c.name for c in configs if c.kind == "candidate"]
    hands = [c.name for c in configs if c.kind == "hand design"]
    resized = [c.name for c in configs if c.kind == "resized"]
    reference = next((cell for row in table.values() for cell in row.values()), None)
    own_seeds = [f"; {c.name} at {m:g}x: {n}" for c in configs for m, n in c.seeds.items()]
    lines = [f"# Transfer: 1x = {budget.text}; seeds at " + ", ".join(f"{m:g}x: {seeds_at[m]}" for m in multiples)
             + "".join(own_seeds), ""]
    if reference is not None:
        lines += [f"corruption floor {reference.corruption_floor:.3f}, two-neighbour count model "
                  f"{reference.context_reference:.3f}", ""]
    ranks = lambda names, words: [f"## Ranks against {multiples[-1]:g}x over the {len(names)} {words}", "",
                                  *correlation_table(table, names, multiples, resamples)]
    lines += [*configuration_table(configs, table, multiples), *ranks(fixed, "fixed configurations")]
    # Across sizes the ranks mostly order sizes; the study's candidates alone ask the ladder's question.
    if 0 < len(candidates) < len(fixed):
        lines += ranks(candidates, "study candidates")
    lines += best_lines(table, fixed, multiples, resized)
    if pick is not None:
        lines += ["## The ladder's pick", "", *ladder_pick_lines(table, pick, candidates, hands, resized, multiples)]
        sized = fitted_pick(fits, pick, budget, multiples)
        if sized not in (None, pick):  # the whole path: study, ladder, size fit, export
            lines += [f"Its design at the size the fit below chooses for {multiples[-1]:g}x:", "",
                      *ladder_pick_lines(table, sized, candidates, hands, resized, multiples,
                                         "the ladder's pick at the fitted size")]
    for name, fitted in fits.items():
        named = next(config for config in fitted[0] if config.name == name)
        lines += [f"## Size fit of {name}'s design ({ArchConfig.from_dict(named.archs[multiples[0]]).describe()})",
                  "", *size_fit_lines(*fitted, table, budget, multiples)]
    return "\n".join(lines + [f"note: {note}" for note in notes]) + "\n"


# ---- the command ---------------------------------------------------------------------------------

def parse_multiples(text: str, flag: str = "--multiples", example: str = MULTIPLES, least: int = 2) -> tuple[float, ...]:
    try:
        multiples = tuple(float(part.strip().removesuffix("x")) for part in text.split(","))
    except ValueError:
        raise UsageError(f"{flag}: cannot read {text!r}; write e.g. {example}") from None
    if len(multiples) < least or any(m <= 0 for m in multiples) or list(multiples) != sorted(set(multiples)):
        raise UsageError(f"{flag}: {'two' if least == 2 else 'one'} or more positive multiples, increasing, "
                         f"e.g. {example}; got {text!r}")
    return multiples


def parse_seeds_at(text: str | None, multiples: tuple[float, ...]) -> tuple[dict[float, int], dict[str, dict[float, int]]]:
    """`30x=1,10x=2,sized-cpu@sized:30x=2` -> seeds per multiple, SEEDS where not named (without it:
    SEEDS_AT), and the seeds of the configurations named before a colon, where they differ."""
    seeds, named = {m: SEEDS_AT.get(m, SEEDS) if text is None else SEEDS for m in multiples}, {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, _, spec = part.rpartition(":")
        multiple, _, count = spec.partition("=")
        try:
            m, n = float(multiple.strip().removesuffix("x")), int(count)
        except ValueError:
            raise UsageError(f"--seeds-at: cannot read {part!r}; write e.g. 30x=1, or NAME:30x=2 for one "
                             "configuration") from None
        if m not in seeds or n < 1:
            raise UsageError(f"--seeds-at: {part!r}: a multiple of --multiples and one seed or more")
        (named.setdefault(name.strip(), {}) if name else seeds)[m] = n
    return seeds, named


def study_candidates(storage, study_name: str, top: int, pick: int | None) -> tuple[list[tuple[int, dict]], dict, str]:
    """The study's top `top` complete trials by validation loss as (number, arch), the ladder's pick
    among them when it is not, the study's training settings and its trial budget."""
    import optuna

    from search.analysis.ranking import ranked_trials
    from search.base.objectives import OBJECTIVES

    if isinstance(storage, str) and storage.startswith("sqlite:///") and not Path(storage[10:]).is_file():
        raise UsageError(f"--storage: {storage[10:]} does not exist")  # optuna would create an empty one
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(f"--study {study_name}: no such study in --storage") from None
    ranked = ranked_trials(study, OBJECTIVES["mlm"])
    if len(ranked) < top:
        raise UsageError(f"--study {study_name}: {len(ranked)} complete trials with a validation loss, "
                         f"fewer than --top {top}")
    chosen = ranked[:top]
    if pick is not None and pick not in {t.number for t in chosen}:
        extra = [t for t in ranked if t.number == pick]
        if not extra:
            raise UsageError(f"--ladder-pick {pick}: not a complete trial of {study_name} with a validation loss")
        chosen += extra  # crammed like the others: its 1x is part of the story
    return [(t.number, t.user_attrs["arch"]) for t in chosen], study.user_attrs["train"], study.user_attrs["budget"]


def table_candidates(path: str, top: int) -> tuple[list[tuple[str, dict]], dict, str]:
    """The `top` architectures of a cram table by mean loss (hand designs left out) as (source,
    arch), the CPU profile's trial settings the table was crammed with, and the table's budget."""
    from search.analysis.cram_table import read_crams

    if not Path(path).is_file():
        raise UsageError(f"--table: {path} does not exist; write e.g. --table benchmarks/cram_table.csv")
    crams, _ = read_crams(path)
    groups: dict[str, list] = {}
    for cram in crams:
        if not cram.source.startswith("hand:"):
            groups.setdefault(cram.architecture, []).append(cram)
    if len(groups) < top:
        raise UsageError(f"--table {path}: {len(groups)} architectures besides the hand designs, fewer than --top {top}")
    ranked = sorted(groups.values(), key=lambda rows: statistics.mean(r.loss for r in rows))[:top]
    with Path(path).open(newline="") as file:
        budgets = {row["budget"] for row in csv.DictReader(file)}
    if len(budgets) != 1:
        raise UsageError(f"--table {path}: crams at {len(budgets)} budgets; a transfer starts from one")
    return [(rows[0].source, rows[0].config.to_dict()) for rows in ranked], cpu_trial_settings(), budgets.pop()


def cpu_trial_settings() -> dict:
    """The CPU profile's trial settings, what benchmarks/cram_table.py crams with: its run config's
    training settings under the profile's own."""
    from search.run import load_profile, trial_train

    return trial_train(load_profile(PROFILES / "cpu.yaml"), PROFILES / "cpu.yaml").to_dict()


def config_candidates(paths: str) -> list[tuple[str, dict, dict]]:
    """Run configs (e.g. `search.export`'s, one per study) as (name, arch, train): each named by its
    file's stem and crammed with its own training settings."""
    chosen = []
    for path in filter(None, (p.strip() for p in paths.split(","))):
        run = load_run_config(path)  # a ConfigError names the file and what is wrong
        chosen.append((Path(path).stem, run.arch.to_dict(), run.train.to_dict()))
    names = [name for name, _, _ in chosen]
    if not chosen or len(set(names)) != len(names):
        raise UsageError(f"--configs: one or more YAML files with different names; got {paths!r}")
    return chosen


def build_parser() -> CliParser:
    """The command line of `python -m search.transfer` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m search.transfer", description=__doc__)
    parser.add_argument("--data", required=True, help="local data directory the crams train on, e.g. ../shared/data")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--study", help="the study whose best trials are the candidates (with --storage)")
    source.add_argument("--table", help="a benchmarks/cram_table.py table whose best architectures are the candidates")
    source.add_argument("--configs", help="run configs (YAML, e.g. search.export's of several studies) that are the "
                        "candidates, comma-separated, each named by its file's stem")
    parser.add_argument("--storage", help="the study's Optuna storage, e.g. sqlite:///optuna.db")
    parser.add_argument("--top", type=int, default=6, help="the study's (or the table's) best to follow")
    parser.add_argument("--baselines", default="crammed-bert-cpu,neobert-cpu,modernbert-cpu,sized-cpu",
                        help="hand designs crammed beside the candidates, comma-separated names of trainer/configs/")
    parser.add_argument("--budget", help="the 1x budget (default: the study's or the table's, else 2e12flops)")
    parser.add_argument("--multiples", default=MULTIPLES, help="the multiples of the 1x budget crammed, increasing")
    parser.add_argument("--seeds-at", help=f"seeds per multiple where not {SEEDS}, e.g. 30x=1 (the default); "
                        "NAME:30x=2 for configuration NAME alone")
    parser.add_argument("--size-fit", help="a search.sizing size-fit.json: the hand designs also resized")
    ladder = parser.add_mutually_exclusive_group()
    ladder.add_argument("--ladder-pick", type=int, help="the trial search.confirm --ladder picked")
    ladder.add_argument("--ladder", help="the rungs (multiples, e.g. 3,10,30) of a ladder replayed over these "
                        "crams: its pick, without running search.confirm")
    parser.add_argument("--eta", type=int, default=DEFAULT_ETA, help="with --ladder: the best 1/eta go up")
    parser.add_argument("--jobs", type=int, default=2, help="crams at once, each on cpus // jobs threads")
    parser.add_argument("--report-only", action="store_true",
                        help="cram nothing: the tables from the crams in --out so far (e.g. while a call runs)")
    parser.add_argument("--cache-dir", help=CACHE_HELP)
    parser.add_argument("--out", default="transfer", help="where crams.jsonl, transfer.md and the size fits go")
    return parser


def parse_arguments(argv: list[str] | None) -> object:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.top < 1 or args.jobs < 1 or args.eta < 2:
        parser.error("--top and --jobs: 1 or more; --eta: 2 or more")
    if args.study and not args.storage:
        parser.error("--study needs --storage, e.g. --storage sqlite:///optuna.db")
    if not args.study and args.ladder_pick is not None:
        parser.error("--ladder-pick names a trial of --study; a table or configs have no ladder")
    return args


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        plan = settle(args)
    except CramnasError as error:  # bad flags, study, configs or fit: before any training
        print(f"error: {error}", file=sys.stderr)
        return 2
    configs, budget, multiples, seeds_at, pick, rungs, notes = plan
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    crams = Crams(out, args.data, args.cache_dir, budget, args.jobs)
    try:  # a kept cram of another architecture under one of these keys: refused before anything is crammed
        if args.report_only:
            crams.check(wanted(configs, seeds_at))
        else:
            crams.run(wanted(configs, seeds_at))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    table = cells(crams, configs, seeds_at)
    if rungs:
        candidates = [c.name for c in configs if c.kind == "candidate"]
        pick = replayed_ladder(table, candidates, rungs, args.eta, budget)
        notes = [*notes, f"the ladder's pick: replayed over rungs {', '.join(f'{m:g}x' for m in rungs)}, eta {args.eta}"]
    fits = size_fits(configs, table, budget, multiples)
    notes = [*notes, *write_size_fits(out, fits, multiples), *resized_otherwise(configs, fits, budget, multiples)]
    text = report(configs, table, budget, multiples, seeds_at, fits, pick, notes)
    (out / "transfer.md").write_text(text)
    print("\n" + text)
    return 0


def settle(args) -> tuple:
    """Every input read and checked: the configurations, 1x budget, multiples, seeds, pick, notes."""
    if not Path(args.data).is_dir():
        raise UsageError(f"--data: {args.data} is not a directory")
    multiples = parse_multiples(args.multiples)
    seeds_at, named_seeds = parse_seeds_at(args.seeds_at, multiples)
    study_budget = None
    if args.configs:
        chosen = config_candidates(args.configs)
    elif args.table:
        tops, train, study_budget = table_candidates(args.table, args.top)
        chosen = [(name, arch, train) for name, arch in tops]
    else:
        trials, train, study_budget = study_candidates(args.storage, args.study, args.top, args.ladder_pick)
        chosen = [(f"trial {n}", arch, train) for n, arch in trials]
    budget = Budget.parse(args.budget or study_budget or "2e12flops")
    configs, designs = [], set()
    for name, arch, train in chosen:  # a design given again at another size (for its size fit) is no new candidate
        design = design_of(arch)
        configs.append(Configuration.fixed(name, "other size" if design in designs else "candidate", arch, train, multiples))
        designs.add(design)
    runs = {}
    for name in filter(None, args.baselines.split(",")):
        if not (CONFIGS / f"{name}.yaml").is_file():
            raise UsageError(f"--baselines: {name}: no trainer/configs/{name}.yaml")
        runs[name] = load_run_config(CONFIGS / f"{name}.yaml")
        if name in {c.name for c in configs}:
            raise UsageError(f"--configs: {name} is also a --baselines hand design; rename the file")
    hands = [Configuration.fixed(name, "hand design", run.arch.to_dict(), run.train.to_dict(), multiples)
             for name, run in runs.items()]
    notes = []
    if args.size_fit:
        if budget.kind != "flops":
            raise UsageError(f"--size-fit: a size fit is in FLOPs; the 1x budget {budget.text} is not")
        sized, notes = resized_designs(hands, runs, load_size_fit(args.size_fit), budget, multiples)
        hands += sized
    by_name = {c.name: c for c in configs + hands}
    for name, seeds in named_seeds.items():
        if name not in by_name:
            raise UsageError(f"--seeds-at: {name}: no such configuration; one of {', '.join(by_name)}")
        by_name[name].seeds = seeds
    pick = None if args.ladder_pick is None else f"trial {args.ladder_pick}"
    rungs = ()
    if args.ladder:
        rungs = parse_multiples(args.ladder, "--ladder", "3,10,30", least=1)
        if not set(rungs) <= set(multiples):
            raise UsageError(f"--ladder: every rung a multiple of --multiples ({args.multiples}); got {args.ladder!r}")
    return configs + hands, budget, multiples, seeds_at, pick, rungs, notes


if __name__ == "__main__":
    raise SystemExit(main())
