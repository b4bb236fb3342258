"""The controller benchmark that judges what `search.run` runs: every controller, with and without
early stopping, against a multi-fidelity surrogate of the real studies' crams (issue 38, item 3).

`benchmarks/controller_efficiency.py` judges controllers on final losses alone, every trial run to
its end. A study of `search.run --early-stop` is another study: ASHA stops trials on their train
loss at a rung (reports 2, 4 and 8 of 15), the controller learns from what was stopped as
`search.study.stopped` shows it, and the compute is what the trials spent. This benchmark runs that.

    python benchmarks/multi_fidelity.py --controllers gp --early-stop off on --seeds 30 --trials 200 \\
        --out studies.jsonl                                      # appends each study; a rerun skips them
    python benchmarks/multi_fidelity.py --controllers gp --screen --seeds 30 --trials 200 --out studies.jsonl
                                                                 # screened studies, search.run's default
    python benchmarks/multi_fidelity.py --report studies.jsonl   # the tables, from the stored studies alone
    python benchmarks/multi_fidelity.py --report benchmarks/crams/multi_fidelity.jsonl.gz   # RESULTS' tables

The world (benchmarks/curve_world.py): every trial's curve and final loss predicted by a surrogate
fitted to the real studies' crams, with the seed-to-seed noise measured per regime. The study is
search.run's loop through the package: `open_study` with the profile's hand designs and the
covering design (search.run's default first draw), `ask`, a repeat told the recorded value for
free, every other trial's reports fed in order to one `SuccessiveHalving` (the profile's grace
and reduction, `max_progress_reports + 0.5`) shared by the study, a stopped trial told PRUNED with
its curve up to the stopping report (searcher.on_trial_complete) and counted m/16 of a trial
(`asha.replay`'s convention: the last of 15 reports comes before the budget's end), a complete
one told its noisy final and whole curve, counted 1. Every ask is one of the `--trials` (repeats
and stopped trials count, as search.run counts them). Trials run one after another here;
search.run runs two at a time on the CPU profile, so its ASHA sees rungs in a slightly different
order.

`--screen` runs search.run's screened study instead (the CPU profile's default from 20 trials,
search/study/screen.py): every trial told a whole cram at a quarter of the budget, predicted by a
surrogate of the real screens (benchmarks/screen_world.py), nothing stopped; the report promotes
the best quarter of each prefix to the whole budget, then the best eighth (the profile's
`--promote`), as search.run would have at that many trials, counts both stages' compute, and
reads the same controller's unscreened study of the same seed at the trials that spent as much.

Read at 32, 64 and `--trials` trials as prefixes of one study (controllers do not know the budget):
regret of the winner (the complete trial with the best observed final; its noise-free final minus
the optimum of the final-loss surrogate over the table and random members), compute spent in
trial-equivalents, how often the winner is a warm start, trials until a noise-free final below
sized-cpu's measured mean, and the regret with early stopping when it has spent what the same
controller and seed spent without it at 32 and 64 trials.

Each finished study is one JSON line of `--out`, appended in one write, so two processes (say gp
in one, the other controllers in another) may share the file; a rerun skips the studies stored for
the same world (the crams read, the profile, `--members`). A study in which the package raised is
kept as a `crash` line (controller, seed, trial, error), left out of the tables with a note, and
run again by a rerun: search.run would have died there too.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import surrogate as surrogates  # benchmarks/surrogate.py: run as a script, this file's folder is on sys.path
from curve_world import ASHA, BASELINE, CRAMS, World, build, inputs, schedule, warm_starts, world_id
from screen_world import FACTOR, PROMOTE, ScreenWorld, build_screen, screen_files, screen_world_id
from threadpoolctl import threadpool_limits

from search.base.states import COMPLETE, PRUNED, REPEAT
from search.study.asha import SuccessiveHalving
from search.study.controllers import CONTROLLERS, ask, open_study, tell
from search.study.screen import promoted_count
from space import SearchSpace

READS = (32, 64)  # and --trials



def run_study(world: World, space: SearchSpace, controller: str, early_stop: bool, seed: int, trials: int) -> dict:
    """One search.run study of `trials` trials; what each trial did, in order (a JSON line of kind
    `study`), or, where the package raised (as search.run would have died), a line of kind `crash`
    with the trial and the error."""
    study = open_study(f"{controller}-{'asha' if early_stop else 'full'}-{seed}", None, controller, "mlm", space,
                       seed=seed, warm_starts=warm_starts(), cover=True, trials=trials, early_stop=early_stop)
    from search.study.driver import early_stop_for_session  # here: it loads mlflow

    reports, _ = schedule()
    session, _ = early_stop_for_session(ASHA if early_stop else None, trials)  # off in a session too short for it
    rule = SuccessiveHalving(ASHA["grace_reports"], ASHA["reduction_factor"], reports + 0.5) if session else None
    record: dict[str, list] = {key: [] for key in ("state", "true", "observed", "stopped_at", "compute", "warm_start")}
    start = time.perf_counter()
    try:
        play_trials(study, space, world, rule, seed, trials, record)
    except Exception as error:  # any error of the package's ends the study, as it would end search.run's
        return {"kind": "crash", "controller": controller, "early_stop": early_stop, "seed": seed, "trials": trials,
                "at_trial": len(record["state"]), "error": " ".join(f"{type(error).__name__}: {error}".split())}
    return {"kind": "study", "controller": controller, "early_stop": early_stop, "seed": seed, "trials": trials,
            "seconds": round(time.perf_counter() - start, 1), **record}


def play_trials(study, space: SearchSpace, world: World, rule: SuccessiveHalving | None, seed: int, trials: int,
                record: dict[str, list]) -> None:
    """search.run's loop over `trials` trials, one after another; each trial's outcome appended to `record`."""
    reports, _ = schedule()
    for _ in range(trials):
        proposal = ask(study, space)
        true_final = float(world.truth(proposal.config)[reports])
        if proposal.repeat_of is not None:  # search.run tells the recorded values and trains nothing
            recorded = study.get_trials(deepcopy=False)[proposal.repeat_of].values
            tell(study, proposal.number, recorded, state=REPEAT)
            row = (REPEAT, true_final, recorded[0], None, 0.0)
        else:
            seen = world.observe(proposal.config, seed)
            curve = [(report, float(seen[report - 1])) for report in range(1, reports + 1)]
            stopped_at = next((report for report, loss in curve if rule.should_stop(str(proposal.number), report, loss)),
                              None) if rule else None
            if stopped_at:
                tell(study, proposal.number, state=PRUNED, intermediate=curve[:stopped_at],
                     reason=f"stopped early by ASHA after {stopped_at} of its reports")
                row = (PRUNED, true_final, None, stopped_at, stopped_at / (reports + 1))
            else:
                tell(study, proposal.number, [float(seen[reports])], intermediate=curve)
                row = (COMPLETE, true_final, float(seen[reports]), None, 1.0)
        for key, value in zip(("state", "true", "observed", "stopped_at", "compute"), row, strict=True):
            record[key].append(round(value, 6) if isinstance(value, float) else value)
        record["warm_start"].append(proposal.warm_start)


def run_screened(world: World, screen: ScreenWorld, space: SearchSpace, controller: str, seed: int,
                 trials: int) -> dict:
    """One screened study's screen (search.run's default from 20 trials on the CPU profile): every
    trial told its whole cram at 1/FACTOR of the budget (`observed`), nothing stopped; each trial's
    final at the whole budget (`final`, the curve world's, as the promotion would cram it) kept
    beside it, so the report promotes the best 1/FACTOR of any prefix as search.run would."""
    study = open_study(f"{controller}-screen-{seed}", None, controller, "mlm", space, seed=seed,
                       warm_starts=warm_starts(), cover=True, trials=trials)
    reports, _ = schedule()
    record: dict[str, list] = {key: [] for key in ("state", "true", "observed", "final", "compute", "warm_start")}
    start = time.perf_counter()
    try:
        for _ in range(trials):
            proposal = ask(study, space)
            true_final = float(world.truth(proposal.config)[reports])
            if proposal.repeat_of is not None:
                recorded = study.get_trials(deepcopy=False)[proposal.repeat_of].values
                tell(study, proposal.number, recorded, state=REPEAT)
                row = (REPEAT, true_final, recorded[0], None, 0.0)
            else:
                seen = screen.observe(proposal.config, seed)
                tell(study, proposal.number, [seen])
                row = (COMPLETE, true_final, seen, float(world.observe(proposal.config, seed)[reports]), 1 / FACTOR)
            for key, value in zip(("state", "true", "observed", "final", "compute"), row, strict=True):
                record[key].append(round(value, 6) if isinstance(value, float) else value)
            record["warm_start"].append(proposal.warm_start)
    except Exception as error:  # as run_study: search.run would have died here
        return {"kind": "crash", "controller": controller, "early_stop": "screen", "seed": seed, "trials": trials,
                "at_trial": len(record["state"]), "error": " ".join(f"{type(error).__name__}: {error}".split())}
    return {"kind": "screened", "controller": controller, "factor": FACTOR, "seed": seed, "trials": trials,
            "seconds": round(time.perf_counter() - start, 1), **record}


# ---- the store: one JSON line per study ------------------------------------------------------------

def read_store(paths: Iterable[Path]) -> list[dict]:
    """Every whole line of the files (`.gz` ones too: the store kept in benchmarks/crams/); a line cut
    short (a killed process) is skipped with a note."""
    lines = []
    for path in paths:
        if not path.is_file():
            continue
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                if line.strip():
                    print(f"note: {path}:{number} is not a whole line (cut short?); skipped", file=sys.stderr)
    return lines


def append(path: Path, line: dict) -> None:
    """One os.write of one whole line with O_APPEND: on a local file system two processes appending
    to one file never interleave their lines. A file cut short gets its own newline first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
    finally:
        os.close(fd)


# ---- report: from the stored studies alone ----------------------------------------------------------

def winner(study: dict, trials: int) -> int | None:
    """The complete (non-repeat) trial with the best observed final among the first `trials`."""
    complete = [i for i in range(min(trials, len(study["state"]))) if study["state"][i] == COMPLETE]
    return min(complete, key=lambda i: study["observed"][i]) if complete else None


def regret(study: dict, trials: int, optimum: float) -> float:
    index = winner(study, trials)
    return math.nan if index is None else study["true"][index] - optimum


def spent(study: dict, trials: int) -> float:
    return float(sum(study["compute"][:trials]))


def trials_within(study: dict, compute: float) -> int:
    """The most trials of `study` whose compute is at most `compute`."""
    total, trials = 0.0, 0
    for cost in study["compute"]:
        if total + cost > compute + 1e-9:
            break
        total, trials = total + cost, trials + 1
    return trials


def trials_to_beat(study: dict, bar: float) -> int | None:
    """Trials until one that is not a warm start runs to its end with a noise-free final below `bar`."""
    return next((i + 1 for i, (state, true, warm) in enumerate(zip(study["state"], study["true"], study["warm_start"],
                                                                    strict=True))
                 if state == COMPLETE and warm is None and true < bar), None)


def median_p90(values: Sequence[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{np.median(values):.4f} / {np.percentile(values, 90):.4f}" if values else "-"


def label(early_stop: bool | str) -> str:
    """A study's early stopping as the tables name it (a screened study's crash says "screen")."""
    return early_stop if isinstance(early_stop, str) else "on" if early_stop else "off"


# The shares the report promotes: the screen's own (the CPU profile's until 2026-12-08) and the profile's.
PROMOTE_SHARES = sorted({FACTOR, PROMOTE})


def promoted(study: dict, trials: int, promote: int) -> list[int]:
    """The trials a screened study of its first `trials` trials promotes: the best 1/`promote` of its
    complete screen trials by their observed screen loss (search.study.screen: repeats are not promoted)."""
    complete = sorted((i for i in range(min(trials, len(study["state"]))) if study["state"][i] == COMPLETE),
                      key=lambda i: (study["observed"][i], i))
    return complete[:promoted_count(trials, promote)]


def screened_winner(study: dict, trials: int, promote: int) -> int:
    """The promoted trial with the best observed final: what confirm and export read."""
    return min(promoted(study, trials, promote), key=lambda i: study["final"][i])


def screened_spent(study: dict, trials: int, promote: int) -> float:
    """The screen's crams so far and the promotion's, in trials run to their end."""
    return float(sum(study["compute"][:trials])) + len(promoted(study, trials, promote))


def screened_tables(screened: dict[str, dict[int, dict]], combos: dict[tuple[str, bool], dict[int, dict]],
                    optimum: float, promote: int) -> str:
    """Screened studies promoting the best 1/`promote` (the share is the report's: a screen does not
    depend on it) beside the same controller's unscreened ones of the same seeds: regret, compute,
    regret of the unscreened study at the same compute, and warm-start winners."""
    longest = max(len(s["state"]) for studies in screened.values() for s in studies.values())
    reads = sorted({r for r in READS if r < longest} | {longest})
    factor = next(iter(next(iter(screened.values())).values()))["factor"]
    head = " | ".join(f"{r} trials" for r in reads)
    out = [f"Screened studies (`--screen {factor} --promote {promote}`: every trial crammed whole at 1/{factor} of the "
           f"budget, the best 1/{promote} of any prefix promoted to the whole budget, the winner the promoted trial with "
           "the best observed final), read after " + " / ".join(map(str, reads)) + " trials, each the prefix of its seed's "
           "screen.", "", "Regret of the winner: median / 90th percentile over seeds; beside it the same controller "
           "unscreened (early stopping off, same seeds) read at the trials that spent as much compute (median trials)",
           "", "| controller | " + " | ".join(f"screened, {r} trials | unscreened, same compute" for r in reads) + " |",
           "|---|" + "---|" * (2 * len(reads))]
    for controller, studies in screened.items():
        full = combos.get((controller, False), {})
        cells = []
        for r in reads:
            group = reaching(studies, r)
            regrets = [s["true"][screened_winner(s, r, promote)] - optimum for s in group]
            matched = [(s, full[s["seed"]]) for s in group if s["seed"] in full]
            counts = [trials_within(base, screened_spent(s, r, promote)) for s, base in matched]
            cells += [median_p90(regrets) + ("" if len(group) == len(studies) else f" ({len(group)} seeds)"),
                      f"{median_p90([regret(base, n, optimum) for n, (_, base) in zip(counts, matched, strict=True)])}"
                      f" ({np.median(counts):g})" if counts else "-"]
        out.append(f"| {controller} | " + " | ".join(cells) + " |")
    out += ["", "Compute in trials run to their end, screen and promotion: mean over seeds (share of the same "
            "controller's unscreened study at the same trials, same seeds); winner a warm start: fraction of seeds", "",
            f"| controller | {head} | " + " | ".join(f"warm-start winner, {r}" for r in reads) + " |",
            "|---|" + "---|" * (2 * len(reads))]
    for controller, studies in screened.items():
        full = combos.get((controller, False), {})
        cells, warm = [], []
        for r in reads:
            group = reaching(studies, r)
            paired = [(s, full[s["seed"]]) for s in group if len(full.get(s["seed"], {}).get("state", [])) >= r]
            share = (f" ({sum(screened_spent(s, r, promote) for s, _ in paired) / sum(spent(b, r) for _, b in paired):.0%})"
                     if paired else "")
            cells.append(f"{statistics.fmean(screened_spent(s, r, promote) for s in group):.1f}{share}" if group else "-")
            warm.append(f"{np.mean([s['warm_start'][screened_winner(s, r, promote)] is not None for s in group]):.2f}"
                        if group else "-")
        out.append(f"| {controller} | " + " | ".join(cells + warm) + " |")
    return "\n".join(out) + "\n"


def report(lines: list[dict]) -> str:
    setups = {line["world"]: line for line in lines if line.get("kind") == "setup"}
    screen_setups = {line["screen_world"]: line for line in lines if line.get("kind") == "screen_setup"}
    screened: dict[str, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))  # world -> controller -> seed
    for line in lines:
        if line.get("kind") == "screened":
            kept = screened[line["world"]][line["controller"]].get(line["seed"])
            if kept is None or len(line["state"]) > len(kept["state"]):
                screened[line["world"]][line["controller"]][line["seed"]] = line
    studies: dict[str, dict[tuple, dict]] = defaultdict(dict)  # world -> (controller, early_stop, trials, seed) -> study
    for line in lines:
        if line.get("kind") == "study":
            studies[line["world"]].setdefault((line["controller"], line["early_stop"], line["trials"], line["seed"]), line)
    crashes: dict[str, dict[tuple, dict]] = defaultdict(dict)  # the last crash of each study that has no whole line
    for line in lines:
        if line.get("kind") == "crash":
            crashes[line["world"]][line["controller"], line["early_stop"], line["trials"], line["seed"]] = line
    sections = []
    for world in crashes:
        studies.setdefault(world, {})
    for world, stored in studies.items():
        setup = setups.get(world)
        if setup is None:
            sections.append(f"(studies of world {world}: no setup line stored, skipped)")
            continue
        crashed = [line for key, line in crashes[world].items() if key not in stored]
        text = setup["text"] + "\n\n" + tables(stored, setup) + crash_note(crashed)
        if screened.get(world):
            worlds = {s["screen_world"] for studies in screened[world].values() for s in studies.values()}
            text += "\n\n" + "\n\n".join(screen_setups[w]["text"] for w in sorted(worlds) if w in screen_setups)
            text += "".join("\n\n" + screened_tables(screened[world], by_combination(stored), reference(stored, setup), share)
                            for share in PROMOTE_SHARES)
        sections.append(text)
    return "\n\n".join(sections) if sections else "no stored studies"


def crash_note(crashed: list[dict]) -> str:
    """The studies the package crashed (search.run would have died there), left out of the tables."""
    if not crashed:
        return ""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for line in crashed:
        groups[line["controller"], line["early_stop"], line["trials"]].append(line)
    lines = ["", "Studies that crashed, left out of the tables above (the package raised, as search.run's driver would "
             "have; a rerun of the same command runs them again):", "",
             "| controller | early stopping | trials | seeds crashed | at trial (median, range) | error |",
             "|---|---|---|---|---|---|"]
    for (controller, early_stop, trials), group in groups.items():
        at = [line["at_trial"] for line in group]
        errors = sorted({line["error"] for line in group})
        lines.append(f"| {controller} | {label(early_stop)} | {trials} | {len(group)} | {np.median(at):g} "
                     f"({min(at)}-{max(at)}) | {'; '.join(errors)[:300]} |")
    return "\n".join(lines)


def by_combination(stored: dict[tuple, dict]) -> dict[tuple[str, bool], dict[int, dict]]:
    """(controller, early stopping) -> {seed: its longest stored study}, in CONTROLLERS' order. A
    shorter study of the same seed is a prefix of it (the controller does not know the count, the
    noise is the seed's), so a 200-trial study is read at 32 and 64 too."""
    order = {name: i for i, name in enumerate(CONTROLLERS)}
    combos: dict[tuple[str, bool], dict[int, dict]] = defaultdict(dict)
    for (controller, early_stop, _, seed), study in sorted(stored.items(), key=lambda item: (
            order.get(item[0][0], len(order)), item[0][0], item[0][1], item[0][3])):
        kept = combos[controller, early_stop].get(seed)
        if kept is None or len(study["state"]) > len(kept["state"]):
            combos[controller, early_stop][seed] = study
    return combos


def reaching(studies: dict[int, dict], trials: int) -> list[dict]:
    """The studies that ran at least `trials` trials."""
    return [study for study in studies.values() if len(study["state"]) >= trials]


def lowest_true(stored: dict[tuple, dict]) -> float:
    return min(true for studies in by_combination(stored).values() for s in studies.values()
               for state, true in zip(s["state"], s["true"], strict=True) if state == COMPLETE)


def reference(stored: dict[tuple, dict], setup: dict) -> float:
    """What regret is read against: the lowest noise-free final known, the setup's (the table's
    architectures and random members) or, where a study ran to its end a better one that those
    random members missed, that trial's."""
    return min(setup["optimum"], lowest_true(stored))


def tables(stored: dict[tuple, dict], setup: dict) -> str:
    rungs = setup["rungs"]
    combos = by_combination(stored)
    lowest = lowest_true(stored)
    optimum = reference(stored, setup)
    longest = max(len(study["state"]) for studies in combos.values() for study in studies.values())
    reads = sorted({r for r in READS if r < longest} | {longest})
    head = " | ".join(f"{r} trials" for r in reads)
    seeds = sorted({len(reaching(studies, r)) for studies in combos.values() for r in reads})
    out = [f"Each combination's studies read after {' / '.join(map(str, reads))} trials, each the prefix of its "
           f"seed's study; a cell names its seeds where fewer than {seeds[-1]} ran that far.", "",
           "Regret (nats above the optimum) of the winner: median / 90th percentile over seeds", "",
           f"| controller | early stopping | {head} | seconds per study (trials) |",
           "|---|---|" + "---|" * (len(reads) + 1)]

    def cell(studies: dict[int, dict], r: int, text) -> str:
        group = reaching(studies, r)
        if not group:
            return "-"
        return text(group) + ("" if len(group) == seeds[-1] else f" ({len(group)} seed{'s' if len(group) > 1 else ''})")

    for (controller, early_stop), studies in combos.items():
        cells = [cell(studies, r, lambda group, r=r: median_p90([regret(s, r, optimum) for s in group])) for r in reads]
        timing = ", ".join(f"{statistics.fmean(s['seconds'] for s in studies.values() if s['trials'] == n):.1f} ({n})"
                           for n in sorted({s["trials"] for s in studies.values()}))
        out.append(f"| {controller} | {label(early_stop)} | " + " | ".join(cells) + f" | {timing} |")
    if lowest < setup["optimum"]:
        found = sum(1 for studies in combos.values() for s in studies.values()
                    if any(state == COMPLETE and true < setup["optimum"]
                           for state, true in zip(s["state"], s["true"], strict=True)))
        out.append(f"\nRegret is read against {optimum:.4f}, a trial that {found} studies ran to its end, "
                   f"{setup['optimum'] - optimum:.4f} below the setup's optimum: its random members missed the best region.")

    out += ["", "Compute spent, in trials run to their end (mean over seeds; with early stopping, its share of the "
            "same controller's without, over the same seeds), and trials stopped at each rung (mean per study, "
            "all its trials)", "",
            f"| controller | early stopping | {head} | stopped at report " + " / ".join(map(str, rungs)) + " |",
            "|---|---|" + "---|" * (len(reads) + 1)]
    for (controller, early_stop), studies in combos.items():
        full = combos.get((controller, False), {})
        cells = []
        for r in reads:
            def spent_text(group, r=r):
                mean = statistics.fmean(spent(s, r) for s in group)
                paired = [(s, full[s["seed"]]) for s in group if len(full.get(s["seed"], {}).get("state", [])) >= r]
                if not early_stop or not paired:
                    return f"{mean:.1f}"
                share = sum(spent(s, r) for s, _ in paired) / sum(spent(base, r) for _, base in paired)
                return f"{mean:.1f} ({share:.0%})"
            cells.append(cell(studies, r, spent_text))
        stops = " / ".join(f"{statistics.fmean(s['stopped_at'].count(rung) / len(s['state']) for s in studies.values()):.2f}"
                           for rung in rungs)
        out.append(f"| {controller} | {label(early_stop)} | " + " | ".join(cells) + f" | {stops} per trial |")

    out += ["", "Winner is a warm start (a hand design): fraction of seeds", "",
            f"| controller | early stopping | {head} |", "|---|---|" + "---|" * len(reads)]
    def warm_share(group: list[dict], r: int) -> str:
        winners = [s["warm_start"][w] for s in group if (w := winner(s, r)) is not None]
        return f"{np.mean([name is not None for name in winners]):.2f}"

    for (controller, early_stop), studies in combos.items():
        cells = [cell(studies, r, lambda group, r=r: warm_share(group, r)) for r in reads]
        out.append(f"| {controller} | {label(early_stop)} | " + " | ".join(cells) + " |")

    # The warm starts are left out: sized-cpu itself is trial 1.
    bar = setup["baseline"]
    out += ["", f"Trials until one not a warm start runs to its end with a noise-free final below {BASELINE}'s "
            f"measured mean, {bar:.4f} (the final-loss model's value of {BASELINE}: {setup['baseline_predicted']:.4f}): "
            "median over seeds (seeds that got there; \">N\" when the median seed did not within its N trials)", "",
            f"| controller | early stopping | trials to beat {BASELINE} |", "|---|---|---|"]
    for (controller, early_stop), studies in combos.items():
        hits = [trials_to_beat(s, bar) for s in studies.values()]
        median = float(np.median([math.inf if h is None else h for h in hits]))
        shortest = min(len(s["state"]) for s in studies.values())
        out.append(f"| {controller} | {label(early_stop)} | {f'>{shortest}' if math.isinf(median) else f'{median:g}'} "
                   f"({sum(h is not None for h in hits)}/{len(hits)}) |")

    equal = [r for r in reads if r < longest]
    pairs = [(c, combos[c, False], combos[c, True]) for c, es in combos if es and (c, False) in combos]
    if equal and pairs:
        out += ["", "Regret at equal compute: with early stopping, after the trials that spent what the same "
                "controller and seed spent without it: median / 90th percentile (median trials it took; how many "
                "seeds' studies ended before spending that much, read at their last trial, where any: at most that "
                "compute)", "",
                "| controller | " + " | ".join(f"without, {r} trials | with, same compute" for r in equal) + " |",
                "|---|" + "---|" * (2 * len(equal))]
        for controller, without, with_stop in pairs:
            cells = []
            for r in equal:
                matched = [(without[seed], s) for seed, s in with_stop.items()
                           if len(without.get(seed, {}).get("state", [])) >= r]
                counts = [trials_within(s, spent(base, r)) for base, s in matched]
                # Not left out where short: the seeds that got there would be the lucky ones.
                short = sum(sum(s["compute"]) < spent(base, r) - 1e-9 for base, s in matched)
                note = f"; {short} of {len(matched)} short" if short else ""
                cells += [median_p90([regret(base, r, optimum) for base, _ in matched]),
                          f"{median_p90([regret(s, n, optimum) for n, (_, s) in zip(counts, matched, strict=True)])}"
                          + (f" ({np.median(counts):g}{note})" if counts else "")]
            out.append(f"| {controller} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


# ---- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controllers", nargs="+", default=list(CONTROLLERS), choices=list(CONTROLLERS))
    parser.add_argument("--early-stop", nargs="+", default=["off", "on"], choices=["off", "on"])
    parser.add_argument("--seeds", type=int, default=30, help="studies per combination: seeds S..S+N-1")
    parser.add_argument("--first-seed", type=int, default=0, metavar="S",
                        help="the first seed (default 0): two processes may split the seeds")
    parser.add_argument("--trials", type=int, default=200, help="trials per study, counted as search.run counts them")
    parser.add_argument("--screen", action="store_true",
                        help="run screened studies (search.run's default from 20 trials) instead of --early-stop's")
    parser.add_argument("--screen-crams", type=Path, default=CRAMS,
                        help="the whole crams at a quarter of the budget the screen is fitted on (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="JSON lines: each finished study is appended; a rerun skips them")
    parser.add_argument("--report", type=Path, nargs="+", help="print the tables from these stored studies, run nothing")
    parser.add_argument("--table", type=Path, default=surrogates.DEFAULT_TABLE, help="repeated crams (default: %(default)s)")
    parser.add_argument("--crams", type=Path, default=CRAMS, help="the studies' and confirmations' CSVs")
    parser.add_argument("--members", type=int, default=surrogates.RANDOM_MEMBERS,
                        help="random members of the space the optimum is sought among")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the K-fold split")
    parser.add_argument("--boot", type=int, default=surrogates.BOOTSTRAP, help="bootstrap resamples of the intervals")
    args = parser.parse_args(argv)
    if args.report:
        if missing := [str(path) for path in args.report if not path.is_file()]:
            parser.error(f"--report: no such file {', '.join(missing)}; give the --out file of a run, or "
                         "benchmarks/crams/multi_fidelity.jsonl.gz")
        print(report(read_store(args.report)))
        return 0
    if args.out is None:
        parser.error("--out FILE.jsonl is needed to run studies (or --report FILE.jsonl to read them)")

    world = world_id(inputs(args.table, args.crams), args.members, 0)
    screen_world = screen_world_id(screen_files(args.screen_crams)) if args.screen else None
    schemes = ["screen"] if args.screen else args.early_stop
    stored = read_store([args.out])
    done = {(line["controller"], "screen" if line["kind"] == "screened" else label(line["early_stop"]), line["seed"],
             line["trials"]) for line in stored
            if line.get("world") == world and (line.get("kind") == "study" or
                                               line.get("kind") == "screened" and line.get("screen_world") == screen_world)}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    todo = [(controller, scheme, seed) for controller in args.controllers for scheme in schemes
            for seed in seeds if (controller, scheme, seed, args.trials) not in done]
    print(f"{len(todo)} studies to run, {args.seeds * len(args.controllers) * len(schemes) - len(todo)} "
          f"stored in {args.out} (world {world}{f', screen {screen_world}' if screen_world else ''})", flush=True)
    if todo:
        logging.getLogger("optuna").setLevel(logging.WARNING)
        logging.getLogger("search.study.controllers").setLevel(logging.ERROR)  # cmaes's note would repeat per study
        if "gp" in args.controllers:  # Optuna's GP runs on torch, whose threads threadpoolctl does not set
            import torch

            torch.set_num_threads(1)
        with threadpool_limits(1):  # one core each: the machine crams beside it
            setup = build(args.table, args.crams, args.members, args.folds, args.repeats, args.boot)
            print(setup.text + "\n", flush=True)
            # Rounded as the studies' values are (6 decimals): sized-cpu's own stored value is not below its bar.
            setups = {(line["kind"], line.get("screen_world")) for line in stored if line.get("world") == world
                      and line.get("kind") in ("setup", "screen_setup")}
            if ("setup", None) not in setups:  # one per world: a second process, or a screened run, adds none
                append(args.out, {"kind": "setup", "world": world, "optimum": round(setup.optimum, 6),
                                  "baseline": round(setup.baseline, 6),
                                  "baseline_predicted": round(setup.baseline_predicted, 6), "rungs": schedule()[1],
                                  "reports": schedule()[0], "text": setup.text})
            screen = None
            if args.screen:
                screen, text = build_screen(setup.world, setup.space, args.screen_crams, args.folds, args.repeats,
                                            args.boot, members=min(args.members, 2000))
                print(text + "\n", flush=True)
                if ("screen_setup", screen_world) not in setups:
                    append(args.out, {"kind": "screen_setup", "world": world, "screen_world": screen_world,
                                      "text": text})
            for controller, scheme, seed in todo:
                if scheme == "screen":
                    study = run_screened(setup.world, screen, setup.space, controller, seed, args.trials)
                else:
                    study = run_study(setup.world, setup.space, controller, scheme == "on", seed, args.trials)
                append(args.out, {**study, "world": world, **({"screen_world": screen_world} if screen else {})})
                name = f"{controller} {'screened' if scheme == 'screen' else f'early stopping {scheme}'} seed {seed}"
                if study["kind"] == "crash":
                    print(f"{name}: crashed at trial {study['at_trial']}: {study['error']} (kept as a crash: a rerun "
                          "runs it again)", flush=True)
                    continue
                if scheme == "screen":
                    loss, compute = study["true"][screened_winner(study, args.trials, PROMOTE)] - setup.optimum, \
                        screened_spent(study, args.trials, PROMOTE)
                else:
                    loss, compute = regret(study, args.trials, setup.optimum), spent(study, args.trials)
                print(f"{name}: {study['seconds']:.0f} s, compute {compute:.1f}, regret {loss:.4f}", flush=True)
    print(report(read_store([args.out])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
