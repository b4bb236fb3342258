"""Where a validation loss stands among the references of `trainer.references`: one vocabulary of
regimes, read by the trial, MLflow, the live view, the final table and the report. No torch here:
the dashboards read it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.console import floor_gap

# How close to the corruption floor still counts as having learned nothing: the floor of one fixed
# validation mask moves by about this much with the mask's seed (trainer/unigram.py).
PLATEAU_MARGIN = 0.05

# Where a validation loss stands, best last. One table, read by the trial, MLflow, the live view,
# the final table and the report.
REGIMES = {
    "plateau": f"within {PLATEAU_MARGIN} nats of the corruption floor: frequencies and copying, no context",
    "neighbours": "below the corruption floor, above the two-neighbour count model: some context",
    "beyond-ngrams": "below the two-neighbour count model: more than its immediate neighbours",
}


def regime(loss: float, corruption_floor: float, context_reference: float) -> str:
    """Which of `REGIMES` a validation loss is in."""
    if loss > corruption_floor - PLATEAU_MARGIN:
        return "plateau"
    return "neighbours" if loss >= context_reference else "beyond-ngrams"


def regime_of(metrics: Mapping[str, float]) -> str | None:
    """The regime of a recorded result's metrics (`search.study.report.trial_metrics`); None for one
    recorded before the references existed."""
    if not {"validation_loss", "corruption_floor", "context_reference"} <= set(metrics):
        return None
    return regime(metrics["validation_loss"], metrics["corruption_floor"], metrics["context_reference"])


def describe_loss(loss: float, unigram: float, corruption: float, context: float) -> str:
    """One line that reads a validation loss against its three references."""
    return (f"regime {regime(loss, corruption, context)}: {floor_gap(corruption - loss)} the corruption floor "
            f"{corruption:.3f} (frequencies + copying; unigram floor {unigram:.3f}), "
            f"{floor_gap(context - loss)} the two-neighbour count model {context:.3f}")
