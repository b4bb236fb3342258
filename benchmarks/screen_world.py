"""The screen a simulated screened study sees (benchmarks/multi_fidelity.py --screen): the validation
loss of a whole cram at a quarter of the trial budget (search.run's default screen on the CPU
profile, search/study/screen.py), for any member of the CPU space, beside the curve world's final.

What it is built from: every whole cram at the screen's budget in benchmarks/crams/, one per
architecture (keyed as the curve world keys them): the screens of the screened studies
(`bracket-*-screen.csv`) and the default studies' architectures crammed again at a quarter
(`budget-rungs.csv`). One surrogate model (surrogate.MODELS, the lower held-out RMSE kept), and
the noise of the curve world's regimes. An assumption, printed with the setup: nobody crammed one
architecture at the screen's budget with two seeds, so its seed-to-seed noise is the regime's at
the trial budget. A screen value's noise is drawn from (seed, architecture) apart from its final's:
two crams, one seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import surrogate as surrogates  # benchmarks/surrogate.py: run as a script, this file's folder is on sys.path
from curve_world import PROFILE, TRIAL_BUDGET, World, arch_digest, arch_key, files_digest, schedule
from default_study import CRAMS, read
from scipy import stats

from search.base.states import COMPLETE
from search.study.screen import screen_budget
from space import ArchConfig, SearchSpace
from trainer.budget import Budget
from trainer.regimes import regime

SCREEN_FILES = ("bracket-s[0-9]-screen.csv", "bracket-200-screen.csv")  # search.run's screens
RUNG_FILE = "budget-rungs.csv"  # the default studies' architectures crammed again at other budgets
FACTOR = PROFILE["screen"]["factor"]  # the profile's screen: 1/FACTOR of the budget
PROMOTE = PROFILE["screen"].get("promote", FACTOR)  # and its best 1/PROMOTE promoted to the whole budget
SCREEN_BUDGET = screen_budget(Budget.parse(TRIAL_BUDGET), FACTOR).text  # as search.run spells it: 5e11flops


def screen_files(crams: Path = CRAMS) -> list[Path]:
    return sorted({path for pattern in (*SCREEN_FILES, RUNG_FILE) for path in crams.glob(pattern)})


def read_screens(paths: list[Path]) -> dict[str, tuple[ArchConfig, float]]:
    """(config, validation loss) of a whole cram at SCREEN_BUDGET, by `arch_key`, the first of each."""
    screens: dict[str, tuple[ArchConfig, float]] = {}
    for path in paths:
        for row in read(path):
            whole = row.get("budget") == SCREEN_BUDGET and not row.get("error") if path.name == RUNG_FILE \
                else row.get("state") == COMPLETE
            if whole and row.get("arch") and row.get("validation_loss"):
                config = ArchConfig.from_dict(json.loads(row["arch"]))
                screens.setdefault(arch_key(config), (config, float(row["validation_loss"])))
    return screens


def screen_world_id(paths: list[Path]) -> str:
    return files_digest(paths, SCREEN_BUDGET).hexdigest()[:12]


@dataclass
class ScreenWorld:
    """The screen's loss of any member of the space, noise-free and as a seed sees it."""

    world: World  # the curve world: its finals, its regimes' noise
    features: surrogates.Features
    model: Any

    def __post_init__(self) -> None:
        self.truths: dict[str, float] = {}

    def truth(self, config: ArchConfig) -> float:
        key = arch_key(config)
        if key not in self.truths:
            self.truths[key] = float(self.model.predict(self.features([config]))[0])
        return self.truths[key]

    def observe(self, config: ArchConfig, seed: int) -> float:
        truth = self.truth(config)
        noise = np.random.default_rng([seed, arch_digest(config), FACTOR]).standard_normal()  # not the final's draw
        return truth + noise * self.world.sds[regime(truth, *self.world.references)]


def build_screen(world: World, space: SearchSpace, crams: Path, folds: int, repeats: int, boot: int,
                 members: int, seed: int = 0) -> tuple[ScreenWorld, str]:
    """The screen's surrogate, cross-validated, and what it is made of, as printed."""
    paths = screen_files(crams)
    screens = read_screens(paths)
    if len(screens) < 2 * folds:
        raise SystemExit(f"{len(screens)} architectures crammed whole at {SCREEN_BUDGET} in {crams}: too few to fit")
    configs, y = [c for c, _ in screens.values()], np.array([loss for _, loss in screens.values()])
    features = surrogates.Features(space)
    X = features(configs)
    quality = {name: surrogates.quality(y, surrogates.out_of_fold(name, X, y, folds, repeats, seed), seed, boot)
               for name in surrogates.MODELS} if repeats >= 1 else {}
    kept = min(quality, key=lambda name: quality[name].rmse) if quality else "GradientBoosting"
    screen = ScreenWorld(world, features, surrogates.MODELS[kept](seed).fit(X, y))

    lines = [f"## The screen: whole crams at {SCREEN_BUDGET} ({', '.join(p.name for p in paths)})", "",
             f"{len(screens)} distinct architectures crammed whole at {SCREEN_BUDGET}, a 1/{FACTOR} of the trial "
             f"budget (search.run's screen on the CPU profile); held-out {repeats} x {folds}-fold cross-validation, "
             "95% bootstrap intervals:", "", "| model | Kendall tau | Spearman | RMSE (nats) |", "|---|---|---|---|"]
    for name, q in quality.items():
        lines.append(f"| {name}{' (kept)' if name == kept else ''} | {surrogates.interval(q.kendall)} | "
                     f"{surrogates.interval(q.spearman)} | {q.rmse:.4f} |")
    # Does the simulated screen rank the final as the real screens do? Measured over the architectures
    # crammed at both budgets (the final from the studies' trials or the screened studies' promotions).
    finals: dict[str, float] = {}
    for path in [*sorted(crams.glob("bracket-*.csv")), *sorted(crams.glob("default-s[0-9].csv"))]:
        if "-screen" in path.stem or "-confirm" in path.stem:
            continue
        for row in read(path):
            if row.get("state") == COMPLETE and row.get("arch"):
                finals[arch_key(ArchConfig.from_dict(json.loads(row["arch"])))] = float(row["validation_loss"])
    both = [key for key in screens if key in finals]
    measured = stats.spearmanr([screens[k][1] for k in both], [finals[k] for k in both]).statistic
    fitted = stats.spearmanr([screen.truth(screens[k][0]) for k in both],
                             [world.truth(screens[k][0])[schedule()[0]] for k in both]).statistic
    rng = random.Random(seed)
    drawn = [space.sample_random(rng) for _ in range(members)]
    noisy = [screen.observe(config, seed) for config in drawn]
    final = [float(world.observe(config, seed)[schedule()[0]]) for config in drawn]
    simulated = stats.spearmanr(noisy, final).statistic
    lines += ["", f"How well the screen ranks the final (Spearman): measured over the {len(both)} architectures crammed "
              f"at both budgets, {measured:.2f}; the surrogates' noise-free values over the same, {fitted:.2f}; "
              f"{members} random members with the noise the simulation adds, {simulated:.2f}. Assumption: a screen "
              f"value's seed-to-seed noise is its regime's at the trial budget (nobody crammed one architecture "
              f"twice at {SCREEN_BUDGET}), independent of its final's."]
    return screen, "\n".join(lines)
