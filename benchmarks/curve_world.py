"""The world a simulated `search.run` study runs in (benchmarks/multi_fidelity.py): the curves of any
member of the CPU space, noise-free and as a seed sees them, fitted to the real studies' crams.

What it is built from, and why:
- the multi-fidelity table: every trial of the studies in benchmarks/crams/ (`*-sS.csv`,
  `default-200.csv`): its curve (train MLM loss at each progress report; 15 for a trial run to its
  end, fewer for one ASHA stopped: up to the report it was stopped at, or the report before in the
  early-s* studies, which ran before the driver counted that report, a711bea) and its final
  validation loss. One entry per architecture, keyed by its canonical fields (the training seed is
  fixed: the same architecture is the same cram);
- the curve surrogate: one model of `surrogate.MODELS` per fidelity (each report 1..15 and the
  final loss), each fit on the architectures that have that value, so stopped trials count at
  their early reports; the final loss and the rungs are cross-validated as surrogate.py does, and
  the model with the lower held-out RMSE of the final loss is kept for every fidelity;
- the noise: the pooled seed-to-seed sd of the final loss per regime (trainer/regimes.py) over
  every repeated cram in the repository (benchmarks/cram_table.csv and the confirmations
  `crams/*-confirm.csv`, never a study's own selection seed); each simulated value gets Gaussian
  noise with the sd of the regime of its noise-free value, intermediate reports included (an
  assumption: nobody measured their seed-to-seed noise), each value independently. The noise of
  an architecture is drawn from (seed, architecture): common random numbers across controllers,
  and an architecture trained twice in a study (stopped, then drawn again) gives the same curve,
  as a fixed training seed does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import surrogate as surrogates  # benchmarks/surrogate.py: run as a script, this file's folder is on sys.path
from default_study import BASELINE, CRAMS, read
from scipy import stats

from search.analysis.cram_table import TableCram, read_crams
from search.base.paths import CONFIGS, PROFILES
from search.base.states import COMPLETE
from search.run import ASHA_MIN_TRIALS, load_profile
from search.study.asha import SuccessiveHalving
from search.study.stopped import rung_ranking
from search.study.warm_start import hand_designs
from space import ArchConfig, SearchSpace, default_space_path, load_space
from trainer.config import load_run_config
from trainer.regimes import REGIMES, regime

# The studies' trials, by name: not confirmations, ladders, or the screened studies' crams at two budgets.
STUDY_FILES = ("default-s[0-9].csv", "early-s[0-9].csv", "default-200.csv")
TRIAL_BUDGET = "2e12flops"  # the studies' trial budget: only repeated crams at it measure their noise
PROFILE_PATH = PROFILES / "cpu.yaml"
PROFILE = load_profile(PROFILE_PATH)
ASHA = {"min_trials": ASHA_MIN_TRIALS, **PROFILE["early_stop"]}  # as search.run builds it
WORLD_SETTINGS = ("run_config", "warm_start", "early_stop")  # the profile's settings a world is made of




@functools.cache
def schedule() -> tuple[int, list[int]]:
    """(progress reports of a trial run to its end, ASHA's rungs among them), as search.run's
    executors set them. A predicted curve has a column per report, then the final loss (column
    `reports`). Imported here: trainer.loop loads torch, seconds that a process with no study
    left to run, or one that only reads stored studies, does without."""
    from trainer.loop import max_progress_reports

    reports = max_progress_reports(load_run_config(CONFIGS / PROFILE["run_config"]).train.report_every)
    return reports, SuccessiveHalving(ASHA["grace_reports"], ASHA["reduction_factor"], reports + 0.5).milestones


@functools.cache
def warm_starts() -> tuple[tuple[str, ArchConfig], ...]:
    """search.run's default warm starts, the profile's hand designs (read once: every study starts with them)."""
    return tuple(hand_designs(PROFILE))


def arch_key(config: ArchConfig) -> str:
    """One name per network: its canonical fields, not `fingerprint()` (whose spelling has changed)."""
    return json.dumps(config.canonical().to_dict(), sort_keys=True)


def arch_digest(config: ArchConfig) -> int:
    """A number per network, what its noise is drawn from (with the seed): the same in every world."""
    return int(hashlib.sha256(arch_key(config).encode()).hexdigest()[:16], 16)


def files_digest(paths: Sequence[Path], salt: str) -> hashlib._Hash:
    """A digest of `salt` and the files' names and bytes: what a world (or a screen) is made of."""
    digest = hashlib.sha256(salt.encode())
    for path in paths:
        digest.update(path.name.encode() + path.read_bytes())
    return digest


# ---- the multi-fidelity table ------------------------------------------------------------------

@dataclass
class Curve:
    """One architecture of the studies: its train loss at each report it reached, its final loss."""

    config: ArchConfig
    reports: dict[int, float]  # {report (1-based): train loss}
    final: float | None  # validation loss; None when every trial of it was stopped


def study_files(crams: Path = CRAMS) -> list[Path]:
    return sorted({path for pattern in STUDY_FILES for path in crams.glob(pattern) if "-confirm" not in path.stem})


def read_curves(paths: Sequence[Path]) -> tuple[dict[str, Curve], tuple[float, float]]:
    """The studies' architectures with a curve, by `arch_key`, and the references their losses are
    read against (corruption floor, two-neighbour count model: one corpus, one pair)."""
    curves: dict[str, Curve] = {}
    references: dict[tuple[float, float], int] = defaultdict(int)
    for path in paths:
        for row in read(path):
            if not row.get("curve") or not row.get("arch"):
                continue
            config = ArchConfig.from_dict(json.loads(row["arch"]))
            entry = curves.setdefault(arch_key(config), Curve(config, {}, None))
            for report, loss in enumerate(row["curve"].split(), start=1):
                entry.reports.setdefault(report, float(loss))
            if row["state"] == COMPLETE and row.get("validation_loss") and entry.final is None:
                entry.final = float(row["validation_loss"])
            if row.get("corruption_floor") and row.get("context_reference"):
                references[float(row["corruption_floor"]), float(row["context_reference"])] += 1
    if not references:
        raise SystemExit(f"no study trial with a curve and references in {', '.join(map(str, paths)) or CRAMS}")
    return curves, max(references, key=references.get)


# ---- the curve surrogate -----------------------------------------------------------------------

def fidelity_name(column: int) -> str:
    return "final" if column == schedule()[0] else f"report {column + 1}"


@dataclass
class CurveSurrogate:
    """One fitted model per fidelity (columns: each report, then the final loss)."""

    features: surrogates.Features
    model_name: str
    models: list[Any]
    fitted_on: list[int]  # architectures per fidelity
    quality: dict[tuple[int, str], surrogates.Quality]  # (column, model): held-out

    def predict(self, configs: Sequence[ArchConfig]) -> np.ndarray:
        """(configs, reports + 1): every report's train loss and the final loss, noise-free."""
        X = self.features(configs)
        return np.column_stack([model.predict(X) for model in self.models])


def fit_curves(curves: dict[str, Curve], space: SearchSpace, folds: int, repeats: int, boot: int,
               seed: int = 0) -> CurveSurrogate:
    reports, rungs = schedule()
    final = reports
    features = surrogates.Features(space)
    entries = list(curves.values())
    X = features([entry.config for entry in entries])
    targets = []
    for column in range(reports + 1):
        have = [i for i, e in enumerate(entries) if (e.final if column == final else e.reports.get(column + 1)) is not None]
        y = np.array([entries[i].final if column == final else entries[i].reports[column + 1] for i in have])
        targets.append((np.array(have), y))
    checked = [final, *(rung - 1 for rung in rungs)]  # the objective and what ASHA decides on
    quality = {}
    for column in checked:
        have, y = targets[column]
        if repeats >= 1 and len(y) >= 2 * folds:
            for name in surrogates.MODELS:
                predictions = surrogates.out_of_fold(name, X[have], y, folds, repeats, seed)
                quality[column, name] = surrogates.quality(y, predictions, seed, boot)
    scored = [name for name in surrogates.MODELS if (final, name) in quality]
    # Unchecked (--repeats 0, or too few architectures), GradientBoosting: a study predicts one
    # architecture at a time, and its one-row predictions are ~40x faster than HistGradientBoosting's.
    kept = min(scored, key=lambda name: quality[final, name].rmse) if scored else "GradientBoosting"
    models = [surrogates.MODELS[kept](seed).fit(X[have], y) for have, y in targets]
    return CurveSurrogate(features, kept, models, [len(y) for _, y in targets], quality)


# ---- noise, measured per regime -------------------------------------------------------------------

@dataclass(frozen=True)
class RegimeNoise:
    regime: str
    sd: float  # NaN where no architecture of the regime was crammed with 2+ seeds
    architectures: int
    crams: int


def repeated_crams(table: Path, crams_dir: Path, study_rows: dict[str, list[dict]]) -> list[TableCram]:
    """Every cram at the trial budget of an architecture with 2+ seeds, `architecture` its
    `arch_key`, each (architecture, seed) once: the cram table's, and the confirmations (a study's
    winner at fresh seeds, or the baseline; its selection seed stays out: it was picked for being low)."""
    found: dict[tuple[str, int], TableCram] = {}
    if table.is_file():
        for cram in read_crams(table)[0]:
            found.setdefault((arch_key(cram.config), cram.seed), cram)
    hands = dict(warm_starts())
    for path in sorted(crams_dir.glob("*-confirm.csv")):
        for row in read(path):
            if row.get("budget") != TRIAL_BUDGET or not row.get("validation_loss"):
                continue
            name = row["configuration"]
            if name.startswith("trial "):
                trial = next((r for r in study_rows.get(row["name"], []) if r["trial"] == name.split()[1]), None)
                config = ArchConfig.from_dict(json.loads(trial["arch"])) if trial and trial.get("arch") else None
            else:
                config = hands.get(name)
            if config is not None:
                key = arch_key(config)
                found.setdefault((key, int(row["seed"])), TableCram(key, row["configuration"], int(row["seed"]), config,
                                                                    float(row["validation_loss"])))
    crams = [TableCram(key, c.source, seed, c.config, c.loss) for (key, seed), c in found.items()]
    seeds = defaultdict(int)
    for cram in crams:
        seeds[cram.architecture] += 1
    return [cram for cram in crams if seeds[cram.architecture] >= 2]


def noise_by_regime(crams: Sequence[TableCram], references: tuple[float, float]) -> dict[str, RegimeNoise]:
    """Pooled seed-to-seed sd (surrogate.seed_noise) of the architectures whose mean loss is in each regime."""
    groups: dict[str, list[TableCram]] = defaultdict(list)
    for cram in crams:
        groups[cram.architecture].append(cram)
    by_regime: dict[str, list[TableCram]] = defaultdict(list)
    for rows in groups.values():
        by_regime[regime(statistics.fmean(r.loss for r in rows), *references)] += rows
    result = {}
    for name in REGIMES:
        sd, architectures = surrogates.seed_noise(by_regime[name]) if by_regime[name] else (math.nan, 0)
        result[name] = RegimeNoise(name, sd, architectures, len(by_regime[name]))
    return result


def noise_sds(noise: dict[str, RegimeNoise]) -> dict[str, float]:
    """The sd each regime's values get: its own where measured; a regime nobody crammed twice gets the
    pool of the measured regimes off the plateau (the nearest in loss), else of all of them."""
    measured = {name: n for name, n in noise.items() if n.architectures}
    if not measured:
        raise SystemExit("no architecture crammed with 2+ seeds: no measured noise to add")
    off = [n for name, n in measured.items() if name != "plateau"] or list(measured.values())
    pooled = math.sqrt(sum(n.sd ** 2 * (n.crams - n.architectures) for n in off) / sum(n.crams - n.architectures for n in off))
    return {name: measured[name].sd if name in measured else pooled for name in REGIMES}


# ---- the world every study runs in ----------------------------------------------------------------

class World:
    """Noise-free and observed curves of any member of the space (cached: studies revisit)."""

    def __init__(self, model: CurveSurrogate, sds: dict[str, float], references: tuple[float, float]):
        self.model, self.sds, self.references = model, sds, references
        self.truths: dict[str, np.ndarray] = {}

    def truth(self, config: ArchConfig) -> np.ndarray:
        key = arch_key(config)
        if key not in self.truths:
            self.truths[key] = self.model.predict([config])[0]
        return self.truths[key]

    def observe(self, config: ArchConfig, seed: int) -> np.ndarray:
        """The curve and final a study of seed `seed` sees: the same for this architecture in every
        controller's study of that seed, and each time it is trained in one."""
        truth = self.truth(config)
        normal = np.random.default_rng([seed, arch_digest(config)]).standard_normal(len(truth))
        return truth + normal * np.array([self.sds[regime(value, *self.references)] for value in truth])



def world_id(paths: Sequence[Path], members: int, seed: int) -> str:
    """What the studies' world is made of: the crams read, the profile's settings that shape it (its
    run config, whose reports and training every curve has, hand designs, rungs; not the rest of
    the file, so a new setting elsewhere in it leaves the world as it was) and the settings that change it."""
    digest = files_digest([*paths, CONFIGS / PROFILE["run_config"]], f"{members}|{seed}")
    digest.update(json.dumps({key: PROFILE[key] for key in WORLD_SETTINGS}, sort_keys=True).encode())
    return digest.hexdigest()[:12]


def inputs(table: Path, crams: Path) -> list[Path]:
    return [*study_files(crams), *sorted(crams.glob("*-confirm.csv")), *([table] if table.is_file() else [])]


# ---- setup: the table, the surrogate, the noise, the optimum ---------------------------------------

@dataclass
class Setup:
    world: World
    space: SearchSpace
    optimum: float
    baseline: float  # sized-cpu's measured mean final loss
    baseline_predicted: float  # and the final-loss model's value of it
    text: str  # what it is made of, as printed


def build(table: Path, crams: Path, members: int, folds: int, repeats: int, boot: int, seed: int = 0) -> Setup:
    reports, rungs = schedule()
    final = reports
    paths = study_files(crams)
    study_rows = {path.stem: read(path) for path in paths}
    curves, references = read_curves(paths)
    space = load_space(default_space_path("cpu"))
    model = fit_curves(curves, space, folds, repeats, boot, seed)
    repeated = repeated_crams(table, crams, study_rows)
    noise = noise_by_regime(repeated, references)
    world = World(model, noise_sds(noise), references)

    rng = random.Random(seed)
    drawn = [space.sample_random(rng) for _ in range(members)]
    drawn_curves = model.predict(drawn) if drawn else np.empty((0, reports + 1))
    pool = [entry.config for entry in curves.values()] + drawn
    finals = np.concatenate([model.predict(pool[:len(curves)])[:, final], drawn_curves[:, final]])
    optimum, best = float(finals.min()), pool[int(finals.argmin())]
    sized_config = dict(warm_starts())[BASELINE]
    sized = arch_key(sized_config)
    baseline_losses = [c.loss for c in repeated if c.architecture == sized]
    if not baseline_losses:
        raise SystemExit(f"no measured cram of {BASELINE} at {TRIAL_BUDGET} in {table} or {crams}/*-confirm.csv")
    baseline = statistics.fmean(baseline_losses)

    entries = list(curves.values())
    complete = [e for e in entries if e.final is not None and len(e.reports) >= reports]
    lines = [f"## Multi-fidelity table: {len(paths)} studies ({', '.join(p.name for p in paths)})", "",
             f"{len(entries)} distinct architectures with a curve, {len(complete)} of them with all {reports} reports and a "
             f"final loss; ASHA's rungs (grace {ASHA['grace_reports']}, reduction {ASHA['reduction_factor']}): reports "
             f"{', '.join(map(str, rungs))}. Architectures each fidelity's model is fit on: "
             + ", ".join(f"{fidelity_name(c)} {n}" for c, n in enumerate(model.fitted_on)
                         if c in (0, final) or c + 1 in rungs or model.fitted_on[c] != model.fitted_on[c - 1]) + ".", ""]
    if not model.quality:
        lines.append(f"Not cross-validated (--repeats {repeats}, or fewer than 2 x {folds} architectures): "
                     f"{model.model_name} kept unchecked for every fidelity.")
    else:
        lines += [f"Held-out {repeats} x {folds}-fold cross-validation over architectures; 95% bootstrap intervals "
                  f"(kept for every fidelity: {model.model_name}, the lower RMSE of the final loss):", "",
                  "| fidelity | model | architectures | Kendall tau | Spearman | RMSE (nats) |", "|---|---|---|---|---|---|"]
    for (column, name), q in sorted(model.quality.items(), key=lambda item: (item[0][0] != final, item[0])):
        lines.append(f"| {fidelity_name(column)} | {name}{' (kept)' if name == model.model_name else ''} | "
                     f"{model.fitted_on[column]} | {surrogates.interval(q.kendall)} | "
                     f"{surrogates.interval(q.spearman)} | {q.rmse:.4f} |")

    # Does the simulation rank by its rungs as the real crams do? A surrogate whose reports predict its
    # final too well would flatter early stopping.
    checked = [*rungs, reports]
    measured = {r.report: r for r in rung_ranking([e.reports for e in complete], [e.final for e in complete],
                                                  reports=checked, resamples=boot)}
    noisy = drawn_curves + np.random.default_rng(seed).standard_normal(drawn_curves.shape) * np.vectorize(
        lambda value: world.sds[regime(value, *references)])(drawn_curves) if drawn else drawn_curves
    fitted = model.predict([e.config for e in complete])  # in-sample: the same architectures as measured
    lines += ["", "How well a report ranks the final loss (Spearman): measured over the table's complete curves; the "
              "surrogate's over the same architectures (in-sample), and over "
              f"{members} random members of the space without and with the noise the simulation adds:", "",
              "| report | measured (95% bootstrap) | surrogate, same architectures | surrogate, random members | "
              "with the noise |", "|---|---|---|---|---|"]
    for report in checked:
        m = measured.get(report)
        cells = [f"{m.spearman:.2f} ({m.low:.2f} to {m.high:.2f}), {m.trials} architectures" if m else "-"]
        for values in (fitted, drawn_curves, noisy):
            cells.append(f"{stats.spearmanr(values[:, report - 1], values[:, final]).statistic:.2f}"
                         if len(values) > 2 else "-")
        lines.append(f"| {report}{' (rung)' if report in rungs else ''} | " + " | ".join(cells) + " |")

    lines += ["", f"Seed-to-seed noise of the final loss by regime (trainer/regimes.py; references: corruption floor "
              f"{references[0]:.3f}, two-neighbour count model {references[1]:.3f}), pooled over architectures crammed "
              f"at {TRIAL_BUDGET} with 2+ seeds in {table.name} and crams/*-confirm.csv:", "",
              "| regime | sd (nats) | architectures | crams | sd the simulation adds |", "|---|---|---|---|---|"]
    for name, n in noise.items():
        measured_sd = f"{n.sd:.4f}" if n.architectures else "not measured"
        used = f"{world.sds[name]:.4f}" + ("" if n.architectures else " (the measured regimes off the plateau, pooled)")
        lines.append(f"| {name} | {measured_sd} | {n.architectures} | {n.crams} | {used} |")
    lines += ["", "Assumptions: each value's noise has the sd of the regime of its noise-free value, intermediate reports "
              "included, whose seed-to-seed noise nobody measured; each value's noise is independent of the others "
              "of its curve. Trials run one after another (search.run runs two at a time on the CPU profile).", "",
              f"Optimum {optimum:.4f} (the final-loss model over the table's architectures and {members} random "
              f"members): {best.describe()}. {BASELINE}'s measured mean: {baseline:.4f} ({len(baseline_losses)} crams)."]
    return Setup(world, space, optimum, baseline, float(model.predict([sized_config])[0, final]), "\n".join(lines))
