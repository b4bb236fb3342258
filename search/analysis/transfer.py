"""The transfer's reading of its crams (`python -m search.transfer`, issue 26 §4): each
configuration's cells, one per multiple of the 1x budget; the tables of means, rank correlations
against the largest multiple and paired differences; the ladder replayed over the crams with the
ladder's own promotion (`search.analysis.ladder.promote`); the size families a size fit is made of.

A configuration is `search.transfer.Configuration`: its name, kind ("candidate", "other size",
"hand design" or "resized"), architecture and the name its crams are kept under at each multiple.
The size fit itself (`search.sizing`, a command) is the command's: here a fit is only read."""

from __future__ import annotations

import json
import math
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from search.analysis import ladder
from search.analysis.stats import Difference, correlation, interval
from search.analysis.stats import paired as paired_difference
from search.base.objectives import OBJECTIVES
from search.base.states import COMPLETE
from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.regimes import regime

if TYPE_CHECKING:  # only for the annotations
    from search.analysis.crams import Crams
    from search.transfer import Configuration

SIZED = "@sized"  # a hand design resized for each multiple is named <name>@sized
BELOW = "†"  # the mean is below the two-neighbour count model
SIZE_FIELDS = ("layers", "hidden", "heads")  # what search.sizing.size_family changes; the rest is the design


# ---- the cells -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One configuration at one multiple: its loss per seed and the references it is read against."""

    by_seed: dict[int, float]
    corruption_floor: float
    context_reference: float
    size: str
    epochs: float | None = None  # passes over the training data, the mean over the seeds (a regime fact)

    @property
    def mean(self) -> float:
        return statistics.mean(self.by_seed.values())

    @property
    def below_count_model(self) -> bool:
        return self.mean < self.context_reference

    def text(self, show_size: bool = False) -> str:
        ci = interval(self.by_seed.values())
        where = regime(ci.mean, self.corruption_floor, self.context_reference)
        return (f"{ci.text(show_n=True)} {where}"
                + (f" [{self.size}]" if show_size else "") + (f" {BELOW}" if self.below_count_model else ""))


def cells(crams: Crams, configs: list[Configuration], seeds_at: dict[float, int]) -> dict[str, dict[float, Cell]]:
    """Every configuration's cells from the crams there are; a multiple with none has no cell."""
    table = {}
    for config in configs:
        table[config.name] = {}
        for m in seeds_at:
            keys = {s: crams.key(config.crammed_as[m], m, s) for s in range(config.seed_count(seeds_at, m))}
            rows = {s: crams.done[key] for s, key in keys.items() if key in crams.done}
            if rows:
                any_row = next(iter(rows.values()))
                epochs = [row["epochs"] for row in rows.values() if row.get("epochs") is not None]
                table[config.name][m] = Cell({s: row["validation_loss"] for s, row in rows.items()},
                                             any_row["corruption_floor"], any_row["context_reference"],
                                             config.size(m),
                                             statistics.mean(epochs) if epochs else None)
    return table


def best(table: dict[str, dict[float, Cell]], names, m: float) -> str | None:
    """The configuration of `names` with the lowest mean at multiple `m`."""
    measured = [name for name in names if m in table[name]]
    return min(measured, key=lambda name: table[name][m].mean) if measured else None


def replayed_ladder(table: dict[str, dict[float, Cell]], candidates: list[str], rungs, eta: int,
                    budget: Budget) -> str | None:
    """The pick of `search.confirm --ladder` over these crams: `search.analysis.ladder`'s own
    promotion (every candidate at the first rung, the best 1/eta by mean up each rung) and pick (the
    best at the highest rung with a measured candidate), each cell's seeds as the rung's outcomes.
    The ladder would cram exactly these (the same models, seeds and budgets; a cram here repeats to
    the last digit), so replaying it costs nothing; a rung not crammed yet ends the replay."""
    objective = OBJECTIVES["mlm"]  # the crams' validation loss
    # `rank`: the position in `candidates`, which decides between equal means as the study's rank does
    climbing = [ladder.Candidate(rank, None, None, None, {}, {}, None, None) for rank in range(len(candidates))]
    climbed = []
    for index, m in enumerate(rungs):
        cells_at = [table[candidates[c.rank]].get(m) for c in climbing]
        standings = [ladder.Standing(c, [ladder.SeedOutcome(c, seed, "", COMPLETE, loss) for seed, loss in cell.by_seed.items()]
                                     if cell else []) for c, cell in zip(climbing, cells_at)]
        climbed.append(ladder.Rung(index, ladder.multiple_of(budget, m), standings,
                                   ladder.promote(standings, objective, eta)))
        climbing = climbed[-1].promoted
        if not climbing:  # no candidate crammed at this rung yet
            break
    chosen = ladder.pick(climbed, objective)
    return None if chosen is None else candidates[chosen[1].candidate.rank]


# ---- the size families ---------------------------------------------------------------------------

def design_of(arch: dict) -> str:
    """An architecture's every field but its size, as a key."""
    return json.dumps({k: v for k, v in arch.items() if k not in SIZE_FIELDS}, sort_keys=True)


def size_families(configs: list[Configuration], multiples) -> dict[str, list[Configuration]]:
    """Fixed configurations that are one design at three or more sizes (e.g. a winner and
    `size_family` copies of it given with `--configs`), by the first one's name."""
    groups: dict[str, list[Configuration]] = {}
    for config in configs:
        if config.kind != "resized":
            groups.setdefault(design_of(config.archs[multiples[0]]), []).append(config)
    families = {}
    for members in groups.values():
        sizes = {(c.archs[multiples[0]]["layers"], c.archs[multiples[0]]["hidden"]) for c in members}
        if len(sizes) >= 3:
            families[members[0].name] = members
    return families


def write_size_fits(out: Path, fits: dict, multiples) -> list[str]:
    """Each family's fit (`size_fits`) as `<out>/size-fit-<name>.json`, in search.sizing's format (for
    `search.export --target-budget B --size-fit FILE` and `search.transfer --size-fit`); notes."""
    notes = []
    for name, (family, fit, _) in fits.items():
        if fit is not None:
            path = out / f"size-fit-{name}.json"
            design = ArchConfig.from_dict(family[0].archs[multiples[0]]).describe()
            path.write_text(json.dumps({"config": name, "design": design, **fit.to_dict()}, indent=2) + "\n")
            notes.append(f"{name}'s size fit: {path}")
    return notes


def resized_otherwise(configs: list[Configuration], fits: dict, budget: Budget, multiples) -> list[str]:
    """Where a fit this call writes would size a resized hand design otherwise than the `--size-fit`
    its crams were sized by: a later call given the new file and this --out would be refused (the
    same key, another architecture), so the notes say so and what to do."""
    hands = {c.name: c for c in configs if c.kind == "hand design"}
    notes = []
    resized = [c for c in configs if c.kind == "resized"]
    for name, (_, fit, _) in fits.items():
        if fit is None:
            continue
        for c in resized:
            base, moved = hands[c.name.removesuffix(SIZED)], []
            for m in multiples:
                had, now = c.size(m), fit.choose(base.arch(m), budget.amount * m).size
                if now != had:
                    moved.append(f"{m:g}x {now}, not {had}")
            if moved:
                notes.append(f"{name}'s size fit written here would size {base.name} otherwise than --size-fit did "
                             f"({'; '.join(moved)}): keep --size-fit for these crams, or pass the new file with "
                             "another --out")
    return notes


# ---- the tables ----------------------------------------------------------------------------------

def configuration_table(configs: list[Configuration], table: dict[str, dict[float, Cell]], multiples) -> list[str]:
    """Mean ± 95% interval, regime and the count-model mark per configuration and multiple, the
    best at the largest multiple first."""
    top = multiples[-1]
    order = sorted(configs, key=lambda c: [table[c.name][m].mean if m in table[c.name] else math.inf
                                           for m in reversed(multiples)])
    lines = ["| configuration | kind | architecture | " + " | ".join(f"{m:g}x" for m in multiples)
             + f" | first below the count model | epochs at {top:g}x |", "|---|---|---|" + "---|" * (len(multiples) + 2)]
    for config in order:
        row = table[config.name]
        resized = config.kind == "resized"  # its size moves with the multiple: the one at the largest shown
        design = ArchConfig.from_dict(config.archs[top if resized else multiples[0]]).describe()
        below = next((f"{m:g}x" for m in multiples if m in row and row[m].below_count_model), "none")
        epochs = row[top].epochs if top in row else None
        lines.append(f"| {config.name} | {config.kind} | {design}{' (resized)' if resized else ''} | "
                     + " | ".join(row[m].text(show_size=resized) if m in row else "-" for m in multiples)
                     + f" | {below} | {'-' if epochs is None else f'{epochs:.1f}'} |")
    return lines + ["", f"{BELOW}: the mean is below the two-neighbour count model; [LxH]: the size crammed at "
                    f"that multiple (a resized design's architecture is its {top:g}x one); epochs: passes over the "
                    f"training data (a small model repeats it more often at the same budget). Sorted by the mean at {top:g}x.",
                    ""]


def correlation_table(table: dict[str, dict[float, Cell]], names: list[str], multiples,
                      resamples: int = 5000) -> list[str]:
    """Spearman and Kendall between each multiple's means and the largest's, over the `names` that
    have both, with bootstrap 95% intervals (configurations resampled)."""
    top = multiples[-1]
    lines = ["| rung | against | n | Spearman (95% CI) | Kendall (95% CI) |", "|---|---|---|---|---|"]
    for m in multiples[:-1]:
        both = [name for name in names if m in table[name] and top in table[name]]
        x, y = [table[n][m].mean for n in both], [table[n][top].mean for n in both]
        if len(both) < 3:
            cells_ = ["too few to rank"] * 2
        else:
            with warnings.catch_warnings():  # a resample of one configuration repeated ranks nothing: scipy drops it
                warnings.simplefilter("ignore")
                found = [correlation(x, y, kind, resamples) for kind in ("spearman", "kendall")]
            cells_ = [f"{p:.2f} " + (f"({lo:.2f} to {hi:.2f})" if math.isfinite(lo) else "(no interval: too few)")
                      for p, lo, hi in found]
        lines.append(f"| {m:g}x | {top:g}x | {len(both)} | {cells_[0]} | {cells_[1]} |")
    return lines + [""]


def paired(table: dict[str, dict[float, Cell]], a: str, b: str, multiples) -> str:
    """b - a at the largest multiple, seed by seed, its 95% interval and whether that is outside
    noise. With one common seed there, the noise is the seed spread of the same difference at the
    largest multiple below with two or more (a single difference's 95% prediction interval): the
    largest multiple defaults to one seed because it costs as much as all the others together."""
    from scipy import stats

    losses = lambda name, m: table[name][m].by_seed if m in table[name] else {}
    at = lambda m: paired_difference(losses(b, m), losses(a, m))
    top = multiples[-1]
    difference = at(top)
    if not difference.n:
        return "no common seed measured"
    if difference.has_interval:
        return f"{difference.text()} (paired by seed, n={difference.n})"
    lower = next((m for m in reversed(multiples[:-1]) if at(m).n >= 2), None)
    if lower is None:
        return difference.text()
    seed = min(losses(a, top).keys() & losses(b, top).keys())
    spread = [losses(b, lower)[s] - losses(a, lower)[s] for s in sorted(losses(a, lower).keys() & losses(b, lower).keys())]
    half = float(stats.t.ppf(0.975, len(spread) - 1) * statistics.stdev(spread) * math.sqrt(1 + 1 / len(spread)))
    return (f"{Difference(1, difference.mean, half).text()} "
            f"(seed {seed}; noise: the seed spread of this difference at {lower:g}x, n={len(spread)})")


def best_lines(table: dict[str, dict[float, Cell]], names: list[str], multiples, resized: list[str] = ()) -> list[str]:
    """Which fixed configuration is best at 1x and at the largest multiple, whether they are the
    same, and where the 1x best ranks at the largest; and a resized hand design that is better
    there still (it has no 1x of its own size, so it is not ranked, but it is what the best is up against)."""
    low, top = multiples[0], multiples[-1]
    first, last = best(table, names, low), best(table, names, top)
    if first is None or last is None:
        return [f"best at {low:g}x or {top:g}x: not measured yet", ""]
    line = (f"best at {low:g}x: {first} ({table[first][low].mean:.3f}); best at {top:g}x: {last} "
            f"({table[last][top].mean:.3f}): ")
    if first == last:
        line += "the same configuration"
    else:
        ranked = sorted((n for n in names if top in table[n]), key=lambda n: table[n][top].mean)
        rank = f"{ranked.index(first) + 1} of {len(ranked)}" if first in ranked else "not measured"
        line += f"not the same; {first} is {rank} at {top:g}x, behind {last} by {paired(table, last, first, multiples)}"
    lines = [line]
    better = best(table, resized, top)
    if better is not None and table[better][top].mean < table[last][top].mean:
        lines.append(f"a resized hand design is lower at {top:g}x: {better} ({table[better][top].mean:.3f}); "
                     f"{last} - {better} {paired(table, better, last, multiples)}")
    return lines + [""]


def ladder_pick_lines(table: dict[str, dict[float, Cell]], pick: str, candidates: list[str], hands: list[str],
                      resized: list[str], multiples, what: str = "the ladder's pick") -> list[str]:
    """The ladder's pick at the largest multiple against the 1x winner and the best hand design, as
    designed and, where there are resized ones, resized: which hand design is best is read at the
    largest multiple itself, the hand designs' most favourable reading."""
    top = multiples[-1]
    if top not in table[pick]:
        return [f"{pick} ({what}) has no {top:g}x cram yet", ""]
    lines = [f"{pick} ({what}) at {top:g}x: {table[pick][top].text()}"]
    others = [(f"the {multiples[0]:g}x winner", best(table, candidates, multiples[0])),
              (f"the best hand design at {top:g}x", best(table, hands, top))]
    if resized:
        others.append((f"the best resized hand design at {top:g}x", best(table, resized, top)))
    for label, other in others:
        if other is None:
            lines.append(f"- against {label}: not measured")
        elif other == pick:
            lines.append(f"- against {label}: it is {label}")
        elif top not in table[other]:
            lines.append(f"- against {label}, {other}: no {top:g}x cram")
        else:
            lines.append(f"- against {label}, {other} ({table[other][top].mean:.3f} at {top:g}x): pick - {other} "
                         f"{paired(table, other, pick, multiples)}")
    return lines + [""]


def fitted_pick(fits: dict, pick: str, budget: Budget, multiples) -> str | None:
    """The configuration of the pick's design at the size its family's fit chooses for the largest
    multiple's budget (what `search.export --target-budget` writes of the pick), where one is given."""
    for family, fit, _ in fits.values():
        members = {config.name: config for config in family}
        if pick in members and fit is not None:
            choice = fit.choose(members[pick].arch(multiples[0]), budget.amount * multiples[-1])
            return next((c.name for c in family if c.size(multiples[0]) == choice.size), None)
    return None
