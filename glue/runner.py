"""Run GLUE fine-tuning on a crammed encoder: the quick probe of every search trial, and the core
that the full evaluation (`glue.evaluate`, Cramming's GLUE_sane) shares with it.

    from glue import probe, ProbeLimits
    result = probe("runs/crammed-bert-cpu-60s", limits=ProbeLimits(data_dir="../shared/data"))
    result = probe(model, tokenizer_path)      # an in-memory CrammedBert and its tokenizer.json
    result.average, result.scores, result.to_dict()

The probe's defaults and why:
- Tasks: SST-2, STS-B, MRPC, CoLA, RTE: all GLUE tasks whose train and validation splits are
  present in the shared data (QNLI has no train split; MNLI and QQP are absent), covering the kinds
  of GLUE task (sentiment, similarity regression, paraphrase, acceptability, entailment).
- At most 2,000 training examples and 8 s of training per task, one pass, batch 16: a
  4-layer/256-wide model probes all five tasks in under a minute on 2 idle CPU cores
  (benchmarks/RESULTS.md). Full validation sets, so scores are comparable across trials.
- lr 1e-3 and mean pooling, where GLUE_sane has 4e-5 and the first token: a probe takes 30-125
  steps where GLUE_sane takes thousands. At lr 1e-4 (batch 32) 1- and 5-minute CPU crams stayed at the
  constant-predictor scores on every task (SST-2 ~50%, MRPC F1 81.2 = all positive, CoLA MCC 0);
  at 1e-3 SST-2 reaches ~71% in 125 steps with either pooling (3e-3: 58%). Mean pooling (Cramming's
  architecture default) was a little ahead after 63 steps, where the time cap leaves most tasks.
- The same seed draws the same training subset and order, so trials differ by their encoder only,
  up to the time cap: a slow encoder (or a busy machine) trains on fewer examples, cramming's own
  rule, which also makes time-capped probe scores depend on the machine's load.

Everything that can fail on bad input (unknown task, missing data, a checkpoint that does not
load, a tokenizer of the wrong size) fails before the first fine-tuning step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tokenizers import Tokenizer

from glue.data import encode_split, load_splits, pad_id, prepare_tokenizer, resolve_tasks, subsample
from glue.finetune import FinetuneSettings, RunResult, finetune
from glue.tasks import GlueError, describe_average, glue_average
from trainer.checkpoint import load_checkpoint
from trainer.config import ConfigError
from trainer.console import count, eta
from trainer.device import device_name, pick_device
from trainer.model import CrammedBert

DEFAULT_PROBE_TASKS = ("sst2", "stsb", "mrpc", "cola", "rte")


@dataclass(frozen=True)
class ProbeLimits:
    """How much fine-tuning a probe may spend per task, and on what data."""

    max_train_examples: int | None = 2000
    max_seconds_per_task: float | None = 8.0  # training only; evaluation on the full dev set comes on top
    epochs: int = 1
    batch_size: int = 16
    lr: float = 1e-3
    seed: int = 0
    data_dir: str | os.PathLike | None = None  # None: the hub dataset nyu-mll/glue
    pooling: str = "mean"

    def settings(self) -> FinetuneSettings:
        return FinetuneSettings(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                max_train_examples=self.max_train_examples,
                                max_seconds_per_task=self.max_seconds_per_task, pooling=self.pooling)


@dataclass
class ProbeResult:
    """GLUE scores of one encoder: a probe, or a full evaluation (`protocol` says which).

    With several seeds every metric is the median over the seeds; `runs` keeps each run.
    """

    protocol: str
    tasks: list[str]
    metrics: dict[str, dict[str, float]]  # entry -> metric -> value (fractions, not percent)
    scores: dict[str, float]  # entry -> main score (see glue.tasks)
    average: float  # mean of `scores`
    average_over: str  # which entries the average covers, in words
    seeds: list[int]
    train_examples: dict[str, int]  # task -> training examples available after the cap
    seconds: dict[str, float]  # task -> wall seconds of all its runs; "total" includes loading data
    settings: dict
    device: str
    runs: dict[str, list[dict]] = field(default_factory=dict)  # task -> one record per seed

    def to_dict(self) -> dict:
        return asdict(self)


def load_encoder(encoder_or_checkpoint: CrammedBert | str | os.PathLike,
                 tokenizer: str | os.PathLike | Tokenizer | None) -> tuple[CrammedBert, str | os.PathLike | Tokenizer]:
    """(model, tokenizer) from a checkpoint directory, or an in-memory model and its tokenizer."""
    if isinstance(encoder_or_checkpoint, CrammedBert):
        if tokenizer is None:
            raise GlueError("an in-memory model needs its tokenizer: probe(model, tokenizer_json_path)")
        return encoder_or_checkpoint, tokenizer
    try:
        model, tokenizer_path = load_checkpoint(encoder_or_checkpoint)
    except ConfigError as error:
        raise GlueError(str(error)) from None
    return model, tokenizer if tokenizer is not None else tokenizer_path


def run_glue(encoder_or_checkpoint: CrammedBert | str | os.PathLike, tokenizer: str | os.PathLike | Tokenizer | None,
             tasks: str | Iterable[str], settings: FinetuneSettings, seeds: Iterable[int], protocol: str,
             data_dir: str | os.PathLike | None = None, report: Callable[[str], None] | None = None,
             device: torch.device | None = None) -> ProbeResult:
    """Fine-tune on each task once per seed and score it; medians over seeds. `device`: where to
    fine-tune (default: CUDA when there is one; a search trial passes the device Ray gave it)."""
    start = time.perf_counter()
    seeds = list(seeds)
    if not seeds:
        raise GlueError("no fine-tuning seed given; use at least one (--seeds 1)")
    model, tokenizer = load_encoder(encoder_or_checkpoint, tokenizer)
    arch = model.arch
    tasks = resolve_tasks(tasks, data_dir)
    tokenizer = prepare_tokenizer(tokenizer, arch.vocab_size, min(settings.max_length, arch.max_seq_len))
    pad = pad_id(tokenizer)
    # Load and tokenise every task first: missing or malformed data fails before any training.
    prepared = {}
    for task in tasks:
        splits = load_splits(task, data_dir)
        train = subsample(splits["train"], settings.max_train_examples, seeds[0])
        if not len(train):
            raise GlueError(f"task {task.name}: the train split is empty")
        prepared[task.name] = (encode_split(tokenizer, task, train),
                               {entry: encode_split(tokenizer, task, splits[split]) for entry, split in task.entries})
    device = device or pick_device()
    state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}

    metrics, scores, seconds, runs = {}, {}, {}, {}
    total_runs, finetuning_start = len(tasks) * len(seeds), time.perf_counter()
    if report is not None:
        report(f"fine-tuning {count(len(tasks), 'task')} x {count(len(seeds), 'seed')} = {count(total_runs, 'run')} "
               f"on {device_name(device)}")
    for task in tasks:
        train, validation = prepared[task.name]
        task_start = time.perf_counter()
        results: list[RunResult] = []
        if report is not None:  # a GLUE_sane task can take minutes per seed: say which one is under way
            report(f"{task.name}: fine-tuning on {len(train):,} examples ...")
        for seed in seeds:
            results.append(finetune(state, arch, task, train, validation, settings, seed, pad, device))
            if report is not None:
                shown = ", ".join(f"{entry} {name} {value:.4f}" for entry, values in results[-1].metrics.items()
                                  for name, value in values.items())
                done = sum(len(run) for run in runs.values()) + len(results)
                report(f"{task.name} seed {seed}: {shown} ({results[-1].steps} steps, "
                       f"{results[-1].train_seconds + results[-1].eval_seconds:.1f} s) [{done}/{total_runs} runs, "
                       f"{eta(time.perf_counter() - finetuning_start, done, total_runs)}]")
        seconds[task.name] = time.perf_counter() - task_start
        runs[task.name] = [asdict(result) for result in results]
        for entry, _ in task.entries:
            metrics[entry] = {name: float(np.median([r.metrics[entry][name] for r in results]))
                              for name in task.metrics}
            scores[entry] = metrics[entry][task.main_metric]
    seconds["total"] = time.perf_counter() - start
    return ProbeResult(
        protocol=protocol, tasks=[task.name for task in tasks], metrics=metrics, scores=scores,
        average=glue_average(scores), average_over=describe_average(scores), seeds=seeds,
        train_examples={name: len(train) for name, (train, _) in prepared.items()}, seconds=seconds,
        settings=settings.to_dict(), device=device_name(device), runs=runs,
    )


def probe(encoder_or_checkpoint: CrammedBert | str | os.PathLike,
          tokenizer: str | os.PathLike | Tokenizer | None = None, tasks: str | Iterable[str] = DEFAULT_PROBE_TASKS,
          limits: ProbeLimits = ProbeLimits(), device: torch.device | None = None) -> ProbeResult:
    """The quick GLUE probe of a search trial: capped fine-tuning, one seed, full dev sets."""
    return run_glue(encoder_or_checkpoint, tokenizer, tasks, limits.settings(), [limits.seed], "probe",
                    limits.data_dir, device=device)
