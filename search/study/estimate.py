"""`python -m search.run --trials N --estimate`: what a study will cost, before it starts.

A study's cost is its trials' device time. Every trial pays its start-up (worker, data, model,
final validation) and, when it compiles, its compile; then it trains its budget, or until ASHA
stops it; the trials that finish are probed on GLUE. Early stopping is priced as the study applies
it (`search.study.driver.early_stop_for_session`): off unless asked for, and off for a session of fewer
trials than its `min_trials`. ASHA's rungs are Ray's (`asha_rungs`) over the progress reports, as
`search.study.ray_executor.early_stopping` sets them: at each rung a trial goes on only if it is in the best
1/reduction_factor of the trials that reached it, so a share 1/rf^k of the trials trains past rung
k (asynchronous ASHA promotes a little more than that while few trials have reported: the estimate
is of the study's steady state). The trials at once are what this machine fits, and never more
than there are trials.

The seconds that are not the budget's come from the profile's `costs` section, recorded from
measured runs (benchmarks/RESULTS.md says which): `startup_s`, `compile_s`, `probe_task_s` (a
probed task's tokenising and evaluation, on top of its fine-tuning cap) and, for a token or FLOP
budget, the speed that turns it into seconds (`tokens_per_s`, `flops_per_s`). A budget in
reference-core seconds (`180refs`) is FLOPs that differ by architecture (`trainer.budget.Budget.resolve`):
it is priced at the mean of what it resolves to over random draws of the study's space, then at
`flops_per_s`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from search.study.asha import SuccessiveHalving
from space.arch import yaml_number_hint
from space.errors import UsageError
from trainer.budget import Budget
from trainer.console import count, duration

COST_KEYS = ("startup_s", "compile_s", "probe_task_s", "tokens_per_s", "flops_per_s")
REFS_DRAWS = 64  # random architectures of the space a refs budget is averaged over (seeded: the same each time)


@dataclass(frozen=True)
class Costs:
    startup_s: float
    compile_s: float
    probe_task_s: float
    tokens_per_s: float | None = None
    flops_per_s: float | None = None
    # Not a profile key: the FLOPs one reference-core second buys, on average over the study's
    # space (`reference_flops_per_s`); None where no space is known (a refs budget cannot be priced).
    reference_flops_per_s: float | None = None

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
        amount, kind = budget.amount, budget.kind
        if budget.is_reference_core:
            if self.reference_flops_per_s is None:
                raise UsageError(f"--estimate: {budget.text} is reference-core seconds, whose FLOPs depend on the "
                                 "architecture: price it with search.run --estimate (over the study's space), or "
                                 "pass a budget in flops, tokens or seconds")
            amount, kind = amount * self.reference_flops_per_s, "flops"
        speed = {"tokens": self.tokens_per_s, "flops": self.flops_per_s}[kind]
        if not speed:
            raise UsageError(f"--estimate: a budget in {budget.kind} needs costs.{kind}_per_s in {name} "
                             "(a recorded speed), or pass a wall-clock --budget such as 5m")
        return amount / speed

    def priced_as(self, budget: Budget, name: str) -> str:
        """What a budget that is not seconds is priced as, in words: ` = 42 s of training at 4.8e10
        FLOP/s`; "" for a wall-clock budget."""
        if budget.is_wall_clock:
            return ""
        via = f" = {short(budget.amount * self.reference_flops_per_s)} FLOPs on average over the space" \
            if budget.is_reference_core else ""
        speed = f"{short(self.tokens_per_s)} tokens/s" if budget.kind == "tokens" else f"{short(self.flops_per_s)} FLOP/s"
        return f"{via} = {duration(self.train_seconds(budget, name))} of training at {speed}"


def short(number: float) -> str:
    """Two significant digits, as the profiles write them: `4.8e10`, `5e5`, `42`."""
    mantissa, _, exponent = f"{number:.2g}".partition("e")
    return mantissa + (f"e{int(exponent)}" if exponent else "")


def devices(amount: float, kind: str) -> str:
    """`1 CPU`, `8 GPUs`, `0.5 GPUs`."""
    return count(int(amount), kind) if float(amount).is_integer() else f"{amount:g} {kind}s"


def reference_flops_per_s(space, mlm_rate: float, draws: int = REFS_DRAWS) -> float:
    """The FLOPs one reference-core second resolves to (`Budget.resolve`), averaged over `draws`
    random architectures of `space` (seeded): the mean trial's FLOPs under a refs budget, per second."""
    import random

    rng = random.Random(0)
    one_second = Budget.parse("1refs")
    return sum(one_second.resolve(space.sample_random(rng), mlm_rate).amount for _ in range(draws)) / draws


def progress_reports(report_every: float) -> int:
    """The progress reports of a trial that trains its whole budget (trainer.loop.Trainer.report):
    one each `report_every` of the budget, the last at its end."""
    return math.ceil(1 / report_every - 1e-9)


def asha_rungs(grace: int, reduction_factor: float, max_t: float) -> list[int]:
    """The iterations at which Ray's ASHAScheduler (one bracket) compares trials, lowest first:
    the milestones of the local executor's `SuccessiveHalving`, which builds them as
    `ray.tune.schedulers.async_hyperband._Bracket` does (grace x rf^k while below max_t)."""
    return [round(milestone) for milestone in SuccessiveHalving(grace, reduction_factor, max_t).milestones]


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
    at_once: int  # trials running at once: what fits, at most `trials`
    per_trial: float  # each trial's GPUs (or CPUs)
    kind: str  # GPU or CPU
    probed: float
    ladder: str = ""  # the promotion ladder after the study (search.analysis.ladder), in words; "" for none
    ladder_hours: float = 0.0  # its device-hours, one run at a time
    assumed: str = ""  # what it priced, in words (`study_estimate`); "" for none

    @property
    def devices(self) -> float:
        """The devices busy at once: trials at once x each trial's GPUs (or CPUs)."""
        return self.at_once * self.per_trial

    @property
    def wall_hours(self) -> float:
        return self.device_hours / self.devices

    def line(self) -> str:
        line = (f"estimate: {count(self.trials, 'trial')}, {device_time(self.device_hours, self.kind)} "
                f"({device_time(self.wall_hours)} on {devices(self.devices, self.kind)}), "
                f"{count(round(self.probed), 'trial')} probed")
        if self.ladder:
            line += (f"; then the ladder {self.ladder}: {device_time(self.ladder_hours, self.kind)}; the whole path "
                     f"{device_time(self.device_hours + self.ladder_hours, self.kind)}")
        return line

    def text(self) -> str:
        """What `search.run --estimate` prints: the estimate, then what it assumed."""
        return self.line() + (f"\nassumed: {self.assumed}" if self.assumed else "")


def ladder_hours(ladder, candidates: int, baselines: int, seeds: int, costs: Costs, name: str, probe_s: float,
                 devices_per_run: float) -> float:
    """Device-hours of a promotion ladder (`search.analysis.ladder.Ladder`): at each rung, its climbers and
    the baselines, each with every seed, pay a run's start-up, the rung's training and the probe."""
    runs = [(climbers + baselines) * seeds for climbers in ladder.climbers(candidates)]
    seconds = sum(n * (costs.startup_s + costs.train_seconds(rung, name) + probe_s) for n, rung in zip(runs, ladder.rungs))
    return seconds * devices_per_run / 3600


def device_time(hours: float, kind: str | None = None) -> str:
    """`9.1 GPU-hours`, under an hour `12 CPU-minutes`, under a minute `40 CPU-seconds` (a short
    study is not `0.0 hours` or `0.3 minutes`); without `kind`, plain `hours`, `minutes` or `seconds`."""
    if hours >= 1:
        unit, amount = "hour", hours
    elif hours * 60 >= 1:
        unit, amount = "minute", hours * 60
    else:
        unit, amount = "second", hours * 3600
    text = f"{amount:.1f}" if unit == "hour" or (unit == "minute" and amount < 10) else f"{amount:.0f}"
    return f"{text} {kind + '-' if kind else ''}{unit}{'' if text == '1' else 's'}"


def estimate(trials: int, budget: Budget, costs: Costs, *, compile_model: bool, report_every: float,
             early_stop: dict | None, probe_tasks: int, probe_seconds_per_task: float,
             resources: dict[str, float], concurrent: int, name: str) -> Estimate:
    """The study's device-hours: `trials` x the mean trial's seconds x each trial's devices.
    `early_stop`: the session's ASHA settings (grace_reports, reduction_factor), None without ASHA
    (`search.study.driver.early_stop_for_session`); `probe_tasks`: 0 without the probe; `concurrent`:
    trials that fit at once (search.study.resources.concurrency), of which at most `trials` run."""
    reports = progress_reports(report_every)
    if early_stop:
        from trainer.loop import max_progress_reports

        factor = early_stop["reduction_factor"]
        # max_t as search.study.ray_executor.early_stopping gives ASHA: its rungs fall among the progress reports,
        # so the trials that reach the end all finish and are probed.
        rungs = asha_rungs(early_stop["grace_reports"], factor, max_progress_reports(report_every) + 0.5)
        trained, finishing = asha_shares(rungs, reports, factor)
    else:
        trained, finishing = 1.0, 1.0
    probe_s = probe_tasks * (probe_seconds_per_task + costs.probe_task_s)
    trial_s = (costs.startup_s + (costs.compile_s if compile_model else 0.0)
               + trained * costs.train_seconds(budget, name) + finishing * probe_s)
    kind = "GPU" if resources.get("gpu", 0) > 0 else "CPU"
    per_trial = resources["gpu"] if kind == "GPU" else resources["cpu"]
    return Estimate(trials, trials * trial_s * per_trial / 3600, max(1, min(concurrent, trials)), per_trial, kind,
                    trials * finishing if probe_tasks else 0.0)


def early_stop_words(checked, early_stop: dict | None, trials: int) -> str:
    """Early stopping as the estimate priced it (`early_stop`, the session's), and why it is off:
    `off (8 trials are too few: ASHA from 20 trials)`."""
    if early_stop:
        return (f"on (ASHA: rungs from progress report {early_stop['grace_reports']}, each keeping "
                f"1/{early_stop['reduction_factor']:g})")
    if checked.early_stop is not None:  # asked for, but the session is too short (early_stop_for_session)
        return (f"off ({count(trials, 'trial')} {'is' if trials == 1 else 'are'} too few: ASHA from "
                f"{checked.early_stop['min_trials']} trials)")
    if checked.screen > 1:
        return f"off (a screened study, --screen {checked.screen}: every trial crammed whole at its budget)"
    if checked.objective.multi:
        return f"off (the objective {checked.objective.name} has {len(checked.objective.metrics)} metrics; ASHA ranks one)"
    if not checked.profile["early_stop"].get("by_default"):
        return "off (the profile's default; --early-stop turns it on)"
    return "off (--no-early-stop)"


def study_estimate(checked, trials: int, max_concurrent: int | None, controller: str | None = None) -> Estimate:
    """The estimate of a study of `trials` from its checked flags and profile
    (`search.run.CheckedInputs`), its trials placed on this machine's CPUs and GPUs, with the line
    that says what it assumed (`controller`: named there; it costs nothing of its own)."""
    import os
    import sys

    import glue
    from search.study.driver import early_stop_for_session
    from search.study.resources import concurrency, local_gpus

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
    if checked.budget.is_reference_core:
        costs = dataclasses.replace(costs, reference_flops_per_s=reference_flops_per_s(checked.space,
                                                                                         checked.train.mlm_rate))
    early_stop, _ = early_stop_for_session(checked.early_stop, trials)
    study = estimate(trials, checked.budget, costs,
                     compile_model=checked.train.compile, report_every=checked.train.report_every,
                     early_stop=early_stop, probe_tasks=probe_tasks, probe_seconds_per_task=per_task,
                     resources=resources, concurrent=concurrent, name=name)
    at_once = "1 trial at a time" if study.at_once == 1 else f"{study.at_once} trials at once"
    assumed = [f"profile {name}", f"budget {checked.budget.text} a trial{costs.priced_as(checked.budget, name)}",
               f"early stopping {early_stop_words(checked, early_stop, trials)}",
               *([f"controller {controller}"] if controller else []),
               f"{at_once}, {devices(study.per_trial, study.kind)} each"]
    study = dataclasses.replace(study, assumed="; ".join(assumed))
    if checked.ladder is None:
        return study
    from search.analysis.ladder import LADDER_SEEDS, LADDER_TOP

    baselines = len(checked.profile.get("warm_start", []))  # the hand designs go up every rung beside them
    per_run = resources["gpu"] if study.kind == "GPU" else resources["cpu"]
    hours = ladder_hours(checked.ladder, LADDER_TOP, baselines, LADDER_SEEDS, costs, name,
                         probe_tasks * (per_task + costs.probe_task_s), per_run)
    words = (f"{checked.ladder.describe()} ({'+'.join(map(str, checked.ladder.climbers(LADDER_TOP)))} candidates and "
             f"{count(baselines, 'baseline')}, {LADDER_SEEDS} seeds each)")
    return dataclasses.replace(study, ladder=words, ladder_hours=hours)
