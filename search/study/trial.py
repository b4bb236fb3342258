"""One search trial in its worker: cram the architecture, then probe it on GLUE. The worker is a
Ray worker (`search.study.ray_executor`) or a process of the driver's own (`search.study.local_executor`);
either hands `execute_trial` its way to report and where the trial was placed.

The worker reports to its executor and nothing else: every record (Optuna study, MLflow run) is
written by the driver when it sees these reports (`search.study.searcher`), so a worker that dies can lose no
record. A trial never raises: an exception becomes a final report with `failed` and its reason,
so one bad architecture costs one trial, not the study.

Reports, in order (typed in `search.study.report`, which the driver reads them back with):
- `budget_fraction`, `train_loss`, `tokens`, `tokens_per_s` at each 1/16 of the budget before its
  end (15 at most): the rungs on which ASHA compares trials by their train loss (`ASHA_METRIC`;
  `training_iteration` counts them; `search.study.ray_executor.early_stopping`). None comes at the end of the
  budget, so a trial ASHA stops has budget left, and one that spends it is validated and probed;
- one final report with `final=True`: `validation_loss` and its parts by corruption kind
  (`validation_loss.mask`, `.random`, `.unchanged`), the references it is read against
  (`unigram_floor`, `corruption_floor`, `context_reference`; trainer/references.py) with
  `nats_below_unigram` and `nats_below_floor`, probe metrics
  (`glue.<task>.<metric>`), `probe_average`, tokens/s, params, FLOPs/token, `oom_halvings`, and `result` (CramResult +
  ProbeResult dicts); with `checkpoint_dir` in the spec (`search.run --save-checkpoints`), also
  `checkpoint_path`, where the worker wrote the trained model (`<checkpoint_dir>/t0007/`). It has
  no `train_loss`, so ASHA never compares a validation loss with train losses. `result.data` says
  where the trial found the prepared data (`source`: "cache" or "shipped", see `ShippedData`) and
  on which Ray node it ran (`node`).

`CRAMNAS_INJECT_FAULT` injects faults into chosen trials, for the fault-injection suite
(`tests/reliability/`) and soaks: see `parse_faults`.
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from search.study.report import ProgressReport, TrialReport, trial_metrics
from search.study.spec import Probe, TrialSpec
from space.arch import ArchConfig
from space.errors import CramnasError
from trainer.budget import Budget
from trainer.cache import cache_root
from trainer.checkpoint import save_checkpoint
from trainer.config import TrainConfig
from trainer.cram import NonFiniteLoss, Progress, cram_with_model
from trainer.data import PretrainData, open_prepared


@dataclass(frozen=True)
class Placement:
    """Where the executor put a trial: the CPUs it reserved (None: not counted), the GPUs it gave
    (ids as the executor names them), the node (Ray's id; None on the driver's machine)."""

    cpus: float | None = None
    gpu_ids: tuple[str, ...] = ()
    node: str | None = None


@dataclass(frozen=True)
class ShippedData:
    """The driver's prepared data (`trainer.data.entry_files`) in Ray's object store, put there once
    per study on a cluster (`search.study.driver`). This wrapper, not the data, is what every trial gets
    (`tune.with_parameters` would fetch a bare reference for each): only a trial on a node whose
    cache lacks the entry fetches it, and writes it there for the node's later trials."""

    ref: Any  # a ray.ObjectRef: Ray is imported only by the Ray executor

    def fetch(self) -> dict:
        import ray

        return ray.get(self.ref)


def compile_env(cpus: float | None, cache_dir: str | None) -> dict[str, str]:
    """Inductor's settings for a trial on this node: as many compile workers as the trial has CPUs
    (unset, Inductor starts min(32, cores) in every trial, each trial's workers contending for the
    node's cores), and one on-disk cache per node under the cramnas cache root
    (`trainer.cache.cache_root`), shared by its trials and kept across reboots, unlike /tmp: a
    trial whose blocks another trial compiled reads the kernels instead of generating them."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache_root(cache_dir) / "inductor")}
    if cpus:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, int(cpus)))
    return env


def use_compile_env(env: dict[str, str]) -> None:
    """Set `compile_env`'s variables in this process. Inductor reads the thread count when its
    config is imported, which importing this module already did: set there too."""
    import torch._inductor.config as inductor_config

    os.environ.update(env)
    if "TORCHINDUCTOR_COMPILE_THREADS" in env:
        inductor_config.compile_threads = int(env["TORCHINDUCTOR_COMPILE_THREADS"])


def execute_trial(config: dict[str, Any], report: Callable[[dict[str, Any]], None],
                  placement: Placement = Placement(), shipped: ShippedData | None = None) -> None:
    """Run the trial `config` describes (the `TrialSpec.to_dict()` `CramnasSearcher.suggest`
    returned), sending its reports through `report`, which may stop it by raising (an executor's
    early stopping): `shipped` is the driver's data on a cluster (None: every trial shares the
    driver's cache)."""
    spec = TrialSpec.from_dict(config)
    use_compile_env(compile_env(placement.cpus, spec.cache_dir))  # before anything compiles
    if spec.repeat_of is not None:  # dedupe: this architecture was trained already
        report(TrialReport.repeat(spec.recorded).to_tune())
        return
    started = time.perf_counter()
    try:
        final = _train_and_report(spec, report, placement, shipped)
    except Exception as error:  # noqa: BLE001 - any failure is this trial's, recorded with its reason
        report(TrialReport.failure(f"{type(error).__name__}: {error}", traceback.format_exc(),
                                   time.perf_counter() - started).to_tune())
        return
    finally:  # also when early stopping ends the trial, by raising inside one of its reports
        hand_back_memory()
    report(final.to_tune())


def hand_back_memory() -> None:
    """Free the trial's model and cached GPU memory before this reused worker takes its next trial,
    or before another trial's share of the GPU (fractional GPUs) needs it. An exception on its way
    out (ASHA's stop) holds the trial's frames in its traceback, and with them the model: their
    variables are cleared first. A CPU trial does not initialise CUDA to empty a cache it never had."""
    stopping = sys.exception()
    if stopping is not None:
        traceback.clear_frames(stopping.__traceback__)
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# The faults `CRAMNAS_INJECT_FAULT` can inject, each into the trials it names.
FAULT_KINDS = {
    "exception": "raises RuntimeError before training: the trial fails with that reason",
    "nan": "the training loss turns NaN at the trial's first progress report (NonFiniteLoss)",
    "kill": "SIGKILLs the trial's worker process before training: Ray reports the trial's worker dead",
    "oom": "a simulated CUDA out-of-memory for any forward pass of more than half the micro-batch: "
           "the micro-batch halves once and training goes on (oom_halvings = 1)",
    "diskfull": "the checkpoint write (search.run --save-checkpoints) fails with ENOSPC once the weights' "
                "temporary file is on disk: the trial fails, no model.safetensors is left",
}


def parse_faults(text: str) -> dict[int, frozenset[str]]:
    """`kind@n,m;kind@n` (kinds: `FAULT_KINDS`) as trial number -> kinds; e.g. `exception@1,5;oom@3;
    diskfull@3` raises in trials 1 and 5 and gives trial 3 an out-of-memory and a full disk.
    CramnasError naming the bad item."""
    faults: dict[int, set[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, at, numbers = item.partition("@")
        trials = [number.strip() for number in numbers.split(",")]
        if kind not in FAULT_KINDS or not at or not all(number.isdigit() for number in trials):
            raise CramnasError(f"CRAMNAS_INJECT_FAULT: {item!r} is not kind@n[,m...] with kind one of "
                             f"{', '.join(FAULT_KINDS)} and n a trial number")
        for number in trials:
            faults.setdefault(int(number), set()).add(kind)
    return {number: frozenset(kinds) for number, kinds in faults.items()}


def injected_faults(trial_number: int) -> frozenset[str]:
    """The faults `CRAMNAS_INJECT_FAULT` asks of this trial (empty when unset)."""
    return parse_faults(os.environ.get("CRAMNAS_INJECT_FAULT", "")).get(trial_number, frozenset())


def trial_device(gpu_ids: tuple[str, ...] | list[str]) -> torch.device:
    """CUDA only when the executor gave this trial GPUs, and then the trial's own: Ray sets
    CUDA_VISIBLE_DEVICES to them, the local executor makes the first the current device. Otherwise
    the CPU, even on a GPU host: Ray 2.6x no longer hides the GPUs from a worker that asked for
    none, so `trainer.device.pick_device` would take GPU 0."""
    if gpu_ids and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def cram_and_probe(arch: ArchConfig, train: TrainConfig, data: PretrainData, budget: Budget,
                   probe: Probe | None, on_progress: Callable[[Progress], None] | None = None,
                   *, save_to: Path | None = None, before_forward: Callable[[int], None] | None = None,
                   after_write: Callable[[Path], None] | None = None, device: torch.device | None = None,
                   ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Cram `arch`, then probe it on GLUE when `probe` is given: the `CramResult` and `ProbeResult`
    dicts. A trial and `search.confirm` share it.
    `save_to`: write the trained model there (`trainer.checkpoint.save_checkpoint`) before the
    probe; `before_forward` and `after_write` are fault-injection hooks of `cram` and
    `save_checkpoint`; `device`: where to train and probe (default `trainer.device.pick_device`)."""
    import glue  # imported here: workers that only repeat a result never pay for it

    model, result = cram_with_model(arch, train, data, budget, on_progress=on_progress,
                                    before_forward=before_forward, device=device)
    if save_to is not None:
        result.checkpoint = str(save_to)
        save_checkpoint(save_to, model, arch, train, data.tokenizer_path, result.to_dict(), after_write)
    probe_result = None
    if probe is not None:
        limits = glue.ProbeLimits(**probe.limits)
        probe_result = glue.probe(model, data.tokenizer_path, list(probe.tasks), limits, device=device).to_dict()
    return result.to_dict(), probe_result


def _train_and_report(spec: TrialSpec, send: Callable[[dict[str, Any]], None], placement: Placement,
                      shipped: ShippedData | None) -> TrialReport:
    """A trial's cram and probe, with its progress reports and injected faults: the final report."""
    number = spec.trial_number
    faults = injected_faults(number)
    if "exception" in faults:
        raise RuntimeError(f"injected fault in trial {number}")
    if "kill" in faults:
        os.kill(os.getpid(), signal.SIGKILL)

    arch, train = spec.arch, spec.train
    # Prepared by the driver: opened by its fingerprint, never tokenised again here (no corpus needed).
    data, data_source = open_prepared(spec.data_fingerprint, spec.cache_dir, shipped.fetch if shipped else None)

    def report(progress: Progress) -> None:
        if "nan" in faults:
            raise NonFiniteLoss(progress.step, float("nan"))
        send(ProgressReport(progress.fraction, progress.train_loss, progress.tokens, progress.tokens_per_s).to_tune())

    def out_of_memory(rows: int) -> None:  # "oom": memory for half the micro-batch only
        if rows > max(1, train.micro_batch // 2):
            raise torch.OutOfMemoryError(f"injected: {rows} rows do not fit (trial {number})")

    def full_disk(path: Path) -> None:  # "diskfull": no room for the weights
        if path.name.startswith(".model.safetensors"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    save_to = spec.checkpoint_path()
    gpu_ids = list(placement.gpu_ids)
    device = trial_device(gpu_ids)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cram_dict, probe_result = cram_and_probe(
        arch, train, data, spec.budget, spec.probe, on_progress=report, save_to=save_to,
        before_forward=out_of_memory if "oom" in faults else None,
        after_write=full_disk if "diskfull" in faults else None, device=device)
    return TrialReport(
        trial_metrics(cram_dict, probe_result),
        result={"cram": cram_dict, "probe": probe_result, "gpu_ids": gpu_ids,
                "data": {"source": data_source, "node": placement.node}},
        checkpoint_path=None if save_to is None else str(save_to),
        gpu_peak_gb=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None)
