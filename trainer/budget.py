"""Budgets, and the schedules that Cramming shapes by the fraction of budget spent.

True cramming fixes wall-clock (`24h`, `5m`, `60s`): a faster architecture sees more tokens. Token
(`2e7tokens`) and FLOP (`1e15flops`) budgets give reproducible comparisons on noisy machines.
Whatever the kind, the learning rate and the batch-size ramp are functions of `fraction` in [0, 1],
so the same recipe stretches to any budget.

Named budgets stand for an amount of one kind (NAMED_BUDGETS). `cramming-day` is the compute of
Cramming's day (Geiping & Goldstein 2022): its crammed BERT trained for 24 hours on one NVIDIA RTX
A6000, so that a faster GPU crams at equal compute instead of for 24 of its own hours. In FLOPs,
because they are what a GPU's day buys whatever the architecture (in cramnas's count,
`ArchConfig.flops_per_token`):

    24 h x 3600 s                              86,400 s (the paper's rule: one GPU, one day)
    x 154.8e12 FLOP/s                          the A6000's dense fp16/bf16 tensor peak with fp32
                                               accumulation (NVIDIA's datasheet: 309.7 with sparsity)
    x 0.40                                     model FLOPs utilisation: not reported by the paper;
                                               assumed, typical of a tuned BERT-base at seq_len 128
    = 5.35e18 FLOPs

Cross-check against what the paper reports of the recipe: sequences of 128 tokens, micro-batches of
128 and batches of 4096 sequences, the step count capped at 600,000 micro-batches
(9.8e9 tokens). crammed-bert's 6.2e8 FLOPs per token (trainer/configs/crammed-bert.yaml) make
5.35e18 FLOPs 8.6e9 tokens: 524,000 micro-batches, 16,400 steps of 4096, just under that cap.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from space.errors import CramnasError

UNITS = {"s": ("seconds", 1.0), "m": ("seconds", 60.0), "h": ("seconds", 3600.0),
         "tokens": ("tokens", 1.0), "flops": ("flops", 1.0)}
# name -> (kind, amount); the derivation of each is in the module docstring.
NAMED_BUDGETS = {"cramming-day": ("flops", 24 * 3600 * 154.8e12 * 0.40)}
_BUDGET = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


class BudgetError(CramnasError):
    pass


@dataclass(frozen=True)
class Budget:
    kind: str  # seconds | tokens | flops
    amount: float
    text: str  # as the user wrote it, for records

    @classmethod
    def parse(cls, text: str) -> Budget:
        name = str(text).strip().lower()
        if name in NAMED_BUDGETS:
            kind, amount = NAMED_BUDGETS[name]
            return cls(kind, amount, name)
        match = _BUDGET.match(str(text))
        if match and not match.group(2):
            number = match.group(1)
            raise BudgetError(f"budget: {text!r} has no unit; write e.g. {number}s, {number}tokens or {number}flops")
        if not match or match.group(2).lower() not in UNITS:
            raise BudgetError(f"budget: cannot read {text!r}; write e.g. 60s, 5m, 24h, 2e7tokens, 1e15flops "
                              f"or a name ({', '.join(NAMED_BUDGETS)})")
        kind, scale = UNITS[match.group(2).lower()]
        amount = float(match.group(1)) * scale
        if amount <= 0 or not math.isfinite(amount):
            raise BudgetError(f"budget: {text!r} must be positive and finite; write e.g. 60s or 2e7tokens")
        return cls(kind, amount, str(text).strip())

    def fraction(self, seconds: float, tokens: int, flops: float) -> float:
        """Fraction of the budget spent (may exceed 1 by the last step's overshoot)."""
        spent = {"seconds": seconds, "tokens": tokens, "flops": flops}[self.kind]
        return spent / self.amount

    def tokens_left(self, tokens: int, flops_per_token: float) -> float:
        """Tokens that still fit a token or FLOP budget (inf for wall-clock budgets)."""
        if self.kind == "tokens":
            return self.amount - tokens
        if self.kind == "flops":
            return self.amount / flops_per_token - tokens
        return math.inf


def triangle_lr(fraction: float, base: float = 0.25, peak_at: float = 0.75) -> float:
    """Cramming's `budget-triangle2` one-cycle: from `base` x lr rising linearly to the peak at
    `peak_at` of the budget, then linearly down to 0 at the end."""
    fraction = min(max(fraction, 0.0), 1.0)
    rising = base + fraction * (1.0 - base) / peak_at
    falling = (1.0 - fraction) / (1.0 - peak_at)
    return max(0.0, min(rising, falling))


def micro_batches_per_step(fraction: float, target_batch: int, micro_batch: int, ramp_until: float) -> int:
    """Batch-size ramp through gradient accumulation: the effective batch grows linearly from one
    micro-batch to `target_batch` sequences, reached at `ramp_until` of the budget (Cramming: 0.6)."""
    full = max(1, math.ceil(target_batch / micro_batch))
    if ramp_until <= 0:
        return full
    return max(1, min(full, math.ceil(full * fraction / ramp_until)))
