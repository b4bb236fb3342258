"""Recovery from a diverging step: roll back to the last good state kept in memory and go on.

A non-finite loss, or a step loss above `train.spike_factor` x the median of the recent steps, is
not applied: the model and optimizer return to the copy taken before the last good step (every
`train.snapshot_every` optimizer steps, into a buffer allocated once, before the budget clock: on
the device when it has room, else in pinned host memory), the offending batches stay consumed (skipped,
as PaLM and OPT did after their spikes), and training goes on. After `train.max_rollbacks` rollbacks
the next failure ends the run with the reason (`NonFiniteLoss`, `LossSpike`). Each rollback is a
record (step, tokens, loss, reason, action) in `CramResult.rollbacks`.
"""

from __future__ import annotations

import contextlib
import math
import statistics

import torch

from trainer.config import TrainConfig

# Recent step losses the spike test compares with, and how many it needs first: the median of a
# few dozen steps follows the falling loss while one noisy step cannot move it.
SPIKE_WINDOW = 32
SPIKE_MIN_HISTORY = 8


class NonFiniteLoss(FloatingPointError):
    """The training loss became NaN or inf (more often than `max_rollbacks` allows); `step` says when."""

    def __init__(self, step: int, loss: float, rollbacks: int = 0):
        after = f" after {rollbacks} rollbacks (train.max_rollbacks)" if rollbacks else ""
        super().__init__(f"training loss became {loss} at step {step}{after}; lower lr or check the architecture")
        self.step, self.loss = step, loss


class LossSpike(NonFiniteLoss):
    """The step loss jumped above `spike_factor` x its recent median once more than rollbacks allow."""

    def __init__(self, step: int, loss: float, reason: str, rollbacks: int):
        FloatingPointError.__init__(self, f"training loss spiked at step {step} ({reason}) after {rollbacks} "
                                          "rollbacks (train.max_rollbacks); lower lr or raise train.spike_factor")
        self.step, self.loss = step, loss


# The most of the device's free memory the snapshot buffer may take there: the rest is left to
# activations, so that a snapshot never costs a halved micro-batch.
DEVICE_SNAPSHOT_SHARE = 0.25


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors a step changes: the weights and buffers a state dict holds (a tied weight once)
    and the optimizer's state, which must exist already (`trainer.loop.create_optimizer_state`)."""
    weights = {id(tensor): tensor for tensor in model.state_dict(keep_vars=True).values()}
    moments = [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]
    return [tensor.detach() for tensor in weights.values()] + moments


def allocate_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Room for one copy of each of `tensors`. On a GPU in its own memory when the copies fit in
    `DEVICE_SNAPSHOT_SHARE` of what is free (a copy there runs at memory bandwidth), else in pinned
    host memory (copied at full PCIe speed, leaving the GPU's memory to training); on a CPU it is
    simply a second copy."""
    device = tensors[0].device
    if device.type != "cuda":
        return [torch.empty_like(tensor) for tensor in tensors]
    if sum(tensor.nbytes for tensor in tensors) <= DEVICE_SNAPSHOT_SHARE * torch.cuda.mem_get_info(device)[0]:
        with contextlib.suppress(torch.OutOfMemoryError):  # another trial on a shared GPU took it meanwhile
            return [torch.empty_like(tensor) for tensor in tensors]
    return [torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True) for tensor in tensors]


class RollbackGuard:
    """Judges each step's loss before it is applied and restores the last good state when it fails."""

    def __init__(self, train: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 records: list[dict], recent: list[float]):
        """`records` (the rollbacks) and `recent` (the last accepted step losses) are the trainer's
        lists, saved with its resumable checkpoints."""
        self.train, self.model, self.optimizer, self.records, self.recent = train, model, optimizer, records, recent
        self.snapshot: tuple[int, int] | None = None  # (step, batches drawn) of the state in `copies`
        # Allocated here, before the budget clock (and before a compile warm-up, which so sees the
        # memory a device buffer takes), not at every snapshot inside it.
        self.state = training_state(model, optimizer) if train.max_rollbacks else []
        self.copies = allocate_copies(self.state) if self.state else []

    def verdict(self, loss: float) -> str | None:
        """Why this step's loss must not be applied, or None when it is fine."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if self.train.spike_factor > 0 and len(self.recent) >= SPIKE_MIN_HISTORY:
            median = statistics.median(self.recent)
            if loss > self.train.spike_factor * median:
                return f"loss {loss:.4g} > {self.train.spike_factor:g} x recent median {median:.4g}"
        return None

    def accept(self, step: int, loss: float, batches_before: int) -> None:
        """The step passed `verdict`; before it is applied, keep a copy every `snapshot_every` steps
        (and whenever none is kept yet, as after a resume). The weights that produced a good loss
        are the good state: copying after the update would keep one that may not be.
        `batches_before`: the batches drawn before this step, for the rollback's record."""
        self.recent.append(loss)
        del self.recent[:-SPIKE_WINDOW]
        if self.train.max_rollbacks and (self.snapshot is None or step % self.train.snapshot_every == 0):
            self.take_snapshot()
            self.snapshot = (step, batches_before)

    @torch.no_grad()
    def take_snapshot(self) -> None:
        """Copy the training state into the preallocated buffer, finished when this returns: the
        loop stops its clock around `accept`, so the copy must not spill into the next step's time."""
        for copy, tensor in zip(self.copies, self.state):
            copy.copy_(tensor, non_blocking=True)
        if self.state[0].device.type == "cuda":
            torch.cuda.synchronize(self.state[0].device)

    def roll_back(self, step: int, tokens: int, loss: float, reason: str, batches: int) -> None:
        """Restore the snapshot and record it, or raise when `max_rollbacks` are spent. The batches
        drawn since the snapshot (`batches` now) are not drawn again: the run goes on past them."""
        self.optimizer.zero_grad(set_to_none=True)
        if len(self.records) >= self.train.max_rollbacks or self.snapshot is None:
            if math.isfinite(loss):
                raise LossSpike(step, loss, reason, len(self.records))
            raise NonFiniteLoss(step, loss, len(self.records))
        good_step, batches_before = self.snapshot
        with torch.no_grad():  # into the live tensors: the buffer stays intact for the next rollback
            for tensor, copy in zip(self.state, self.copies):
                tensor.copy_(copy)
        self.records.append({
            "step": step, "tokens": tokens, "loss": loss if math.isfinite(loss) else None, "reason": reason,
            "action": f"restored the state before step {good_step} from memory, skipped {batches - batches_before} batches",
        })
