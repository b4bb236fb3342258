"""The trial's way back, typed: what a worker reports to Ray Tune and what the driver reads back.

`search.study.spec.TrialSpec` types the way out (driver -> worker); this module types the way back.
A worker (`search.study.trial`) sends `ProgressReport.to_tune()` at each rung and one
`TrialReport.to_tune()` at its end; the driver (`search.study.searcher`) reads every result Ray hands it
with `from_tune`, which is the one place that knows which keys are Ray's bookkeeping and how Ray
flattens nested results (`result/cram/seconds`).

The flat dict is the record's format, not only the wire's: its metric keys become the MLflow
metric names and the Optuna user attribute `metrics` (`search.base.attrs.METRICS`), which a repeat of the
architecture reports again (`TrialSpec.recorded`), so its keys never change.

Kept free of torch and Ray, like `search.study.spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ASHA_METRIC = "train_loss"  # what ASHA compares trials on (lower is better): the progress reports' train loss

# Keys Ray Tune adds to every result it hands the searcher: never a trial's metric. Ray's copy of
# the trial spec (`config/...`) is flattened under a "/" and left out with every other nested key.
RAY_KEYS = frozenset({"trial_id", "done", "pid", "timestamp", "time_this_iter_s", "time_total_s",
                      "time_since_restore", "iterations_since_restore", "training_iteration"})
# The report's own flags, beside the metrics in the flat dict.
FINAL, FAILED, REASON, TRACEBACK = "final", "failed", "failure_reason", "traceback"
CHECKPOINT_PATH, GPU_PEAK_GB, RESULT = "checkpoint_path", "gpu_peak_gb", "result"

_CRAM_METRICS = ("validation_loss", "unigram_floor", "nats_below_unigram", "corruption_floor", "nats_below_floor",
                 "context_reference", "tokens", "tokens_per_s", "params", "flops_per_token", "seconds",
                 "validation_seconds", "steps", "oom_halvings")


def trial_metrics(cram_result: Mapping[str, Any], probe_result: Mapping[str, Any] | None) -> dict[str, float]:
    """The flat numbers of a finished cram (a `CramResult` dict) and probe (a `ProbeResult` dict or
    None): what the controller and MLflow read, for trials and `search.confirm` alike."""
    metrics = {key: float(cram_result[key]) for key in _CRAM_METRICS}
    for kind, loss in cram_result["validation_loss_by_kind"].items():  # at [MASK], random and unchanged positions
        metrics[f"validation_loss.{kind}"] = float(loss)
    metrics["rollbacks"] = float(len(cram_result.get("rollbacks", [])))  # diverged steps undone (trainer/rollback.py)
    if probe_result is not None:
        metrics["probe_average"] = float(probe_result["average"])
        metrics["probe_seconds"] = float(probe_result["seconds"]["total"])
        for task, values in probe_result["metrics"].items():
            for name, value in values.items():
                metrics[f"glue.{task}.{name}"] = float(value)
    return metrics


@dataclass(frozen=True)
class ProgressReport:
    """One rung: `ASHA_METRIC` (the train loss) at a fraction of the budget, before its end."""

    budget_fraction: float
    train_loss: float
    tokens: int
    tokens_per_s: float

    def to_tune(self) -> dict[str, Any]:
        return {"budget_fraction": self.budget_fraction, ASHA_METRIC: self.train_loss, "tokens": self.tokens,
                "tokens_per_s": self.tokens_per_s, FINAL: False}

    @classmethod
    def from_tune(cls, result: Mapping[str, Any]) -> ProgressReport:
        return cls(float(result["budget_fraction"]), float(result[ASHA_METRIC]), int(result["tokens"]),
                   float(result["tokens_per_s"]))

    def series(self) -> dict[str, float]:
        """The points MLflow logs at step = `tokens` (`StudyTracker.log_progress`)."""
        return {ASHA_METRIC: self.train_loss, "tokens_per_s": self.tokens_per_s, "budget_fraction": self.budget_fraction}

    def last_metrics(self) -> dict[str, float]:
        """What a trial that ended on this report (ASHA pruned it) records as its final metrics: the
        train loss is left out, a series `series` has logged already."""
        return {"budget_fraction": self.budget_fraction, "tokens": float(self.tokens), "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class TrialReport:
    """A trial's last report: its metrics, or why it failed.

    `result` holds the `CramResult` and `ProbeResult` dicts and where the trial ran, written as the
    run's result.json; `checkpoint_path` where the worker wrote the model (`--save-checkpoints`);
    `gpu_peak_gb` the trial's peak CUDA memory (None on the CPU)."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    failed: bool = False
    reason: str | None = None
    traceback: str | None = None
    result: Mapping[str, Any] = field(default_factory=dict)
    checkpoint_path: str | None = None
    gpu_peak_gb: float | None = None

    @classmethod
    def failure(cls, reason: str, traceback: str, seconds: float) -> TrialReport:
        # Cut to what an MLflow tag and a readable artifact hold: a repr can be megabytes.
        return cls({"seconds": seconds}, failed=True, reason=reason[:2000], traceback=traceback[-4000:])

    @classmethod
    def repeat(cls, recorded: Mapping[str, float]) -> TrialReport:
        """A repeat's report: the original trial's recorded metrics (`recorded_metrics`), told again."""
        return cls.from_tune({**recorded, FINAL: True})

    def recorded_metrics(self) -> dict[str, float]:
        """The metrics Optuna and MLflow record: `metrics` and the GPU peak, when there was one."""
        peak = {} if self.gpu_peak_gb is None else {GPU_PEAK_GB: self.gpu_peak_gb}
        return {**self.metrics, **peak}

    def to_tune(self) -> dict[str, Any]:
        flat: dict[str, Any] = {**self.recorded_metrics(), FINAL: True}
        if self.failed:
            flat.update({FAILED: True, REASON: self.reason, TRACEBACK: self.traceback})
        if self.result:
            flat[RESULT] = dict(self.result)
        if self.checkpoint_path is not None:
            flat[CHECKPOINT_PATH] = self.checkpoint_path
        return flat

    @classmethod
    def from_tune(cls, result: Mapping[str, Any]) -> TrialReport:
        # A failure without a reason is still a failure: "unknown" says the worker gave none.
        failed = bool(result.get(FAILED))
        nested = result.get(RESULT)
        return cls(metrics=_metrics(result), failed=failed, reason=result.get(REASON, "unknown") if failed else None,
                   traceback=result.get(TRACEBACK),
                   result=nested if isinstance(nested, Mapping) else _unflatten(result, RESULT + "/"),
                   checkpoint_path=result.get(CHECKPOINT_PATH),
                   gpu_peak_gb=None if result.get(GPU_PEAK_GB) is None else float(result[GPU_PEAK_GB]))


def from_tune(result: Mapping[str, Any] | None) -> ProgressReport | TrialReport | None:
    """Any result Ray hands the searcher, as the report the worker sent; None for a result with no
    report in it (Ray's bookkeeping alone, or none: a trial that ended before its first report)."""
    if not result:
        return None
    if result.get(FINAL):
        return TrialReport.from_tune(result)
    return ProgressReport.from_tune(result) if ASHA_METRIC in result else None


# Keys of the flat dict that are no metric, though some hold numbers.
_NOT_METRICS = RAY_KEYS | {FINAL, FAILED, GPU_PEAK_GB}


def _metrics(result: Mapping[str, Any]) -> dict[str, float]:
    return {key: float(value) for key, value in result.items()
            if key not in _NOT_METRICS and "/" not in key
            and isinstance(value, (int, float)) and not isinstance(value, bool)}


def _unflatten(flat: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Ray hands searchers flattened results (`result/cram/seconds`): the nested dict under `prefix`."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if key.startswith(prefix):
            *parents, leaf = key[len(prefix):].split("/")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return nested
