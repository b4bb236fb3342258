"""`python -m search.run --trials N --estimate`: what a study will cost, before it starts.

A study's cost is its trials' device time. Every trial pays its start-up (worker, data, model,
final validation) and, when it compiles, its compile; then it trains until ASHA stops it; the
trials that finish are probed on GLUE. ASHA's rungs are Ray's (`asha_rungs`): at each rung a trial
goes on only if it is in the best 1/reduction_factor of the trials that reached it, so a share
1/rf^k of the trials trains past rung k (asynchronous ASHA promotes a little more than that while
few trials have reported: the estimate is of the study's steady state).

The seconds that are not the budget's come from the profile's `costs` section, recorded from
measured runs (benchmarks/RESULTS.md says which): `startup_s`, `compile_s`, `probe_task_s` (a
probed task's tokenising and evaluation, on top of its fine-tuning cap) and, for a token or FLOP
budget, the speed that turns it into seconds (`tokens_per_s`, `flops_per_s`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from space.arch import yaml_number_hint
from space.errors import UsageError
from trainer.budget import Budget
from trainer.console import count

COST_KEYS = ("startup_s", "compile_s", "probe_task_s", "tokens_per_s", "flops_per_s")


@dataclass(frozen=True)
class Costs:
    startup_s: float
    compile_s: float
    probe_task_s: float
    tokens_per_s: float | None = None
    flops_per_s: float | None = None

    @classmethod
    def from_profile(cls, profile: dict[str, Any], name: str) -> Costs:
        """The profile's `costs` mapping, each value a positive number; UsageError naming the key."""
        costs = profile.get("costs")
        fix = f"add costs: {{startup_s: ..., compile_s: ..., probe_task_s: ...}} to {name} (see search/profiles/gpu.yaml)"
        if not isinstance(costs, dict):
            raise UsageError(f"--estimate: {name} has no costs section; {fix}")
        unknown = sorted(set(costs) - set(COST_KEYS))
        if unknown:
            raise UsageError(f"--estimate: {name}: costs.{unknown[0]} is not a cost; allowed: {', '.join(COST_KEYS)}")
        for key, value in costs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise UsageError(f"--estimate: {name}: costs.{key} must be a number of at least 0, got {value!r}"
                                 f"{yaml_number_hint(value)}")
        missing = [key for key in COST_KEYS[:3] if key not in costs]
        if missing:
            raise UsageError(f"--estimate: {name}: costs lacks {', '.join(missing)}; {fix}")
        return cls(**{key: float(value) for key, value in costs.items()})

    def train_seconds(self, budget: Budget, name: str) -> float:
        """A trial's training seconds at its full budget."""
        if budget.is_wall_clock:
            return budget.amount
        speed = {"tokens": self.tokens_per_s, "flops": self.flops_per_s}[budget.kind]
        if not speed:
            raise UsageError(f"--estimate: a budget in {budget.kind} needs costs.{budget.kind}_per_s in {name} "
                             "(a recorded speed), or pass a wall-clock --budget such as 5m")
        return budget.amount / speed


def progress_reports(report_every: float) -> int:
    """The progress reports of a trial that trains its whole budget (trainer.loop.Trainer.report):
    one each `report_every` of the budget, the last at its end."""
    return math.ceil(1 / report_every - 1e-9)


def asha_rungs(grace: int, reduction_factor: float, max_t: int) -> list[int]:
    """The iterations at which Ray's ASHAScheduler (one bracket) compares trials, lowest first:
    grace x rf^k while below max_t, as `ray.tune.schedulers.async_hyperband._Bracket` builds them."""
    count = int(math.log(max_t / grace) / math.log(reduction_factor) + 1)
    return [round(grace * reduction_factor**k) for k in range(count)]


def asha_shares(rungs: list[int], reports: int, reduction_factor: float) -> tuple[float, float]:
    """(mean fraction of the budget a trial trains, share of trials that finish and are probed),
    with rungs in progress reports. A trial stopped at rung m has trained m/reports of its budget;
    a rung at the last report stops trials that trained it all, but before their probe; rungs past
    it (the final report) stop nothing."""
    rungs = [rung for rung in rungs if rung <= reports]
    trained, survivors, done = 0.0, 1.0, 0
    for rung in rungs:
        trained += survivors * (rung - done) / reports
        survivors, done = survivors / reduction_factor, rung
    trained += survivors * (reports - done) / reports
    return trained, survivors


@dataclass(frozen=True)
class Estimate:
    trials: int
    device_hours: float
    devices: float  # running at once: trials at once x each trial's GPUs (or CPUs)
    kind: str  # GPU or CPU
    probed: float
    ladder: str = ""  # the promotion ladder after the study (search.ladder), in words; "" for none
    ladder_hours: float = 0.0  # its device-hours, one run at a time

    @property
    def wall_hours(self) -> float:
        return self.device_hours / self.devices

    def line(self) -> str:
        devices = count(self.devices, self.kind) if float(self.devices).is_integer() else f"{self.devices:g} {self.kind}s"
        line = (f"estimate: {count(self.trials, 'trial')}, {device_time(self.device_hours, self.kind)} "
                f"({device_time(self.wall_hours)} on {devices}), {count(round(self.probed), 'trial')} probed")
        if self.ladder:
            line += (f"; then the ladder {self.ladder}: {device_time(self.ladder_hours, self.kind)}; the whole path "
                     f"{device_time(self.device_hours + self.ladder_hours, self.kind)}")
        return line


def ladder_hours(ladder, candidates: int, baselines: int, seeds: int, costs: Costs, name: str, probe_s: float,
                 devices_per_run: float) -> float:
    """Device-hours of a promotion ladder (`search.ladder.Ladder`): at each rung, its climbers and
    the baselines, each with every seed, pay a run's start-up, the rung's training and the probe."""
    runs = [(climbers + baselines) * seeds for climbers in ladder.climbers(candidates)]
    seconds = sum(n * (costs.startup_s + costs.train_seconds(rung, name) + probe_s) for n, rung in zip(runs, ladder.rungs))
    return seconds * devices_per_run / 3600


def device_time(hours: float, kind: str | None = None) -> str:
    """`9.1 GPU-hours` or, under an hour, `12 CPU-minutes` (a short study is not `0.0 hours`);
    without `kind`, plain `hours` or `minutes`."""
    unit, amount = ("hour", hours) if hours >= 1 else ("minute", hours * 60)
    text = f"{amount:.1f}" if unit == "hour" or amount < 10 else f"{amount:.0f}"
    return f"{text} {kind + '-' if kind else ''}{unit}{'' if text == '1' else 's'}"


def estimate(trials: int, budget: Budget, costs: Costs, *, compile_model: bool, report_every: float,
             early_stop: dict | None, probe_tasks: int, probe_seconds_per_task: float,
             resources: dict[str, float], concurrent: int, name: str) -> Estimate:
    """The study's device-hours: `trials` x the mean trial's seconds x each trial's devices.
    `early_stop`: the profile's (grace_reports, reduction_factor), None without ASHA;
    `probe_tasks`: 0 without the probe; `concurrent`: trials at once (search.study.concurrency)."""
    reports = progress_reports(report_every)
    if early_stop:
        factor = early_stop["reduction_factor"]
        # max_t as search.study gives ASHA: the progress reports and the final report.
        rungs = asha_rungs(early_stop["grace_reports"], factor, reports + 1)
        trained, finishing = asha_shares(rungs, reports, factor)
    else:
        trained, finishing = 1.0, 1.0
    probe_s = probe_tasks * (probe_seconds_per_task + costs.probe_task_s)
    trial_s = (costs.startup_s + (costs.compile_s if compile_model else 0.0)
               + trained * costs.train_seconds(budget, name) + finishing * probe_s)
    kind = "GPU" if resources.get("gpu", 0) > 0 else "CPU"
    per_trial = resources["gpu"] if kind == "GPU" else resources["cpu"]
    return Estimate(trials, trials * trial_s * per_trial / 3600, concurrent * per_trial, kind,
                    trials * finishing if probe_tasks else 0.0)


def study_estimate(checked, trials: int, max_concurrent: int | None) -> Estimate:
    """The estimate of a study of `trials` from its checked flags and profile
    (`search.run.CheckedInputs`), its trials placed on this machine's CPUs and GPUs."""
    import os
    import sys

    import glue
    from search.resources import local_gpus
    from search.study import concurrency

    name = checked.profile_path.name
    resources = checked.resources
    have = {"cpu": os.cpu_count() or 1, "gpu": local_gpus() if resources["gpu"] > 0 else 0}
    if all(have[kind] >= amount for kind, amount in resources.items()):
        concurrent = concurrency(resources, have, max_concurrent, lambda line: print(line, file=sys.stderr))
    else:  # priced for another machine (a GPU study on a laptop): as many at once as asked
        concurrent = max_concurrent or 1
    probe_tasks, per_task = 0, 0.0
    if checked.probe is not None:
        probe_tasks = len(checked.probe.tasks)
        per_task = glue.ProbeLimits(**checked.probe.limits).max_seconds_per_task
        if per_task is None:
            raise UsageError(f"--estimate: {name}: probe.limits.max_seconds_per_task is unset, so a probe has no "
                             "known length; set it (e.g. 60.0)")
    costs = Costs.from_profile(checked.profile, name)
    study = estimate(trials, checked.budget, costs,
                     compile_model=checked.train.compile, report_every=checked.train.report_every,
                     early_stop=checked.early_stop, probe_tasks=probe_tasks, probe_seconds_per_task=per_task,
                     resources=resources, concurrent=concurrent, name=name)
    if checked.ladder is None:
        return study
    from search.ladder import LADDER_SEEDS, LADDER_TOP

    baselines = len(checked.profile.get("warm_start", []))  # the hand designs go up every rung beside them
    per_run = resources["gpu"] if study.kind == "GPU" else resources["cpu"]
    hours = ladder_hours(checked.ladder, LADDER_TOP, baselines, LADDER_SEEDS, costs, name,
                         probe_tasks * (per_task + costs.probe_task_s), per_run)
    words = (f"{checked.ladder.describe()} ({'+'.join(map(str, checked.ladder.climbers(LADDER_TOP)))} candidates and "
             f"{count(baselines, 'baseline')}, {LADDER_SEEDS} seeds each)")
    return dataclasses.replace(study, ladder=words, ladder_hours=hours)
