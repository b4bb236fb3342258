"""The budgeted training loop of one cram: `Trainer` owns the model, optimizer and data order of one
run and `run`s MLM steps until the budget is spent.

Its pieces: the learning-rate schedule and batch ramp come from `trainer.budget`, the rollback of
a non-finite or spiking step from `trainer.rollback`, resumable checkpoints and intermediate
validation from `trainer.resume`; on CUDA out-of-memory the micro-batch halves (`halving_on_oom`).
`trainer.cram` builds a `Trainer`, runs it and turns its state into a `CramResult`.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from trainer import resume
from trainer.budget import micro_batches_per_step, triangle_lr
from trainer.config import TrainConfig
from trainer.data import PretrainData
from trainer.device import autocast, to_device
from trainer.masking import IGNORE_INDEX, mask_fixed_count, mask_tokens
from trainer.model import CrammedBert
from trainer.rollback import RollbackGuard


class OutOfMemory(torch.OutOfMemoryError):
    """Device memory ran out even at micro-batch 1: this architecture does not fit."""


T = TypeVar("T")

# torch.compile's backend: inductor generates fused kernels; tests set "eager" (or a counting
# backend) to check what is compiled without paying for code generation.
COMPILE_BACKEND: str | Callable = "inductor"


@dataclass
class Progress:
    fraction: float  # of the budget spent
    step: int  # optimizer steps
    tokens: int
    train_loss: float  # mean over the micro-batches since the previous report
    tokens_per_s: float
    seconds: float
    lr: float


def mlm_backward(step_fn: Callable, rows: torch.Tensor, data: PretrainData, mlm_rate: float, device: torch.device,
                 generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """One micro-step's work: send `rows` to `device`, mask them there (`generator` lives on it),
    run the MLM forward at a fixed number of positions per row, backpropagate `scale` x the loss;
    the loss, detached and left on the device: nothing here waits for the device. Shared by
    training, the compile warm-up and the speed probe (`trainer.epochs.measure_speed`)."""
    batch = mask_fixed_count(to_device(rows, device), mlm_rate, special_ids=data.special_ids,
                             vocab_size=data.vocab_size, generator=generator)
    with autocast(device):
        _, loss = step_fn(batch.input_ids, labels=batch.labels, predict_at=batch.positions)
    (loss * scale).backward()
    return loss.detach()


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


# Eager even when the trainer compiled the model's blocks in place (`Trainer.compiled`): validation's
# batch, padding and eval mode differ from training's, and each would compile the blocks again.
@torch.compiler.set_stance("force_eager")
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


class Trainer(resume.ResumableState):
    """The state of one cram; `run` is the loop. Split out so each piece stays short."""

    clock = staticmethod(time.perf_counter)  # what a wall-clock budget counts; tests/test_cram.py fakes it

    def __init__(self, arch, train, data, budget, on_progress, device, before_forward=None, out_dir=None,
                 long_run: resume.LongRun | None = None):
        self.arch, self.train, self.data, self.budget = arch, train, data, budget
        self.on_progress, self.device, self.before_forward = on_progress, device, before_forward
        # Resumable checkpoints need a directory and a caller that asked for them (the CLI).
        self.resumable = out_dir is not None and long_run is not None
        self.out_dir, self.long_run = out_dir, long_run or resume.LongRun()
        torch.manual_seed(train.seed)
        self.model = CrammedBert(arch, dropout=train.dropout).to(device)
        self.step_fn, self.compile_seconds = self.model, 0.0
        self.optimizer = build_optimizer(self.model, train, device)
        self.generator = torch.Generator(device).manual_seed(train.seed)  # masking runs on the device
        self.micro_batch = train.micro_batch  # halved on CUDA out-of-memory; train.micro_batch is not
        self.flops_per_token = arch.flops_per_token(arch.max_seq_len, train.mlm_rate)
        self.tokens = self.steps = self.micro_steps = self.oom_halvings = self.batches_drawn = 0
        self.seconds = 0.0  # training time: checkpoints and intermediate validations are not counted
        self.next_report, self.pending_losses = train.report_every, []  # micro-batch losses since the last report
        self.loss_curve: list[tuple[int, float]] = []
        self.validation_curve: list[tuple[int, float]] = []
        self.rollbacks: list[dict] = []
        self.recent_losses: list[float] = []  # of the last accepted steps: a spike is judged against them
        self.start_from(self.long_run.resume_from)
        self.batches = data.batches(train.micro_batch, seed=train.seed, start=self.batches_drawn * train.micro_batch)
        self.guard = RollbackGuard(train, self.model, self.optimizer, self.rollbacks, self.recent_losses)
        self.boundary = self.progress()
        if train.compile:  # last: compiling needs the optimizer and the micro-batch
            self.step_fn = self.compiled()

    def compiled(self) -> Callable:
        """The model with each transformer block compiled, and compiled now, at the training shapes:
        before the budget clock starts (`run`), so that compile time is not paid out of the budget
        and `tokens_per_s` excludes it (`compile_seconds` records it). Dynamo is reset first: one
        process crams many architectures (a reused Ray worker, search.confirm), and after
        `recompile_limit` (8) models dynamo would silently run the next ones eager."""
        torch._dynamo.reset()
        # Per block, not the whole model: the blocks of a model are identical modules, so dynamo
        # traces one block and every layer reuses its graph. Compiling costs seconds whatever the
        # depth, where the whole model's graph unrolled every layer (minutes for 16 layers;
        # benchmarks/compile_seconds.py). fullgraph: a graph break inside a block is an error.
        # Masking gives every batch the same shape (trainer/masking.py), so the graph is compiled
        # once. Embeddings, head and loss stay eager: a few kernels per step.
        for block in self.model.blocks:
            block.compile(backend=COMPILE_BACKEND, fullgraph=True)
        step_fn = self.model
        start = self.clock()

        def warm_up() -> None:
            # One forward/backward on a random batch of the micro-batch's shape, its gradients
            # dropped: weights, optimizer state, the data order and the masking draws are untouched.
            rows = torch.randint(0, self.data.vocab_size, (self.micro_batch, self.arch.max_seq_len),
                                 generator=torch.Generator().manual_seed(self.train.seed))
            generator = torch.Generator(self.device).manual_seed(self.train.seed)
            mlm_backward(step_fn, rows, self.data, self.train.mlm_rate, self.device, generator)

        self.halving_on_oom(warm_up)  # a micro-batch that does not fit halves here, before the clock
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.compile_seconds = self.clock() - start
        return step_fn

    def between_steps(self) -> bool:
        """Intermediate validation and periodic checkpoints when due; True when either ran."""
        spent = (self.seconds, self.tokens, self.tokens * self.flops_per_token)
        validate, checkpoint = self.validations.due(*spent), self.resumable and self.checkpoints.due(*spent)
        if validate:  # first, so that the checkpoint holds it
            self.validation_curve.append((self.tokens, validation_loss(self.model, self.data, self.device)))
        if checkpoint:
            self.save(self.progress())
        return validate or checkpoint

    def fraction(self, seconds: float) -> float:
        return self.budget.fraction(seconds, self.tokens, self.tokens * self.flops_per_token)

    def next_rows(self) -> torch.Tensor | None:
        """The next micro-batch of rows, cut short to land exactly on a token/FLOP budget."""
        rows = next(self.batches)
        self.batches_drawn += 1
        left = self.budget.tokens_left(self.tokens, self.flops_per_token)
        if math.isinf(left):
            return rows
        fit = int(left // self.arch.max_seq_len)
        return rows[:fit] if fit > 0 else None

    def forward_backward(self, rows: torch.Tensor, scale: float) -> torch.Tensor:
        if self.before_forward is not None:
            self.before_forward(len(rows))
        return mlm_backward(self.step_fn, rows, self.data, self.train.mlm_rate, self.device, self.generator, scale)

    def micro_step(self, rows: torch.Tensor, scale: float) -> torch.Tensor:
        """Forward/backward of `rows` in chunks of `self.micro_batch` rows (one chunk unless memory
        ran out before); the loss stays on the device."""
        def chunks() -> torch.Tensor:
            losses = [self.forward_backward(chunk, scale * len(chunk) / len(rows)) for chunk in rows.split(self.micro_batch)]
            return sum(losses) / len(losses)

        return self.halving_on_oom(chunks)

    def halving_on_oom(self, work: Callable[[], T]) -> T:
        """`work()`, redone at half the micro-batch after each CUDA out-of-memory, for the rest of
        the run, so the effective batch stays the same. The gradients this optimizer step had
        accumulated before the failure are dropped with the failed pass's partial ones."""
        while True:
            try:
                return work()
            except torch.OutOfMemoryError as error:
                if self.micro_batch == 1:
                    raise OutOfMemory(f"out of {self.device.type} memory even at micro_batch 1 (halved "
                                      f"{self.oom_halvings} times from {self.train.micro_batch}); choose a smaller "
                                      "architecture or max_seq_len") from error
            # Retried out here, not in the `except` block: there the exception's traceback still
            # holds the failed pass's frames and with them its activations, so the halved retry
            # would run out of memory again. Now they are unreachable: free them, then retry.
            self.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.micro_batch //= 2
            self.oom_halvings += 1

    def run(self) -> tuple[float, float]:
        """Train until the budget is spent (a resumed run: what is left of it); returns (seconds, tokens/s)."""
        stop = self.long_run.stop
        fraction = self.fraction(self.seconds)
        last = self.clock()
        while fraction < 1.0:
            self.boundary = self.progress()
            accumulate = micro_batches_per_step(fraction, self.train.batch_size, self.train.micro_batch,
                                                self.train.batch_ramp)
            lr = self.train.lr * triangle_lr(fraction, self.train.lr_base, self.train.lr_peak_at)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            losses: list[torch.Tensor] = []  # on the device: read once per optimizer step, below
            for _ in range(accumulate):
                if stop is not None and stop.is_set():  # no update yet: the weights are the boundary's
                    raise resume.Interrupted(self.save(self.boundary))
                rows = self.next_rows()
                if rows is None:
                    break
                losses.append(self.micro_step(rows, 1.0 / accumulate))
                self.tokens += rows.numel()  # budget spent, even if a rollback discards the step
                self.micro_steps += 1
                now = self.clock()
                micro_seconds, last = now - last, now
                self.seconds += micro_seconds
                # A wall-clock budget stops once the next micro-step would end more than half of
                # itself past the budget, so the run ends within half a micro-step of it.
                ahead = 0.5 * micro_seconds if self.budget.kind == "seconds" else 0.0
                fraction = self.fraction(self.seconds + ahead)
                if fraction >= 1.0:
                    break  # the budget ends mid-step: apply what was accumulated
            if not losses:
                break
            # The one wait for the device per optimizer step: the guard needs the loss. It also
            # makes the clock below count the device's time, not just the time to queue its work.
            step_losses = torch.stack(losses).float().tolist()
            loss = sum(step_losses) / len(step_losses)  # non-finite if any micro-step's was
            reason = self.guard.verdict(loss)
            if reason is not None:
                self.guard.roll_back(self.steps, self.tokens, loss, reason, self.batches_drawn)
                continue
            self.guard.accept(self.steps, loss, self.boundary["batches_drawn"])
            self.pending_losses.extend(step_losses)
            if len(losses) < accumulate:  # rescale the partial accumulation to a mean over those done
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(accumulate / len(losses))
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.gradient_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps += 1
            now = self.clock()
            self.seconds, last = self.seconds + now - last, now
            if fraction >= self.next_report or fraction >= 1.0:
                self.report(fraction, lr)
            if self.between_steps():
                last = self.clock()  # checkpoints and validations are not training time
        self.save(self.progress())
        return self.seconds, self.tokens / max(self.seconds, 1e-9)

    def report(self, fraction: float, lr: float) -> None:
        mean = sum(self.pending_losses) / len(self.pending_losses)
        self.loss_curve.append((self.tokens, mean))
        if self.on_progress:
            self.on_progress(Progress(min(fraction, 1.0), self.steps, self.tokens, mean,
                                      self.tokens / max(self.seconds, 1e-9), self.seconds, lr))
        self.pending_losses = []
        while self.next_report <= fraction:
            self.next_report += self.train.report_every
