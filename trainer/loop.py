"""The budgeted training loop of one cram: `Trainer` owns the model, optimizer and data order of one
run and `run`s MLM steps until the budget is spent.

Its pieces: the learning-rate schedule and batch ramp come from `trainer.budget`, the rollback of
a non-finite or spiking step from `trainer.rollback`, resumable checkpoints and intermediate
validation from `trainer.resume`; on CUDA out-of-memory the micro-batch halves (`halving_on_oom`).
`trainer.cram` builds a `Trainer`, runs it and turns its state into a `CramResult`.
"""

from __future__ import annotations

import copy
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypeVar

import torch

from trainer import resume
from trainer.budget import micro_batches_per_step, triangle_lr
from trainer.config import TrainConfig
from trainer.data import PretrainData
from trainer.device import autocast, to_device
from trainer.masking import mask_fixed_count
from trainer.model import CrammedBert
from trainer.rollback import RollbackGuard
from trainer.validation import validation_loss


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


@dataclass
class LoopState:
    """Where the loop is, between two optimizer steps: with the weights, the optimizer and the RNG
    states, what a resumable checkpoint holds (its state.json's "progress"). The learning rate and
    the batch ramp follow from the budget spent."""

    micro_batch: int  # halved on CUDA out-of-memory; train.micro_batch is not
    next_report: float  # the budget fraction of the next progress report
    tokens: int = 0
    steps: int = 0  # optimizer steps
    micro_steps: int = 0
    oom_halvings: int = 0
    seconds: float = 0.0  # training time: checkpoints and intermediate validations are not counted
    batches_drawn: int = 0  # of the data order: a resumed run draws on from there
    pending_losses: list[float] = field(default_factory=list)  # micro-batch losses since the last report
    loss_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, train loss)
    validation_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, validation loss)
    rollbacks: list[dict] = field(default_factory=list)  # RollbackGuard's records
    recent_losses: list[float] = field(default_factory=list)  # of the last accepted steps: spikes are judged against them

    def to_dict(self) -> dict:
        """A copy that later steps leave alone. Shallow, for speed (it is taken every step): the
        lists only ever grow or shrink, and what they hold (numbers, pairs, finished rollback
        records) is never changed in place."""
        return {item.name: copy.copy(getattr(self, item.name)) for item in fields(self)}

    @classmethod
    def from_dict(cls, saved: dict) -> LoopState:
        """The state `to_dict` gave, read back from JSON (which keeps other keys beside it: "rng")."""
        state = cls(**{item.name: saved[item.name] for item in fields(cls)})
        state.loss_curve = [tuple(point) for point in state.loss_curve]  # JSON made the pairs lists
        state.validation_curve = [tuple(point) for point in state.validation_curve]
        return state


def max_progress_reports(report_every: float) -> int:
    """The most progress reports a run makes: one per multiple of `report_every` below 1, none at
    the end of the budget (`Trainer.run`); fewer when a step crosses more than one."""
    return math.ceil(1 / report_every - 1e-9) - 1  # 1e-9: 1 / (1/16) is 16, not a hair above it


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


class Trainer:
    """One cram: its model, optimizer, data order and `state` (`LoopState`); `run` is the loop."""

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
        self.flops_per_token = arch.flops_per_token(arch.max_seq_len, train.mlm_rate)
        self.state = LoopState(micro_batch=train.micro_batch, next_report=train.report_every)
        self.start_from(self.long_run.resume_from)
        self.create_optimizer_state()
        self.batches = data.batches(train.micro_batch, seed=train.seed,
                                    start=self.state.batches_drawn * train.micro_batch)
        self.guard = RollbackGuard(train, self.model, self.optimizer, self.state.rollbacks, self.state.recent_losses)
        self.boundary = self.snapshot()
        if train.compile:  # last: compiling needs the optimizer and the micro-batch
            self.step_fn = self.compiled()

    def start_from(self, checkpoint: resume.Checkpoint | None) -> None:
        """Continue from `checkpoint` (weights, optimizer, loop state, RNG states) when one is given;
        the checkpoint and validation cadences count from the training it holds."""
        self.last_checkpoint, self.checkpointed_tokens = None, -1
        if checkpoint is not None:
            checkpoint.load_into(self.model, self.optimizer)
            saved = checkpoint.progress()
            self.state = LoopState.from_dict(saved)
            resume.restore_rng(self.generator, saved["rng"])
            self.last_checkpoint, self.checkpointed_tokens = checkpoint.path, self.state.tokens
        spent = (self.state.seconds, self.state.tokens, self.state.tokens * self.flops_per_token)
        self.checkpoints = resume.Cadence(self.long_run.checkpoint_every, *spent)
        self.validations = resume.Cadence(self.long_run.validate_every, *spent)

    def snapshot(self) -> dict:
        """The loop's state now, with the RNG states: what a resumable checkpoint saves with the weights."""
        return {**self.state.to_dict(), "rng": resume.capture_rng(self.generator)}

    def save(self, snapshot: dict) -> Path | None:
        """A resumable checkpoint of the weights and optimizer with `snapshot`; None when not resumable."""
        if not self.resumable:
            return None
        if snapshot["tokens"] == self.checkpointed_tokens:  # every micro-step adds tokens: nothing changed
            return self.last_checkpoint
        run = {**resume.run_record(self.arch, self.train, self.budget, self.data.fingerprint),
               "source": self.long_run.source}
        self.last_checkpoint = resume.save_resumable(self.out_dir, self.model, self.optimizer, run, snapshot,
                                                     keep=self.last_checkpoint)
        self.checkpointed_tokens = snapshot["tokens"]
        return self.last_checkpoint

    def create_optimizer_state(self) -> None:
        """AdamW's state allocated now, before the budget clock and the compile warm-up: left to the
        first step, it is allocated inside the budget, and a micro-batch that fit in the warm-up can
        run out of memory there. A step at learning rate 0 on zero gradients allocates it and changes
        nothing (the moments stay 0, the weights as they are) but the step counts, set back to 0.
        A resumed run has loaded its state already."""
        if self.optimizer.state:
            return
        rates = [group["lr"] for group in self.optimizer.param_groups]
        for param in self.model.parameters():
            param.grad = torch.zeros_like(param)
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
        self.optimizer.step()
        for state in self.optimizer.state.values():
            state["step"].zero_()
        for group, rate in zip(self.optimizer.param_groups, rates):
            group["lr"] = rate
        self.optimizer.zero_grad(set_to_none=True)

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
            # One forward/backward and gradient clipping on a random batch of the micro-batch's
            # shape, its gradients dropped: weights, optimizer state, the data order and the masking
            # draws are untouched. AdamW's state and the rollback buffer exist already
            # (`create_optimizer_state`, `RollbackGuard`), so this pass holds a training step's
            # memory: a micro-batch that does not fit halves here, not at the first step inside the
            # clock. (The fused optimizer step itself allocates nothing more.)
            rows = torch.randint(0, self.data.vocab_size, (self.state.micro_batch, self.arch.max_seq_len),
                                 generator=torch.Generator().manual_seed(self.train.seed))
            generator = torch.Generator(self.device).manual_seed(self.train.seed)
            mlm_backward(step_fn, rows, self.data, self.train.mlm_rate, self.device, generator)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.gradient_clip)

        self.halving_on_oom(warm_up)  # a micro-batch that does not fit halves here, before the clock
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.compile_seconds = self.clock() - start
        return step_fn

    def between_steps(self) -> None:
        """Intermediate validation and periodic checkpoints when due."""
        spent = (self.state.seconds, self.state.tokens, self.state.tokens * self.flops_per_token)
        validate, checkpoint = self.validations.due(*spent), self.resumable and self.checkpoints.due(*spent)
        if validate:  # first, so that the checkpoint holds it
            self.state.validation_curve.append((self.state.tokens, validation_loss(self.model, self.data, self.device)))
        if checkpoint:
            self.save(self.snapshot())

    def fraction(self, seconds: float) -> float:
        return self.budget.fraction(seconds, self.state.tokens, self.state.tokens * self.flops_per_token)

    def spent(self, fraction: float) -> bool:
        """Whether the budget is spent: `fraction` reached 1, or a token or FLOP budget has no room
        for another whole micro-batch. The last micro-batch is dropped rather than cut short: a
        shorter one is a new shape, which a compiled step recompiles inside the budget, and padding
        it would spend compute the budget does not count. Such a run ends less than a micro-batch
        short of its budget, and `tokens` counts what it trained on."""
        room = self.budget.tokens_left(self.state.tokens, self.flops_per_token)
        return fraction >= 1.0 or room < self.train.micro_batch * self.arch.max_seq_len

    def next_rows(self) -> torch.Tensor:
        rows = next(self.batches)
        self.state.batches_drawn += 1
        return rows

    def forward_backward(self, rows: torch.Tensor, scale: float) -> torch.Tensor:
        if self.before_forward is not None:
            self.before_forward(len(rows))
        return mlm_backward(self.step_fn, rows, self.data, self.train.mlm_rate, self.device, self.generator, scale)

    def micro_step(self, rows: torch.Tensor, scale: float) -> torch.Tensor:
        """Forward/backward of `rows` in chunks of `self.state.micro_batch` rows (one chunk unless memory
        ran out before); the loss stays on the device."""
        def chunks() -> torch.Tensor:
            losses = [self.forward_backward(chunk, scale * len(chunk) / len(rows))
                      for chunk in rows.split(self.state.micro_batch)]
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
                if self.state.micro_batch == 1:
                    raise OutOfMemory(f"out of {self.device.type} memory even at micro_batch 1 (halved "
                                      f"{self.state.oom_halvings} times from {self.train.micro_batch}); choose a smaller "
                                      "architecture or max_seq_len") from error
            # Retried out here, not in the `except` block: there the exception's traceback still
            # holds the failed pass's frames and with them its activations, so the halved retry
            # would run out of memory again. Now they are unreachable: free them, then retry.
            self.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.state.micro_batch //= 2
            self.state.oom_halvings += 1

    def run(self) -> tuple[float, float]:
        """Train until the budget is spent (a resumed run: what is left of it); returns (seconds, tokens/s)."""
        stop = self.long_run.stop
        fraction = self.fraction(self.state.seconds)
        last = self.clock()
        while not self.spent(fraction):
            self.boundary = self.snapshot()
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
                losses.append(self.micro_step(rows, 1.0 / accumulate))
                self.state.tokens += rows.numel()  # budget spent, even if a rollback discards the step
                self.state.micro_steps += 1
                now = self.clock()
                micro_seconds, last = now - last, now
                self.state.seconds += micro_seconds
                # A wall-clock budget stops once the next micro-step would end more than half of
                # itself past the budget, so the run ends within half a micro-step of it.
                ahead = 0.5 * micro_seconds if self.budget.is_wall_clock else 0.0
                fraction = self.fraction(self.state.seconds + ahead)
                if self.spent(fraction):
                    break  # the budget ends mid-step: apply what was accumulated
            # The one wait for the device per optimizer step: the guard needs the loss. It also
            # makes the clock below count the device's time, not just the time to queue its work.
            step_losses = torch.stack(losses).float().tolist()
            loss = sum(step_losses) / len(step_losses)  # non-finite if any micro-step's was
            reason = self.guard.verdict(loss)
            if reason is not None:
                self.guard.roll_back(self.state.steps, self.state.tokens, loss, reason, self.state.batches_drawn)
                continue
            paused = self.clock()
            self.guard.accept(self.state.steps, loss, self.boundary["batches_drawn"])
            last += self.clock() - paused  # a rollback snapshot is not training time
            self.state.pending_losses.extend(step_losses)
            if len(losses) < accumulate:  # rescale the partial accumulation to a mean over those done
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(accumulate / len(losses))
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.gradient_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.steps += 1
            self.state.seconds += self.clock() - last
            # Progress reports come only while budget is left: the end is the caller's final
            # report, after validation (and a search trial's probe). A search stops a trial inside
            # a progress report (ASHA), so one at the end would throw a spent budget away.
            if not self.spent(fraction) and fraction >= self.state.next_report:
                self.report(fraction, lr)
            self.between_steps()
            last = self.clock()  # waiting for the driver, checkpoints and validations are not training time
        if self.state.pending_losses:
            self.record_loss()
        self.save(self.snapshot())
        return self.state.seconds, self.state.tokens / max(self.state.seconds, 1e-9)

    def record_loss(self) -> float:
        """The mean train loss since the last point of the loss curve, added to it."""
        mean = sum(self.state.pending_losses) / len(self.state.pending_losses)
        self.state.loss_curve.append((self.state.tokens, mean))
        self.state.pending_losses = []
        return mean

    def report(self, fraction: float, lr: float) -> None:
        mean = self.record_loss()
        if self.on_progress:
            self.on_progress(Progress(fraction, self.state.steps, self.state.tokens, mean,
                                      self.state.tokens / max(self.state.seconds, 1e-9), self.state.seconds, lr))
        while self.state.next_report <= fraction:
            self.state.next_report += self.train.report_every
