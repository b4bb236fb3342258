"""How many times a budget reads the corpus: `CramResult.epochs`, and the warning before a run
whose budget would repeat it (a model that sees its data again memorises rather than crams).

Token and FLOP budgets know their tokens in advance. A wall-clock budget's tokens are estimated
from the speed of a few forward/backward passes timed before training (`measure_speed`): an
upper bound, since it leaves out the optimizer step and the small batches of the ramp.
"""

from __future__ import annotations

import time

import torch

from trainer.budget import Budget
from trainer.data import PretrainData
from trainer.loop import mlm_backward


def corpus_tokens(data: PretrainData) -> int:
    """The training tokens one epoch reads."""
    return len(data.train) * data.seq_len


def repeat_warning(budget: Budget, available: int, flops_per_token: float,
                   tokens_per_s: float | None = None) -> str | None:
    """One line when `budget` would train on more than `available` tokens (None otherwise, and for a
    wall-clock budget whose speed is unknown)."""
    if budget.is_wall_clock:
        if tokens_per_s is None:
            return None
        tokens, speed = budget.amount * tokens_per_s, f" at ~{tokens_per_s:,.0f} tokens/s (timed before training)"
    else:
        tokens, speed = budget.tokens_left(0, flops_per_token), ""
    epochs = tokens / available
    if epochs <= 1:
        return None
    return (f"warning: the {budget.text} budget{speed} trains on ~{tokens:.3g} tokens, {epochs:.1f} times the "
            f"corpus's {available:,}: the model would see each sequence {epochs:.0f} times; prepare a larger "
            "corpus (--corpus, --data) or choose a smaller budget")


def repeat_warning_before(budget: Budget, data: PretrainData, model: torch.nn.Module, mlm_rate: float,
                          micro_batch: int, device: torch.device) -> str | None:
    """`repeat_warning` for a run about to start: a wall-clock budget times `model` first."""
    speed = measure_speed(model, data, mlm_rate, micro_batch, device) if budget.is_wall_clock else None
    return repeat_warning(budget, corpus_tokens(data), model.flops_per_token(data.seq_len, mlm_rate), speed)


def measure_speed(model: torch.nn.Module, data: PretrainData, mlm_rate: float, micro_batch: int,
                  device: torch.device, passes: int = 2) -> float | None:
    """Forward/backward tokens/s at `micro_batch` rows, timed on validation rows in eval mode (no
    dropout draw) with their own masking seed, the gradients dropped: training's state is left as
    it was. None when the micro-batch does not fit in memory."""
    rows = next(data.validation_batches(micro_batch))
    generator = torch.Generator(device).manual_seed(0)
    model.eval()
    seconds = []
    try:
        for _ in range(passes + 1):  # the first pass warms up
            start = time.perf_counter()
            float(mlm_backward(model, rows, data, mlm_rate, device, generator))  # float() waits for the device
            seconds.append(time.perf_counter() - start)
    except torch.OutOfMemoryError:
        return None
    finally:
        model.train()
        model.zero_grad(set_to_none=True)
    return rows.numel() / min(seconds[1:])
