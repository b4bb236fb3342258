"""The eight GLUE tasks of BERT and Cramming, their official metrics and the GLUE average.

WNLI is left out, as BERT (Devlin et al. 2019) and Cramming (Geiping & Goldstein 2022) leave it out.

Metrics (scikit-learn / scipy), as the GLUE benchmark defines them; values are fractions
(accuracy 0.853, not 85.3), tables show them x 100:

    CoLA    Matthews correlation               SST-2, QNLI, RTE   accuracy
    MRPC    F1 (of class 1) and accuracy       QQP                F1 (of class 1) and accuracy
    STS-B   Pearson and Spearman correlation   MNLI               accuracy, matched and mismatched

The GLUE average, as BERT reports it and Cramming's tables (same columns, MNLI as m/mm) follow:
the mean of one *main score* per column, where MNLI has two columns, matched and mismatched, each
a full member of the mean. With all eight tasks that is a mean of 9 numbers. (Check: BERT-base's
row in Devlin et al., Table 1, is 84.6/83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4 -> 716.4 / 9
= 79.6, the "Average" it prints; with MNLI-m alone it would be 79.1.) The main score per column:

    CoLA Matthews, SST-2/QNLI/RTE/MNLI-m/MNLI-mm accuracy, MRPC F1, QQP F1, STS-B Pearson.

Where the choice is Cramming's: its evaluation configs (cramming/config/eval/tasks/*.yaml) set
`target_metrics: [f1]` for QQP and `[pearson]` for STS-B (BERT's table shows Spearman); its MRPC
file sets none, and we take F1 as for QQP and as BERT does. All metrics of a task are always
computed and reported; only the main one enters the average. Our average is taken over the
entries actually run: a probe of five tasks averages five numbers, and every output says over
which entries, so a partial average is never mistaken for Cramming's 9-entry one.

A correlation of a constant prediction is undefined (scipy returns NaN); we score it 0.0, what a
predictor without information deserves, so that a degenerate fine-tuning run gives a number the
search can rank rather than a NaN that poisons an average.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from space.errors import CramnasError


class GlueError(CramnasError):
    """Bad GLUE input (unknown task, missing data, mismatched tokenizer); the message names the fix."""


# ---------------------------------------------------------------------------------------------
# Metrics: (labels, predictions) -> float. Predictions are class ids, or floats for regression.
# ---------------------------------------------------------------------------------------------


def accuracy(labels, predictions) -> float:
    return float(accuracy_score(labels, predictions))


def f1(labels, predictions) -> float:
    # zero_division=0: a run that never predicts class 1 scores 0, without a warning.
    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def matthews(labels, predictions) -> float:
    return float(matthews_corrcoef(labels, predictions))


def _is_constant(values) -> bool:
    values = np.asarray(values)
    return len(values) < 2 or bool(np.all(values == values[0]))


def pearson(labels, predictions) -> float:
    if _is_constant(labels) or _is_constant(predictions):
        return 0.0
    return float(stats.pearsonr(labels, predictions).statistic)


def spearman(labels, predictions) -> float:
    if _is_constant(labels) or _is_constant(predictions):
        return 0.0
    return float(stats.spearmanr(labels, predictions).statistic)


METRICS: dict[str, Callable[..., float]] = {
    "matthews": matthews,
    "accuracy": accuracy,
    "f1": f1,
    "pearson": pearson,
    "spearman": spearman,
}

# The range each metric lives in: accuracy and F1 in [0, 1], correlations in [-1, 1].
METRIC_RANGES = {"matthews": (-1.0, 1.0), "accuracy": (0.0, 1.0), "f1": (0.0, 1.0),
                 "pearson": (-1.0, 1.0), "spearman": (-1.0, 1.0)}

# ---------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    name: str  # our key; also the config name in the hub dataset nyu-mll/glue
    text_columns: tuple[str, ...]  # one column (single sentence) or two (a pair)
    num_labels: int  # 1 = regression
    metrics: tuple[str, ...]  # all computed; the first is the main score
    # One entry (a column of the GLUE table) per validation split: MNLI has two.
    entries: tuple[tuple[str, str], ...] = ()  # (entry name, validation split); default (name, "validation")

    def __post_init__(self) -> None:
        if not self.entries:
            object.__setattr__(self, "entries", ((self.name, "validation"),))

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def validation_splits(self) -> tuple[str, ...]:
        return tuple(split for _, split in self.entries)

    def compute_metrics(self, labels, predictions) -> dict[str, float]:
        return {name: METRICS[name](labels, predictions) for name in self.metrics}


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("cola", ("sentence",), 2, ("matthews",)),
        Task("sst2", ("sentence",), 2, ("accuracy",)),
        Task("mrpc", ("sentence1", "sentence2"), 2, ("f1", "accuracy")),
        Task("qqp", ("question1", "question2"), 2, ("f1", "accuracy")),
        Task("stsb", ("sentence1", "sentence2"), 1, ("pearson", "spearman")),
        Task("mnli", ("premise", "hypothesis"), 3, ("accuracy",),
             entries=(("mnli-m", "validation_matched"), ("mnli-mm", "validation_mismatched"))),
        Task("qnli", ("question", "sentence"), 2, ("accuracy",)),
        Task("rte", ("sentence1", "sentence2"), 2, ("accuracy",)),
    )
}

# Every column of Cramming's GLUE table, in the order it prints them.
ALL_ENTRIES = ("mnli-m", "mnli-mm", "sst2", "stsb", "rte", "qnli", "qqp", "mrpc", "cola")


def get_task(name: str) -> Task:
    key = name.strip().lower().replace("-", "")
    if key not in TASKS:
        hint = " (WNLI is excluded, as in BERT and Cramming)" if key == "wnli" else ""
        raise GlueError(f"unknown GLUE task {name!r}{hint}; choose from {', '.join(TASKS)}")
    return TASKS[key]


def glue_average(scores: dict[str, float]) -> float:
    """Mean of the main scores of the entries given (entry name -> main score)."""
    if not scores:
        return math.nan
    return float(np.mean(list(scores.values())))


def describe_average(entries: Iterable[str]) -> str:
    """Say over which entries an average was taken, and how that compares with Cramming's."""
    entries = list(entries)
    if sorted(entries) == sorted(ALL_ENTRIES):
        return "GLUE average over all 9 entries (MNLI-m and MNLI-mm count separately), as Cramming reports it"
    return (f"average over {len(entries)} of the 9 GLUE entries ({', '.join(entries)}); "
            "not comparable with Cramming's 9-entry GLUE average")
