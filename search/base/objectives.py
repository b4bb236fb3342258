"""What a study optimises, once: `OBJECTIVES` is the table every reader ranks by.

The controller tells Optuna `Objective.values` (one per direction); everything that ranks trials
afterwards (the terminal view, `search.export`, `search.confirm`, the study report) ranks by the
objective's first metric, `rank_metric`, in its first direction: the GLUE probe score for `probe`
and `probe+throughput`, the validation MLM loss for `mlm`. An objective added here is searched,
exported, confirmed and reported by its own metric without another edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from space.errors import CramnasError


@dataclass(frozen=True)
class Objective:
    """Trial metrics by key, one direction each; ranked by the first, called `label` for people."""

    name: str
    metrics: tuple[str, ...]
    directions: tuple[str, ...]  # "maximize" or "minimize", Optuna's words
    label: str  # what `rank_metric` is, in words
    needs_probe: bool = False  # a metric comes from the GLUE probe: the study cannot run with --no-probe
    # Its only value is an MLM loss, minimised: on the scale of the train losses Optuna holds as a
    # trial's intermediate values, so a pruned trial's last one may stand in for its value.
    mlm_loss: bool = False

    @property
    def multi(self) -> bool:
        return len(self.directions) > 1

    @property
    def rank_metric(self) -> str:
        """The trial metric trials are ranked by (the first objective)."""
        return self.metrics[0]

    @property
    def higher_is_better(self) -> bool:
        return self.directions[0] == "maximize"

    def values(self, metrics: dict[str, Any]) -> list[float]:
        missing = [key for key in self.metrics if key not in metrics]
        if missing:
            raise ValueError(f"objective {self.name}: the trial reported no {', '.join(missing)} "
                             f"(it reported {', '.join(sorted(metrics)) or 'nothing'})")
        return [float(metrics[key]) for key in self.metrics]

    def sort_key(self, value: float) -> float:
        """Sorting by this key puts the best value first."""
        return -value if self.higher_is_better else value


# Metric keys: `validation_loss` and `tokens_per_s` as trainer.cram.CramResult names them,
# `probe_average` for glue's ProbeResult.average.
OBJECTIVES: dict[str, Objective] = {
    "probe": Objective("probe", ("probe_average",), ("maximize",), "probe average (GLUE)", needs_probe=True),
    "mlm": Objective("mlm", ("validation_loss",), ("minimize",), "validation MLM loss", mlm_loss=True),
    "probe+throughput": Objective("probe+throughput", ("probe_average", "tokens_per_s"),
                                  ("maximize", "maximize"), "probe average (GLUE)", needs_probe=True),
}


# What a study that recorded no objective (or one this version does not know) is ranked by.
DEFAULT_OBJECTIVE = "probe"


def objective_named(name: str | None, flag: str = "--objective") -> Objective:
    """`OBJECTIVES[name]`, or a one-line CramnasError naming `flag` and what is allowed."""
    if name not in OBJECTIVES:
        raise CramnasError(f"{flag}: unknown objective {name!r}; allowed: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
