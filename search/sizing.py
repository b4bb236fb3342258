"""Size for the target: how a design's best size grows with compute, and the design at the size a
target FLOP budget calls for (issue 26 §2).

    python -m search.sizing --config trainer/configs/sized-cpu.yaml --budgets 2e12flops,6e12flops,2e13flops \\
        --data ../shared/data [--sizes 1x16,1x32,1x64,2x64,2x128,4x128] [--seed 0] [--out sizing-sized-cpu/]

At a fixed FLOP budget the best size grows with compute: at 2e12 FLOPs a 1x32 model beats every
larger one, while a 2x128 passes a 1x64 near 3e13. So design and size are kept apart. A *design* is
an ArchConfig's every field but the size; a *size* is `LAYERSxHIDDEN`. `size_family` writes a design
at other sizes; the CLI crams each (size, budget) once with the run config's training settings;
`fit_size` finds, per budget, the loss-minimising size and fits how it grows with compute, as the
compute-optimal scaling literature does (Hoffmann et al. 2022, approaches 1 and 2):

* N, the size measure, is **non-embedding parameters** (Kaplan et al. 2020): all parameters but the
  vocabulary and position tables. At vocabulary 2048 the token table is 86% of a 1x32 model and
  depth hardly moves the total (1x64 to 2x64 is +24% of the total, 2x of N), so total parameters
  would bunch the small sizes together; N follows depth and width as the compute per token does.
  Every row also keeps the total (`params`), and `fit_size(rows, measure="params")` fits on it.
* Per budget, the best N is the vertex of a parabola in (ln N, loss) through the size with the
  lowest loss and its two neighbours in N (Hoffmann's IsoFLOP minimum; for a curve with one
  minimum these are its lowest three points). When that size is an end of the grid, or the budget
  has fewer than three sizes, the best N is that size's own (the argmin), and `edge` says which end:
  the true optimum may lie beyond, so that budget gives a bound, not an estimate.
* Then least squares of ln N_opt on ln C: N_opt = coefficient x C^exponent, with its errors: the
  residual standard error in ln N (3+ budgets) and, with 3+ budgets, each budget held out in turn,
  predicted from the others' fit (`held_out`, their root mean square `held_out_error`): the error
  to expect on a budget the fit has not seen.

`SizeFit.choose(design, target_flops)` (and `config_for`, its ArchConfig) picks the size of a grid
nearest the prediction in ln N; a prediction outside the grid gets its nearest end and
`beyond_grid` says so ("below" or "above"), so that `search.export --target-budget` can warn.

The default grid (DEFAULT_SIZES) is one chain of CPU-scale sizes (vocabulary 2048, rows of 64), each
step growing one dimension, never shrinking the other: 1x16, 1x32, 1x64, 2x64, 2x128, 4x128. Each
step doubles or quadruples N (2.7k to 658k for sized-cpu), so the losses along it are one curve in N
rather than a cloud of shapes (at 2e12 FLOPs 1x128 beat the smaller 2x64: depth costs more than
width here). 1x16 is there because sized-cpu's 1x32 won at 2e12 FLOPs: without a smaller size the
smallest budgets' minimum would sit at the grid's edge. 4x128 (0.92M parameters) is past the size
that wins near 3e13. Crammed at 2e12, 6e12 and 2e13 FLOPs, the grid costs about 1.7 hours of one
idle core (small models are slower per FLOP: 1x16 is 40% of it).

Crams run in this process through `trainer.cram.cram` on one thread (`--threads`), in order of
budget; each finished cram is one JSON line of `<out>/crams.jsonl` (`search.analysis.crams`) and a
second call crams only what is not there (a row counts when its design, training settings, seed,
data and budget are this call's). Then the table of losses, the best size per budget and the fit
are printed, and the fit is written to `<out>/size-fit.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from search.analysis.crams import Cram, CramStore
from space.arch import ArchConfig, ArchError
from space.errors import CramnasError, UsageError
from space.vocabulary import Position
from trainer.budget import Budget, BudgetError
from trainer.config import RunConfig, TrainConfig, load_run_config
from trainer.console import VERBOSE_HELP, CliParser, ProgressLines, count, one_line_on_ctrl_c, quiet_libraries
from trainer.data_flags import add_data_arguments

DEFAULT_SIZES = ("1x16", "1x32", "1x64", "2x64", "2x128", "4x128")  # why these: the module docstring
DEFAULT_MEASURE = "non_embedding_params"
CRAMS_FILE, FIT_FILE = "crams.jsonl", "size-fit.json"
_SIZE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)


class SizingError(CramnasError):
    pass


# ---- sizes of a design ---------------------------------------------------------------------------

def parse_size(size: str | tuple[int, int]) -> tuple[int, int]:
    """`"2x128"` (or `(2, 128)`) -> (layers, hidden)."""
    if isinstance(size, tuple):
        return size
    match = _SIZE.match(str(size))
    if match is None:
        raise ArchError(f"size {size!r}: write LAYERSxHIDDEN, e.g. 2x128")
    return int(match.group(1)), int(match.group(2))


def size_name(arch: ArchConfig) -> str:
    return f"{arch.layers}x{arch.hidden}"


def heads_for(hidden: int, head_dim: int, rotary: bool) -> int:
    """Heads at width `hidden` keeping the design's `head_dim`: hidden // head_dim when it divides,
    else the divisor of hidden nearest head_dim by ratio (|ln d/head_dim|; a tie takes the larger,
    fewer heads), even when positions are rotary (a rotation pairs a head's dimensions)."""
    dims = [d for d in range(1, hidden + 1) if hidden % d == 0 and (d % 2 == 0 or not rotary)]
    if not dims:
        raise ArchError(f"hidden {hidden}: rotary positions need an even head dim and none divides {hidden}")
    return hidden // min(dims, key=lambda d: (abs(math.log(d / head_dim)), -d))


def size_family(config: ArchConfig, sizes: Iterable[str | tuple[int, int]] = DEFAULT_SIZES) -> list[ArchConfig]:
    """The design of `config` (every field but layers, hidden and heads) at each size, in order;
    heads follow `heads_for`. An impossible size raises ArchError naming it."""
    family = []
    for size in sizes:
        layers, hidden = parse_size(size)
        try:
            heads = heads_for(hidden, config.head_dim, config.position == Position.ROTARY) if hidden >= 1 else 1
            family.append(config.replace(layers=layers, hidden=hidden, heads=heads))
        except ArchError as error:
            raise ArchError(f"size {layers}x{hidden}: {error}") from None
    return family


def non_embedding_params(arch: ArchConfig) -> int:
    """Kaplan et al. (2020)'s N: every parameter but the vocabulary-sized ones (token table, an
    untied decoder and its bias) and the position and segment ones (a learned table, the scale of
    scaled sinusoids)."""
    h, v = arch.hidden, arch.vocab_size
    tables = v * h * (1 if arch.tie_embeddings else 2) + (v if arch.decoder_bias else 0)
    tables += arch.position_params + (2 * h if arch.segment_embeddings else 0)
    return arch.num_params() - tables


MEASURES: dict[str, Callable[[ArchConfig], int]] = {"non_embedding_params": non_embedding_params,
                                                    "params": ArchConfig.num_params}


# ---- the fit -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BudgetBest:
    budget_flops: float
    size: str  # the grid size with the lowest loss
    params: float  # N_opt: the parabola's vertex, or `size`'s own N (method "argmin")
    method: str  # "parabola" | "argmin"
    edge: str = ""  # "smallest" | "largest" when `size` is an end of the grid: N_opt is a bound


@dataclass(frozen=True)
class HeldOut:
    budget_flops: float
    predicted: float  # N_opt from the fit to the other budgets
    measured: float  # the budget's own N_opt

    @property
    def error(self) -> float:
        """ln(predicted / measured): 0.1 is a prediction 10.5% too large."""
        return math.log(self.predicted / self.measured)


@dataclass(frozen=True)
class SizeChoice:
    """A design sized for a target budget, and how sure that is."""

    arch: ArchConfig
    target_flops: float
    predicted: float  # N the fit predicts at the target
    params: float  # N of the chosen size
    beyond_grid: str  # "" | "below" | "above": the prediction is outside the grid, the nearest end chosen
    beyond_budgets: bool  # the target is outside the crammed budgets: the power law extrapolates

    @property
    def size(self) -> str:
        return size_name(self.arch)

    @property
    def warning(self) -> str | None:
        """One line for export to print when the prediction falls outside the grid; else None."""
        if not self.beyond_grid:
            return None
        end = "smallest" if self.beyond_grid == "below" else "largest"
        return (f"at {_flops(self.target_flops)} the fit predicts N={short_count(self.predicted)}, {self.beyond_grid} "
                f"the grid: sized at its {end} size, {self.size} (N={short_count(self.params)}); "
                f"add {'smaller' if end == 'smallest' else 'larger'} sizes to choose from")

    def to_dict(self) -> dict[str, Any]:
        return {"target_flops": self.target_flops, "predicted_params": self.predicted, "size": self.size,
                "params": self.params, "beyond_grid": self.beyond_grid, "beyond_budgets": self.beyond_budgets}


@dataclass(frozen=True)
class SizeFit:
    """N_opt = coefficient x C^exponent, fitted in ln-ln to the best size of each crammed budget."""

    exponent: float
    coefficient: float
    best: tuple[BudgetBest, ...]  # one per budget, smallest budget first
    grid: tuple[str, ...]  # the crammed sizes, smallest N first
    measure: str = DEFAULT_MEASURE
    exponent_error: float | None = None  # standard error of the exponent (3+ budgets)
    residual_error: float | None = None  # residual standard error in ln N (3+ budgets)
    held_out: tuple[HeldOut, ...] = ()  # each budget predicted from the others' fit (3+ budgets)

    @property
    def held_out_error(self) -> float | None:
        """Root mean square of the held-out errors, in ln N."""
        if not self.held_out:
            return None
        return math.sqrt(sum(h.error ** 2 for h in self.held_out) / len(self.held_out))

    @property
    def budgets(self) -> tuple[float, ...]:
        return tuple(b.budget_flops for b in self.best)

    def predict(self, budget_flops: float) -> float:
        return self.coefficient * budget_flops ** self.exponent

    def choose(self, design: ArchConfig, budget_flops: float,
               sizes: Iterable[str | tuple[int, int]] | None = None) -> SizeChoice:
        """`design` at the size of `sizes` (default: the fit's grid) nearest the prediction in ln N
        (a tie: the smaller); outside the grid that is its nearest end, and `beyond_grid` says so."""
        measure = MEASURES[self.measure]
        family = size_family(design, self.grid if sizes is None else sizes)
        if not family:
            raise SizingError("sizes: no size to choose from; give at least one LAYERSxHIDDEN")
        predicted = self.predict(budget_flops)
        chosen = min(family, key=lambda arch: (abs(math.log(measure(arch) / predicted)), measure(arch)))
        # ln distances, so that a prediction equal to an end (an exponent of 0) is not beyond it by rounding
        lowest, highest = (math.log(predicted / f(measure(arch) for arch in family)) for f in (min, max))
        beyond = "below" if lowest < -1e-9 else "above" if highest > 1e-9 else ""
        outside = not min(self.budgets) <= budget_flops <= max(self.budgets)
        return SizeChoice(chosen, budget_flops, predicted, measure(chosen), beyond, outside)

    def config_for(self, design: ArchConfig, budget_flops: float,
                   sizes: Iterable[str | tuple[int, int]] | None = None) -> ArchConfig:
        """The design at the size `choose` picks (use `choose` to see whether it left the grid)."""
        return self.choose(design, budget_flops, sizes).arch

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers and strings for a run config's YAML `provenance` (and size-fit.json)."""
        return {
            "measure": self.measure, "exponent": self.exponent, "exponent_error": self.exponent_error,
            "coefficient": self.coefficient, "budgets": list(self.budgets),
            "best": [asdict(best) for best in self.best],
            "residual_error_ln": self.residual_error, "held_out_error_ln": self.held_out_error,
            "held_out": [{**asdict(h), "error_ln": h.error} for h in self.held_out],
            "grid": list(self.grid),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SizeFit:
        """The fit of `to_dict` (a size-fit.json, or a provenance's copy of it)."""
        try:
            best = tuple(BudgetBest(**best) for best in data["best"])
            held_out = tuple(HeldOut(h["budget_flops"], h["predicted"], h["measured"]) for h in data["held_out"])
            return cls(float(data["exponent"]), float(data["coefficient"]), best, tuple(data["grid"]), data["measure"],
                       data["exponent_error"], data["residual_error_ln"], held_out)
        except (KeyError, TypeError, ValueError) as error:
            raise SizingError(f"size fit: not one search.sizing wrote ({type(error).__name__}: {error})") from None


def load_size_fit(path: str | Path) -> SizeFit:
    """<out>/size-fit.json of `python -m search.sizing`, e.g. for `search.export --target-budget`."""
    path = Path(path)
    try:
        return SizeFit.from_dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as error:
        raise SizingError(f"{path}: cannot read a size fit ({getattr(error, 'strerror', None) or error}); "
                          f"write one with python -m search.sizing") from None


def fit_size(results: Iterable[Mapping[str, Any]], measure: str = DEFAULT_MEASURE) -> SizeFit:
    """The fit to crams, each a mapping with `budget_flops`, `size` (LAYERSxHIDDEN), `validation_loss`
    and the measure (`non_embedding_params` or `params`); rows without a finite loss (failed crams)
    are left out. Needs two or more budgets."""
    if measure not in MEASURES:
        raise SizingError(f"measure: {measure!r} is not one of {', '.join(MEASURES)}")
    by_budget, grid = _group_by_budget(results, measure)
    if len(by_budget) < 2:
        raise SizingError(f"a fit needs crams at two or more FLOP budgets, got {len(by_budget)}")
    best = tuple(best_size(budget, points) for budget, points in sorted(by_budget.items()))
    log_c = np.log([b.budget_flops for b in best])
    log_n = np.log([b.params for b in best])
    slope, intercept = (float(value) for value in np.polyfit(log_c, log_n, 1))
    residual_error = exponent_error = None
    if len(best) >= 3:
        residuals = log_n - (intercept + slope * log_c)
        residual_error = float(math.sqrt(float(residuals @ residuals) / (len(best) - 2)))
        exponent_error = residual_error / float(math.sqrt(((log_c - log_c.mean()) ** 2).sum()))
    return SizeFit(slope, math.exp(intercept), best, grid, measure, exponent_error, residual_error,
                   held_out_fits(best) if len(best) >= 3 else ())


def _group_by_budget(results: Iterable[Mapping[str, Any]], measure: str
                     ) -> tuple[dict[float, list[tuple[float, float, str]]], tuple[str, ...]]:
    """{budget: [(N, loss, size)] smallest N first} and every size, smallest N first. Two sizes of
    equal N at one budget keep the lower loss (a parabola needs distinct N)."""
    by_budget: dict[float, dict[float, tuple[float, float, str]]] = {}
    sizes: dict[str, float] = {}
    for row in results:
        loss = row.get("validation_loss")
        if loss is None or not math.isfinite(loss):
            continue
        n, size = float(row[measure]), str(row["size"])
        sizes.setdefault(size, n)
        points = by_budget.setdefault(float(row["budget_flops"]), {})
        if n not in points or loss < points[n][1]:
            points[n] = (n, float(loss), size)
    grouped = {budget: sorted(points.values()) for budget, points in by_budget.items()}
    return grouped, tuple(sorted(sizes, key=sizes.__getitem__))


def best_size(budget_flops: float, points: Sequence[tuple[float, float, str]]) -> BudgetBest:
    """The loss-minimising N of one budget from its (N, loss, size) points, smallest N first: the
    vertex of the parabola in ln N through the lowest point and its neighbours, or the lowest point
    itself when it is an end of the grid (then `edge` names the end) or there are fewer than three."""
    lowest = min(range(len(points)), key=lambda i: points[i][1])
    n, _, size = points[lowest]
    edge = "" if len(points) < 2 or 0 < lowest < len(points) - 1 else "smallest" if lowest == 0 else "largest"
    if edge or len(points) < 3:
        return BudgetBest(budget_flops, size, n, "argmin", edge)
    window = points[lowest - 1:lowest + 2]
    x = np.log([point[0] for point in window])
    curvature, slope, _ = np.polyfit(x, [point[1] for point in window], 2)
    if curvature <= 0:  # three equal losses: no vertex
        return BudgetBest(budget_flops, size, n, "argmin")
    vertex = float(np.clip(-slope / (2 * curvature), x[0], x[-1]))  # the lowest middle point keeps it inside
    return BudgetBest(budget_flops, size, math.exp(vertex), "parabola")


def held_out_fits(best: Sequence[BudgetBest]) -> tuple[HeldOut, ...]:
    """Each budget's N_opt predicted by the line fitted to the other budgets (leave one budget out)."""
    held_out = []
    for i, left_out in enumerate(best):
        others = [b for j, b in enumerate(best) if j != i]
        slope, intercept = np.polyfit(np.log([b.budget_flops for b in others]), np.log([b.params for b in others]), 1)
        predicted = math.exp(float(intercept) + float(slope) * math.log(left_out.budget_flops))
        held_out.append(HeldOut(left_out.budget_flops, predicted, left_out.params))
    return tuple(held_out)


# ---- crams ---------------------------------------------------------------------------------------

def train_fingerprint(train: TrainConfig) -> str:
    return hashlib.sha256(json.dumps(train.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def cram_key(arch: ArchConfig, train: TrainConfig, budget: Budget, source: str) -> str:
    """What makes two crams the same: the sized design, the training settings (seed included), the
    data and the amount of FLOPs (`2e12flops` and `2000e9flops` are one budget)."""
    return f"{size_name(arch)}|{budget.amount:.6g}flops|{arch.fingerprint()}|{train_fingerprint(train)}|{source}"


def identify(row: Mapping[str, Any]) -> tuple[str, ...]:
    """What identifies a cram of crams.jsonl (`cram_key`'s parts), its design by today's fingerprint
    of the architecture the row keeps rather than the key's, which a change of `ArchConfig.canonical`
    may respell; its training settings by those the row keeps where it does (rows before kept only
    their fingerprint in the key)."""
    size, budget, _, train, source = row["key"].split("|", 4)
    if "train" in row:
        train = train_fingerprint(TrainConfig.from_dict(row["train"]))
    return size, budget, ArchConfig.from_dict(row["arch"]).fingerprint(), train, source


def sizing_cram(arch: ArchConfig, train: TrainConfig, budget: Budget, source: str) -> Cram:
    """The cram of `arch` under `budget`, with what its row keeps beside the result."""
    row = {"key": cram_key(arch, train, budget, source), "size": size_name(arch), "heads": arch.heads,
           "budget": budget.text, "budget_flops": budget.amount, "seed": train.seed, "params": arch.num_params(),
           "non_embedding_params": non_embedding_params(arch), "flops_per_token": arch.flops_per_token(),
           "arch": arch.to_dict(), "train": train.to_dict()}
    return Cram(row, arch, (arch, budget), size_name(arch), f"{size_name(arch)} @ {budget.text}")


def cram_row(arch: ArchConfig, train: TrainConfig, data: Any, budget: Budget) -> dict:
    """Cram `arch` under `budget` in this process; what its row keeps of the result. A cram that
    diverged or ran out of memory is a row without a loss (`error`: the store's), which the fit
    leaves out."""
    from trainer.cram import cram

    lines = ProgressLines(lambda line: print(f"    {line}", file=sys.stderr, flush=True), every_percent=25)
    result = cram(arch, train, data, budget, on_progress=lambda p: lines.update(p.fraction, f"loss {p.train_loss:.3f}"))
    return {"data_fingerprint": data.fingerprint, "validation_loss": result.validation_loss,
            "nats_below_floor": result.nats_below_floor, "regime": result.regime, "tokens": result.tokens,
            "steps": result.steps, "seconds": result.seconds}


def prepare(family: Sequence[ArchConfig], train: TrainConfig, budgets: Sequence[Budget], args: Any) -> Any:
    """The data every size trains on (one vocabulary and row length): of a streamed corpus, as many
    tokens as the smallest size reads under the largest budget."""
    from trainer.corpus import CorpusSource
    from trainer.data import prepare_data, tokens_to_prepare
    from trainer.device import pick_device

    corpus = CorpusSource.from_args(data_dir=args.data, corpus=args.corpus, gpu=pick_device().type == "cuda")
    fewest_flops = min(arch.flops_per_token(arch.max_seq_len, train.mlm_rate) for arch in family)
    arch = family[0]
    return prepare_data(corpus, vocab_size=arch.vocab_size, seq_len=arch.max_seq_len, cache_dir=args.cache_dir,
                        max_tokens=tokens_to_prepare(corpus, max(budgets, key=lambda b: b.amount), fewest_flops))


# ---- the CLI -------------------------------------------------------------------------------------

def parse_budgets(text: str, flag: str = "--budgets") -> list[Budget]:
    """Comma-separated FLOP budgets, smallest first. Only FLOPs make one budget the same compute for
    every size; seconds, tokens and reference-core seconds are refused."""
    budgets: dict[float, Budget] = {}
    for part in (p for p in text.split(",") if p.strip()):
        try:
            budget = Budget.parse(part)
        except BudgetError as error:
            raise UsageError(f"{flag}: {str(error).removeprefix('budget: ')}") from None
        if budget.kind != "flops":
            raise UsageError(f"{flag}: {part.strip()} is {budget.kind}; the fit is over compute, so every budget "
                             f"is FLOPs, e.g. 2e12flops,6e12flops,2e13flops")
        if budget.amount in budgets:
            raise UsageError(f"{flag}: {part.strip()} is the same budget as {budgets[budget.amount].text}; "
                             f"list each once")
        budgets[budget.amount] = budget
    return sorted(budgets.values(), key=lambda b: b.amount)


def parse_sizes(text: str, design: ArchConfig) -> list[ArchConfig]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    try:
        family = size_family(design, names)
    except ArchError as error:
        raise UsageError(f"--sizes: {error}") from None
    distinct = {size_name(arch) for arch in family}
    if len(distinct) < len(family):
        raise UsageError("--sizes: a size is listed twice; list each once")
    if len(distinct) < 2:
        raise UsageError(f"--sizes: a best size needs two or more sizes to choose between, got {', '.join(distinct) or 'none'}")
    return sorted(family, key=non_embedding_params)


def build_parser() -> CliParser:
    """The command line of `python -m search.sizing` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m search.sizing", description=__doc__)
    parser.add_argument("--config", required=True, help="run config YAML whose design and training settings are "
                        "sized, e.g. trainer/configs/sized-cpu.yaml or an exported study winner")
    parser.add_argument("--budgets", required=True, help="comma-separated FLOP budgets, at least two, "
                        "e.g. 2e12flops,6e12flops,2e13flops")
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                        help=f"comma-separated LAYERSxHIDDEN (default: {','.join(DEFAULT_SIZES)})")
    parser.add_argument("--seed", type=int, help="overrides train.seed")
    parser.add_argument("--target", help="also say which size the fit picks at this FLOP budget, e.g. 1e14flops")
    add_data_arguments(parser, data_help="local data directory (DATA/pretrain/<name>/{train,validation}.parquet)")
    parser.add_argument("--out", help="where crams.jsonl and size-fit.json go (default: sizing-<config name>/)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, one core as a CPU trial)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


def parse_arguments(argv: list[str] | None) -> Any:
    args = build_parser().parse_args(argv)
    quiet_libraries(args.verbose)
    return args


@dataclass(frozen=True)
class Plan:
    run: RunConfig
    train: TrainConfig
    budgets: list[Budget]
    family: list[ArchConfig]
    target: Budget | None
    out: Path
    source: str


def settle(args: Any) -> Plan:
    """Every flag checked before any data is read or any step taken; errors name the flag."""
    run = load_run_config(args.config)
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed: must not be negative, got {args.seed}")
    if args.threads < 1:
        raise UsageError(f"--threads: must be at least 1, got {args.threads}")
    train = run.train if args.seed is None else dataclasses.replace(run.train, seed=args.seed)
    budgets = parse_budgets(args.budgets)
    if len(budgets) < 2:
        raise UsageError(f"--budgets: a fit needs two or more FLOP budgets, got {len(budgets)}; "
                         f"e.g. 2e12flops,6e12flops,2e13flops")
    family = parse_sizes(args.sizes, run.arch)
    target = parse_budgets(args.target, "--target") if args.target is not None else None
    if target is not None and len(target) != 1:
        raise UsageError(f"--target: one FLOP budget, e.g. 1e14flops, got {args.target!r}")
    out = Path(args.out or f"sizing-{run.name}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out: cannot make {out} ({error.strerror})") from None
    source = str(Path(args.data).resolve()) if args.data else f"hub:{args.corpus or 'default'}"
    return Plan(run, train, budgets, family, target[0] if target else None, out, source)


def resized(run, fit: SizeFit, target: Budget, provenance: dict[str, Any] | None = None, name: str | None = None):
    """`run` (a trainer.config.RunConfig) with its design at the size `fit` picks for `target`, and
    that choice; `provenance.sizing` records the target, the choice and the whole fit."""
    from trainer.config import RunConfig

    choice = fit.choose(run.arch, target.amount)
    sizing = {"target_budget": target.text, **choice.to_dict(), "size_fit": fit.to_dict()}
    return (RunConfig(name or f"{run.name}-{target.text}", choice.arch, run.train, {**(provenance or {}), "sizing": sizing}),
            choice)


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        plan = settle(args)
        rows = run_crams(plan, args)
    except CramnasError as error:  # bad flags, config or data: before any training
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        fit = fit_size(rows)
    except SizingError as error:  # every cram of a budget failed
        print(markdown_table(plan, rows, None))
        print(f"error: no fit: {error}", file=sys.stderr)
        return 1
    print(markdown_table(plan, rows, fit))
    record = {"config": plan.run.name, "design": plan.run.arch.describe(), "seed": plan.train.seed, **fit.to_dict(),
              "losses": {f"{row['size']}@{row['budget']}": row["validation_loss"] for row in rows}}
    if plan.target is not None:  # the design resized for the target: a hand design gets what a winner gets
        config, choice = resized(plan.run, fit, plan.target, plan.run.provenance)
        record["target"] = choice.to_dict()
        config.save(plan.out / f"{config.name}.yaml")
        print(f"\nat {plan.target.text}: the fit predicts N={short_count(choice.predicted)}; the grid's nearest size is "
              f"{choice.size} (N={short_count(choice.params)}): {plan.out / f'{config.name}.yaml'}")
        if choice.warning:
            print(f"warning: {choice.warning}")
    (plan.out / FIT_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {plan.out / FIT_FILE}")
    return 0


def run_crams(plan: Plan, args: Any) -> list[dict]:
    """This call's rows, crammed where crams.jsonl does not have them yet; each new one appended."""
    store = CramStore(plan.out / CRAMS_FILE, identify)
    crams = [sizing_cram(arch, plan.train, budget, plan.source) for budget in plan.budgets for arch in plan.family]
    todo = store.pending(crams)
    others = len(set(store.done) - {identify(cram.row) for cram in crams})
    print(f"{plan.run.name} ({plan.run.arch.describe()}): {len(plan.family)} sizes x {len(plan.budgets)} budgets, "
          f"{count(len(todo), 'cram')} to run ({len(crams) - len(todo)} in {store.path}"
          + (f"; {others} of other settings there not used" if others else "") + ")", flush=True)
    if todo:
        import torch

        data = prepare(plan.family, plan.train, plan.budgets, args)
        threads = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            store.run(crams, lambda work: cram_row(work[0], plan.train, data, work[1]))
        finally:
            torch.set_num_threads(threads)  # in-process callers (tests) keep their own
    rows = [store.done[identify(cram.row)] for cram in crams]
    fingerprints = {row["data_fingerprint"] for row in rows if "data_fingerprint" in row}
    if len(fingerprints) > 1:
        print(f"warning: these crams read {len(fingerprints)} different preparations of the data; "
              f"a fresh --out crams them all on one", file=sys.stderr)
    return rows


def markdown_table(plan: Plan, rows: list[dict], fit: SizeFit | None) -> str:
    """Losses by size (rows) and budget (columns), the best of each column in bold, the best size
    per budget, and the fit with its errors."""
    loss = {(row["size"], row["budget_flops"]): row["validation_loss"] for row in rows}
    best = {b.budget_flops: b for b in fit.best} if fit else {}
    lines = [f"\n{plan.run.name} at each size, seed {plan.train.seed}; N = non-embedding parameters",
             "| size | N | " + " | ".join(b.text for b in plan.budgets) + " |",
             "|---|---|" + "---|" * len(plan.budgets)]
    for arch in plan.family:
        cells = []
        for budget in plan.budgets:
            value = loss[(size_name(arch), budget.amount)]
            chosen = budget.amount in best and best[budget.amount].size == size_name(arch)
            cells.append("failed" if value is None else f"**{value:.3f}**" if chosen else f"{value:.3f}")
        lines.append(f"| {size_name(arch)} | {short_count(non_embedding_params(arch))} | " + " | ".join(cells) + " |")
    if fit is None:
        return "\n".join(lines)
    lines.append("| best N | | " + " | ".join(best_cell(best.get(b.amount)) for b in plan.budgets) + " |")
    return "\n".join(lines + [""] + fit_lines(fit))


def best_cell(best: BudgetBest | None) -> str:
    if best is None:
        return "-"
    how = "parabola" if best.method == "parabola" else f"{best.edge} size: a bound" if best.edge else "lowest"
    return f"{short_count(best.params)} ({how})"


def fit_lines(fit: SizeFit) -> list[str]:
    """The fit and its errors in words, errors as factors on N (exp of the ln error)."""
    spread = f" ± {fit.exponent_error:.2f}" if fit.exponent_error is not None else ""
    lines = [f"fit: N_opt = {fit.coefficient:.3g} x C^{fit.exponent:.3f} (exponent{spread}; "
             f"{len(fit.best)} budgets, {len(fit.grid)} sizes)"]
    if fit.residual_error is None:
        lines.append("errors: two budgets fix a line exactly; a third gives the fit an error")
    else:
        lines.append(f"residual error {fit.residual_error:.3f} in ln N (x{math.exp(fit.residual_error):.2f}); "
                     f"each budget held out: {fit.held_out_error:.3f} RMS in ln N (x{math.exp(fit.held_out_error):.2f})")
        lines += [f"  held out {_flops(h.budget_flops)}: predicted {short_count(h.predicted)}, "
                  f"measured {short_count(h.measured)} ({h.error:+.3f})" for h in fit.held_out]
    lines += [f"note: at {_flops(b.budget_flops)} the best is the {b.edge} size crammed there, {b.size}: the optimum "
              f"may lie beyond it" for b in fit.best if b.edge]
    if all(b.edge for b in fit.best):
        lines.append("warning: every budget's best size is an end of the grid, so the fit measures the grid, not the "
                     "optimum; add sizes beyond that end (--sizes)")
    return lines


def _flops(value: float) -> str:
    """2e+12 -> 2e12flops, as a budget is written."""
    return f"{value:.3g}".replace("e+", "e") + "flops"


def short_count(number: float) -> str:
    """10.5k, 1.47M: a parameter count in a table."""
    for scale, unit in ((1e6, "M"), (1e3, "k")):
        if number >= scale:
            return f"{number / scale:.3g}{unit}"
    return f"{number:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
