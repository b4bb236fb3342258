"""Cram one architecture: MLM pretraining from scratch under a fixed budget.

    python -m trainer.cram --config trainer/configs/crammed-bert-cpu.yaml --budget 60s --data ../shared/data

The loop knows nothing of Ray, Optuna or MLflow: progress goes to a callback (the search wires it
to `tune.report`), the result is a `CramResult`, the checkpoint a directory:
`model.safetensors`, `arch.yaml`, `train.yaml`, `tokenizer.json`, `result.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from space.arch import ArchConfig
from trainer.budget import Budget, BudgetError, micro_batches_per_step, triangle_lr
from trainer.checkpoint import CheckpointWriteError, check_writable, save_checkpoint
from trainer.config import ConfigError, TrainConfig, load_run_config
from trainer.data import IGNORE_INDEX, CorpusSource, DataError, PretrainData, mask_tokens, prepare_data
from trainer.model import CrammedBert


class NonFiniteLoss(FloatingPointError):
    """The training loss became NaN or inf; `step` says when."""

    def __init__(self, step: int, loss: float):
        super().__init__(f"training loss became {loss} at step {step}; lower lr or check the architecture")
        self.step, self.loss = step, loss


class OutOfMemory(torch.OutOfMemoryError):
    """Device memory ran out even at micro-batch 1: this architecture does not fit."""


@dataclass
class Progress:
    fraction: float  # of the budget spent
    step: int  # optimizer steps
    tokens: int
    train_loss: float  # mean over the micro-batches since the previous report
    tokens_per_s: float
    seconds: float
    lr: float


@dataclass
class CramResult:
    validation_loss: float
    tokens: int
    steps: int
    micro_steps: int
    seconds: float  # training wall-clock, what a time budget bounds
    tokens_per_s: float
    params: int
    flops_per_token: float
    device: str
    seed: int
    budget: str
    data_fingerprint: str
    arch_fingerprint: str
    code_version: str
    validation_seconds: float = 0.0  # the held-out evaluation after training
    oom_halvings: int = 0
    final_micro_batch: int = 0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, train loss)
    checkpoint: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def code_version() -> str:
    """The git commit of this checkout (with `+dirty` for local changes), or `unknown`."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5, check=False).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def build_optimizer(model: torch.nn.Module, train: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with no weight decay on norms, biases and scalars (Cramming's `limited_decay_keys`).

    Fused: on CPU it is ~6x faster than the default foreach kernel (benchmarks/RESULTS.md).
    """
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas), eps=train.eps, fused=True)


# Validation masks at BERT's standard rate whatever the recipe trains with, so losses of different
# recipes (Cramming trains at 0.25, BERT at 0.15) and of different trials are comparable.
VALIDATION_MLM_RATE = 0.15


@torch.no_grad()
def validation_loss(model: CrammedBert, data: PretrainData, device: torch.device, batch_size: int = 64) -> float:
    """MLM loss on the fixed held-out sequences with a fixed masking seed and rate."""
    model.eval()
    generator = torch.Generator().manual_seed(1234)
    total, count = 0.0, 0
    for rows in data.validation_batches(batch_size):
        ids, labels = mask_tokens(rows, VALIDATION_MLM_RATE, special_ids=data.special_ids,
                                  vocab_size=data.vocab_size, generator=generator)
        with autocast(device):
            _, loss = model(ids.to(device), labels=labels.to(device))
        n = int((labels != IGNORE_INDEX).sum())
        total, count = total + float(loss) * n, count + n
    model.train()
    return total / max(count, 1)


def autocast(device: torch.device):
    # bf16 on GPUs only: on these CPUs bf16 matmul is 100x slower than fp32 (STACK.md).
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


class _Trainer:
    """The state of one cram; `run` is the loop. Split out so each piece stays short."""

    def __init__(self, arch, train, data, budget, on_progress, device, before_forward=None):
        self.arch, self.train, self.data, self.budget = arch, train, data, budget
        self.on_progress, self.device, self.before_forward = on_progress, device, before_forward
        torch.manual_seed(train.seed)
        self.model = CrammedBert(arch, dropout=train.dropout).to(device)
        self.step_fn = torch.compile(self.model) if train.compile else self.model
        self.optimizer = build_optimizer(self.model, train, device)
        self.generator = torch.Generator().manual_seed(train.seed)
        self.batches = data.batches(train.micro_batch, seed=train.seed)
        self.micro_batch = train.micro_batch  # halved on CUDA out-of-memory; train.micro_batch is not
        self.flops_per_token = arch.flops_per_token(arch.max_seq_len, train.mlm_rate)
        self.tokens = self.steps = self.micro_steps = self.oom_halvings = 0
        self.loss_curve: list[tuple[int, float]] = []

    def fraction(self, seconds: float) -> float:
        return self.budget.fraction(seconds, self.tokens, self.tokens * self.flops_per_token)

    def next_rows(self) -> torch.Tensor | None:
        """The next micro-batch of rows, cut short to land exactly on a token/FLOP budget."""
        rows = next(self.batches)
        left = self.budget.tokens_left(self.tokens, self.flops_per_token)
        if math.isinf(left):
            return rows
        fit = int(left // self.arch.max_seq_len)
        return rows[:fit] if fit > 0 else None

    def forward_backward(self, rows: torch.Tensor, scale: float) -> float:
        if self.before_forward is not None:
            self.before_forward(len(rows))
        ids, labels = mask_tokens(rows, self.train.mlm_rate, special_ids=self.data.special_ids,
                                  vocab_size=self.data.vocab_size, generator=self.generator)
        with autocast(self.device):
            _, loss = self.step_fn(ids.to(self.device, non_blocking=True), labels=labels.to(self.device))
        (loss * scale).backward()
        return float(loss.detach())

    def micro_step(self, rows: torch.Tensor, scale: float) -> float:
        """Forward/backward of `rows` in chunks of `self.micro_batch` rows (one chunk unless memory
        ran out before). On CUDA out-of-memory the chunk size halves for the rest of the run and the
        rows are redone, so the effective batch stays the same. The gradients this optimizer step
        had accumulated before the failure are dropped with the failed pass's partial ones."""
        chunks = rows.split(self.micro_batch)
        try:
            losses = [self.forward_backward(chunk, scale * len(chunk) / len(rows)) for chunk in chunks]
        except torch.OutOfMemoryError as error:
            if self.micro_batch == 1:
                raise OutOfMemory(f"out of {self.device.type} memory even at micro_batch 1 (halved "
                                  f"{self.oom_halvings} times from {self.train.micro_batch}); choose a smaller "
                                  "architecture or max_seq_len") from error
            self.optimizer.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.micro_batch //= 2
            self.oom_halvings += 1
            return self.micro_step(rows, scale)
        return sum(losses) / len(losses)

    def run(self) -> tuple[float, float]:
        """Train until the budget is spent; returns (seconds, tokens/s)."""
        report_every = self.train.report_every
        next_report, losses = report_every, []
        start = time.perf_counter()
        elapsed, fraction = 0.0, 0.0
        while fraction < 1.0:
            accumulate = micro_batches_per_step(fraction, self.train.batch_size, self.train.micro_batch,
                                                self.train.batch_ramp)
            lr = self.train.lr * triangle_lr(fraction, self.train.lr_base, self.train.lr_peak_at)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            done = 0
            for _ in range(accumulate):
                rows = self.next_rows()
                if rows is None:
                    break
                loss = self.micro_step(rows, 1.0 / accumulate)
                if not math.isfinite(loss):
                    raise NonFiniteLoss(self.steps, loss)
                losses.append(loss)
                self.tokens += rows.numel()
                self.micro_steps += 1
                done += 1
                now = time.perf_counter()
                micro_seconds, elapsed = now - start - elapsed, now - start
                # A wall-clock budget stops once the next micro-step would end more than half of
                # itself past the budget, so the run ends within half a micro-step of it.
                ahead = 0.5 * micro_seconds if self.budget.kind == "seconds" else 0.0
                fraction = self.fraction(elapsed + ahead)
                if fraction >= 1.0:
                    break  # the budget ends mid-step: apply what was accumulated
            if done == 0:
                break
            if done < accumulate:  # rescale the partial accumulation to a mean over `done`
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(accumulate / done)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.gradient_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps += 1
            elapsed = time.perf_counter() - start
            if fraction >= next_report or fraction >= 1.0:
                mean = sum(losses) / len(losses)
                self.loss_curve.append((self.tokens, mean))
                if self.on_progress:
                    self.on_progress(Progress(min(fraction, 1.0), self.steps, self.tokens, mean,
                                              self.tokens / max(elapsed, 1e-9), elapsed, lr))
                losses = []
                while next_report <= fraction:
                    next_report += report_every
        return elapsed, self.tokens / max(elapsed, 1e-9)


def cram(arch: ArchConfig, train: TrainConfig, data: PretrainData, budget: Budget,
         on_progress: Callable[[Progress], None] | None = None, out_dir: str | os.PathLike | None = None,
         device: torch.device | None = None, before_forward: Callable[[int], None] | None = None) -> CramResult:
    """Pretrain `arch` from scratch on `data` until `budget` is spent; optionally write a checkpoint.

    `before_forward` is called with the row count of every forward pass before it runs: fault
    injection (search trials' `oom@N`) raises `torch.OutOfMemoryError` there to drive the halving
    of the micro-batch on machines that have memory to spare."""
    return cram_with_model(arch, train, data, budget, on_progress, out_dir, device, before_forward)[1]


def cram_with_model(arch: ArchConfig, train: TrainConfig, data: PretrainData, budget: Budget,
                    on_progress: Callable[[Progress], None] | None = None,
                    out_dir: str | os.PathLike | None = None,
                    device: torch.device | None = None,
                    before_forward: Callable[[int], None] | None = None) -> tuple[CrammedBert, CramResult]:
    """`cram`, also returning the trained model (eval mode): a search trial probes it in memory."""
    if data.vocab_size != arch.vocab_size or data.seq_len != arch.max_seq_len:
        raise ValueError(f"data: prepared for vocab {data.vocab_size}/seq {data.seq_len} but the architecture "
                         f"has vocab_size {arch.vocab_size}/max_seq_len {arch.max_seq_len}; prepare it again")
    device = device or pick_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    trainer = _Trainer(arch, train, data, budget, on_progress, device, before_forward)
    seconds, tokens_per_s = trainer.run()
    evaluation_start = time.perf_counter()
    held_out_loss = validation_loss(trainer.model, data, device)
    result = CramResult(
        validation_loss=held_out_loss, validation_seconds=time.perf_counter() - evaluation_start,
        tokens=trainer.tokens, steps=trainer.steps, micro_steps=trainer.micro_steps, seconds=seconds,
        tokens_per_s=tokens_per_s, params=trainer.model.num_params(), flops_per_token=trainer.flops_per_token,
        device=device_name(device), seed=train.seed, budget=budget.text, data_fingerprint=data.fingerprint,
        arch_fingerprint=arch.fingerprint(), code_version=code_version(), oom_halvings=trainer.oom_halvings,
        final_micro_batch=trainer.micro_batch, loss_curve=trainer.loss_curve,
    )
    if out_dir is not None:
        result.checkpoint = str(Path(out_dir))
        save_checkpoint(out_dir, trainer.model, arch, train, data.tokenizer_path, result.to_dict())
    return trainer.model.eval(), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.cram", description="Cram one architecture under a budget.")
    parser.add_argument("--config", required=True, help="run config YAML, e.g. trainer/configs/crammed-bert-cpu.yaml")
    parser.add_argument("--budget", default="24h", help="60s, 5m, 24h (wall-clock), 2e7tokens or 1e15flops")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", help="local data directory (DATA/pretrain/<name>/{train,validation}.parquet)")
    source.add_argument("--corpus", help="hub dataset id (default: WikiText-103 raw)")
    parser.add_argument("--out", help="checkpoint directory (default: runs/<config name>-<budget>)")
    parser.add_argument("--seed", type=int, help="overrides train.seed")
    parser.add_argument("--cache-dir", help="token cache (default: $CRAMNAS_CACHE or ~/.cache/cramnas)")
    args = parser.parse_args(argv)

    created: list[Path] = []  # directories the --out check makes: removed again if later input is bad
    try:  # every user error is caught here, before any data is tokenised or any step is taken
        run = load_run_config(args.config)
        # Report every 1% for the progress bar (the search keeps 1/16: its early-stopping rungs).
        train = dataclasses.replace(run.train, report_every=0.01,
                                    seed=run.train.seed if args.seed is None else args.seed)
        budget = Budget.parse(args.budget)
        out = Path(args.out or Path("runs") / f"{run.name}-{budget.text}")
        created = [directory for directory in (out, *out.parents) if not directory.exists()]
        check_writable(out)
        corpus = CorpusSource.from_args(data_dir=args.data, corpus=args.corpus)
        data = prepare_data(corpus, vocab_size=run.arch.vocab_size, seq_len=run.arch.max_seq_len,
                            cache_dir=args.cache_dir)
    except (ConfigError, BudgetError, DataError) as error:
        for directory in created:  # deepest first; rmdir leaves anything that is not empty
            with contextlib.suppress(OSError):
                directory.rmdir()
        print(f"error: {error}", file=sys.stderr)
        return 2

    print(f"cramming {run.name} ({run.arch.num_params() / 1e6:.1f}M params) for {budget.text} on "
          f"{device_name(pick_device())}; {len(data.train):,} training sequences")
    bar = tqdm(total=100, unit="%", bar_format="{l_bar}{bar}| {n:.0f}/{total}% [{elapsed}<{remaining}{postfix}]")

    def show(progress: Progress) -> None:
        bar.n = round(100 * progress.fraction)
        bar.set_postfix(loss=f"{progress.train_loss:.3f}", tok_s=f"{progress.tokens_per_s:,.0f}",
                        tokens=f"{progress.tokens:,}")

    try:
        result = cram(run.arch, train, data, budget, on_progress=show, out_dir=out)
    except (NonFiniteLoss, OutOfMemory, CheckpointWriteError) as error:  # the run failed: one line, no traceback
        bar.close()
        print(f"error: {error}", file=sys.stderr)
        return 1
    bar.close()
    print(f"validation MLM loss {result.validation_loss:.4f} after {result.tokens:,} tokens, {result.steps} steps, "
          f"{result.seconds:.1f} s ({result.tokens_per_s:,.0f} tokens/s)")
    print(f"checkpoint: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
