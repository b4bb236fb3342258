"""Asynchronous successive halving over a trial's progress reports, without Ray: the early stopping
of `search.run --executor local`, deciding exactly as Ray Tune's `ASHAScheduler` with one bracket
decides for the Ray executor (`search.study.ray_executor.early_stopping`; tests/test_local_executor.py
feeds both the same reports).

The rungs are `grace_reports` x `reduction_factor`^k reports, below `max_reports` (the milestones
Ray derives from its `max_t`). The first time a trial's report count reaches a rung, its train loss
is recorded there, and the trial is stopped if it is worse than the best 1/`reduction_factor` of
the losses recorded at that rung before it (Ray's cutoff: a percentile of the negated losses,
kept here so that ties and interpolation agree).

`replay` runs the rule over finished trials' curves: what other rungs would have kept and spent."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


class SuccessiveHalving:
    def __init__(self, grace_reports: int, reduction_factor: float, max_reports: float):
        self.reduction_factor = reduction_factor
        count = int(math.log(max_reports / grace_reports) / math.log(reduction_factor) + 1)
        # Highest milestone first: a report counts at the highest rung it has reached and not yet passed.
        self.rungs: list[tuple[float, dict[str, float]]] = [
            (grace_reports * reduction_factor ** k, {}) for k in reversed(range(count))]

    @property
    def milestones(self) -> list[float]:
        return sorted(milestone for milestone, _ in self.rungs)

    def should_stop(self, trial_id: str, reports: int, train_loss: float) -> bool:
        """Whether the trial stops at its `reports`-th progress report, whose train loss is given."""
        reward = -train_loss  # Ray maximises the negated metric in mode "min"
        for milestone, recorded in self.rungs:
            if reports < milestone or trial_id in recorded:
                continue
            cutoff = np.nanpercentile(list(recorded.values()), (1 - 1 / self.reduction_factor) * 100) \
                if recorded else None
            recorded[trial_id] = reward
            return cutoff is not None and bool(reward < cutoff)
        return False


@dataclass(frozen=True)
class Replay:
    stopped_at: list[int | None]  # per trial, in the order given: the report it is stopped at; None: run to the end
    budget_share: float  # the compute the rule would have spent, as a share of what the trials spent

    @property
    def kept(self) -> list[int]:
        """The indices of the trials that run to the end."""
        return [index for index, stop in enumerate(self.stopped_at) if stop is None]


def replay(curves: Sequence[Mapping[int, float]], costs: Sequence[float], grace_reports: int,
           reduction_factor: float) -> Replay:
    """ASHA's rule replayed on finished trials (their progress curves, {report: train loss}, in
    trial order; `costs`: the compute each spent), to judge other rungs without running a study
    (benchmarks/default_study.py): each trial's reports go, in order, through the very
    `SuccessiveHalving` that the local executor stops trials with. A curve's last report comes before
    the budget's end, so a trial stopped at report m of R spent m/(R+1) of its cost. The controller
    would have drawn other trials after the first stop: this judges the rule on these trials only."""
    reports = max(len(curve) for curve in curves)
    rule = SuccessiveHalving(grace_reports, reduction_factor, reports + 1)
    stopped: list[int | None] = []
    spent = 0.0
    for index, (curve, cost) in enumerate(zip(curves, costs, strict=True)):
        stopped_at = next((report for report in sorted(curve) if rule.should_stop(str(index), report, curve[report])),
                          None)
        spent += cost * (stopped_at / (reports + 1) if stopped_at else 1.0)
        stopped.append(stopped_at)
    return Replay(stopped, spent / sum(costs))
