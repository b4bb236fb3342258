"""One search trial inside a Ray worker: cram the architecture, then probe it on GLUE.

The worker reports to Ray Tune and nothing else: every record (Optuna study, MLflow run) is written
by the driver when it sees these reports (`search.searcher`), so a worker that dies can lose no
record. A trial never raises: an exception becomes a final report with `failed` and its reason,
so one bad architecture costs one trial, not the study.

Reports, in order:
- `budget_fraction`, `mlm_loss` (train), `tokens`, `tokens_per_s` every 1/16 of the budget: the
  rungs on which ASHA compares trials (`training_iteration` counts them);
- one final report with `final=True`: validation MLM loss, probe metrics (`glue.<task>.<metric>`),
  `probe_average`, tokens/s, params, FLOPs/token, and `result` (CramResult + ProbeResult dicts).
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any

from ray import tune

from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.cram import NonFiniteLoss, Progress, cram_with_model
from trainer.data import CorpusSource, prepare_data


def trial_metrics(cram_result: dict, probe_result: dict | None) -> dict[str, float]:
    """The flat numbers of a finished trial: what the controller, ASHA and MLflow read."""
    metrics = {key: float(cram_result[key]) for key in
               ("validation_loss", "tokens", "tokens_per_s", "params", "flops_per_token", "seconds",
                "validation_seconds", "steps")}
    if probe_result is not None:
        metrics["probe_average"] = float(probe_result["average"])
        metrics["probe_seconds"] = float(probe_result["seconds"]["total"])
        for task, values in probe_result["metrics"].items():
            for name, value in values.items():
                metrics[f"glue.{task}.{name}"] = float(value)
    return metrics


def run_trial(spec: dict[str, Any]) -> None:
    """Ray Tune function trainable. `spec` is what `CramnasSearcher.suggest` returned."""
    if spec.get("repeat_of") is not None:  # dedupe: this architecture was trained already
        tune.report({**spec["recorded"], "final": True, "repeat_of": spec["repeat_of"]})
        return
    started = time.perf_counter()
    try:
        final = _cram_and_probe(spec)
    except Exception as error:  # noqa: BLE001 - any failure is this trial's, recorded with its reason
        reason = f"{type(error).__name__}: {error}"
        tune.report({"final": True, "failed": True, "failure_reason": reason[:2000],
                     "traceback": traceback.format_exc()[-4000:], "seconds": time.perf_counter() - started})
        return
    tune.report(final)


def injected_fault(trial_number: int) -> str | None:
    """The fault `CRAMNAS_INJECT_FAULT` asks of this trial, for fault-injection tests and soaks:
    `exception@3,7` raises in trials 3 and 7; `nan@2` makes trial 2's loss NaN; `kill@4` SIGKILLs
    trial 4's worker process."""
    for item in filter(None, os.environ.get("CRAMNAS_INJECT_FAULT", "").split(";")):
        kind, _, numbers = item.partition("@")
        if str(trial_number) in numbers.split(","):
            return kind
    return None


def _cram_and_probe(spec: dict[str, Any]) -> dict[str, Any]:
    import glue  # imported here: workers that only repeat a result never pay for it

    fault = injected_fault(spec["trial_number"])
    if fault == "exception":
        raise RuntimeError(f"injected fault in trial {spec['trial_number']}")
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)

    arch = ArchConfig.from_dict(spec["arch"])
    train = TrainConfig.from_dict(spec["train"])
    source = CorpusSource.from_args(**spec["corpus"])
    data = prepare_data(source, vocab_size=arch.vocab_size, seq_len=arch.max_seq_len,
                        cache_dir=spec.get("cache_dir"))  # prepared by the driver: a cache hit

    def report(progress: Progress) -> None:
        if fault == "nan":
            raise NonFiniteLoss(progress.step, float("nan"))
        tune.report({"budget_fraction": progress.fraction, "mlm_loss": progress.train_loss,
                     "tokens": progress.tokens, "tokens_per_s": progress.tokens_per_s, "final": False})

    model, result = cram_with_model(arch, train, data, Budget.parse(spec["budget"]), on_progress=report)
    probe_result = None
    if spec.get("probe") is not None:
        limits = glue.ProbeLimits(**spec["probe"]["limits"])
        probe_result = glue.probe(model, data.tokenizer_path, spec["probe"]["tasks"], limits).to_dict()
    cram_dict = result.to_dict()
    # `mlm_loss` again, now on validation: ASHA reads it in every report.
    return {**trial_metrics(cram_dict, probe_result), "mlm_loss": result.validation_loss, "final": True,
            "result": {"cram": cram_dict, "probe": probe_result}}
