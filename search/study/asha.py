"""Asynchronous successive halving over a trial's progress reports, without Ray: the early stopping
of `search.run --executor local`, deciding exactly as Ray Tune's `ASHAScheduler` with one bracket
decides for the Ray executor (`search.study.ray_executor.early_stopping`; tests/test_local_executor.py
feeds both the same reports).

The rungs are `grace_reports` x `reduction_factor`^k reports, below `max_reports` (the milestones
Ray derives from its `max_t`). The first time a trial's report count reaches a rung, its train loss
is recorded there, and the trial is stopped if it is worse than the best 1/`reduction_factor` of
the losses recorded at that rung before it (Ray's cutoff: a percentile of the negated losses,
kept here so that ties and interpolation agree)."""

from __future__ import annotations

import math

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
