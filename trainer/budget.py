"""Budgets, and the schedules that Cramming shapes by the fraction of budget spent.

True cramming fixes wall-clock (`24h`, `5m`, `60s`): a faster architecture sees more tokens. Token
(`2e7tokens`) and FLOP (`1e15flops`) budgets give reproducible comparisons on noisy machines.
Reference-core seconds (`180refs`) are both: 180 seconds of one reference CPU core, converted into
each architecture's FLOPs through that core's measured speed (`ReferenceCore`), so a CPU study is
deterministic like a FLOP budget and fair like a clock. A FLOP budget is not: one core runs width-64
models at 33-39 GFLOP/s and 2x128 at 47-51 (their norms, activations and per-layer overheads weigh
more), so FLOPs favour the narrow models by ~1.3-1.4x over equal wall-clock (benchmarks/RESULTS.md,
"Budgets that behave like a clock").
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

The reference core's model (`ReferenceCore`, fitted by `python -m trainer.reference_core`, constants
in trainer/reference_core.yaml with the CPU, date and measurements they came from): seconds per
token = a x matmul FLOPs/token + b x elementwise FLOPs/token + c x layers + d, non-negative
coefficients. `Budget.resolve(arch, mlm_rate)` turns `180refs` into the FLOP budget of 180 / that
x the architecture's FLOPs per token (its text stays `180refs`, for records); every other budget
resolves to itself. The fit is made at the CPU profile's shapes (seq 64, micro-batch 32, one
thread): there it is a clock; far from them (GPU-scale models) it extrapolates. Where a budget
meets its architecture (`trainer.cram.cram_with_model`, the data preparation of `trainer.cram`,
search.run's corpus check) it is resolved, so the training loop only ever sees seconds, tokens or
FLOPs.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from space.arch import DEFAULT_MLM_RATE
from space.errors import CramnasError

if TYPE_CHECKING:
    from space.arch import ArchConfig

UNITS = {"s": ("seconds", 1.0), "m": ("seconds", 60.0), "h": ("seconds", 3600.0),
         "tokens": ("tokens", 1.0), "flops": ("flops", 1.0), "refs": ("refs", 1.0)}
REFERENCE_CORE = Path(__file__).with_name("reference_core.yaml")
REMEASURE = "re-measure it with: python -m trainer.reference_core --write"
# name -> (kind, amount); the derivation of each is in the module docstring.
NAMED_BUDGETS = {"cramming-day": ("flops", 24 * 3600 * 154.8e12 * 0.40)}
_BUDGET = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


class BudgetError(CramnasError):
    pass


@dataclass(frozen=True)
class ReferenceCore:
    """The reference core's training speed: seconds per token as a non-negative combination of
    FEATURES (matmul FLOPs, elementwise FLOPs, layers, one), measured and fitted by
    `python -m trainer.reference_core`. Matmul FLOPs alone would make it a FLOP budget again: the
    elementwise ops and the per-layer and per-token overheads (kernel launches, Python) are what
    make narrow models slower per FLOP."""

    coefficients: tuple[float, float, float, float]  # seconds per unit of each of FEATURES

    FEATURES = ("matmul_flop", "elementwise_flop", "layer", "token")

    @staticmethod
    def features(arch: ArchConfig, mlm_rate: float = DEFAULT_MLM_RATE) -> tuple[float, float, float, float]:
        """Per token, at the architecture's own sequence length (what it trains at)."""
        t = arch.max_seq_len
        return (arch.flops_per_token(t, mlm_rate), arch.elementwise_flops_per_token(t, mlm_rate), arch.layers, 1.0)

    def seconds_per_token(self, arch: ArchConfig, mlm_rate: float = DEFAULT_MLM_RATE) -> float:
        return sum(c * f for c, f in zip(self.coefficients, self.features(arch, mlm_rate)))

    @classmethod
    def load(cls, path: str | Path = REFERENCE_CORE) -> ReferenceCore:
        """The coefficients of a reference_core.yaml, checked: each error is one line naming the field."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not valid YAML"
            raise BudgetError(f"budget: reference-core seconds need {path} ({reason}); {REMEASURE}") from None
        table = data.get("coefficients") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise BudgetError(f"budget: {path} has no coefficients mapping; {REMEASURE}")
        values = []
        for name in cls.FEATURES:
            value = table.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise BudgetError(f"budget: {path}: coefficients.{name} must be a non-negative number, got {value!r}; "
                                  f"{REMEASURE}")
            values.append(float(value))
        if values[0] <= 0:  # every architecture has matmuls: without their cost no speed is positive
            raise BudgetError(f"budget: {path}: coefficients.matmul_flop must be positive; {REMEASURE}")
        return cls(tuple(values))


@functools.cache
def reference_core() -> ReferenceCore:
    """trainer/reference_core.yaml, read once per process (every trial's budget resolves through it)."""
    return ReferenceCore.load(REFERENCE_CORE)


@dataclass(frozen=True)
class Budget:
    kind: str  # seconds | tokens | flops | refs (reference-core seconds: `resolve` before training)
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
            raise BudgetError(f"budget: {text!r} has no unit; write e.g. {number}s, {number}tokens, {number}flops "
                              f"or {number}refs")
        if not match or match.group(2).lower() not in UNITS:
            raise BudgetError(f"budget: cannot read {text!r}; write e.g. 60s, 5m, 24h, 2e7tokens, 1e15flops, 180refs "
                              f"or a name ({', '.join(NAMED_BUDGETS)})")
        kind, scale = UNITS[match.group(2).lower()]
        amount = float(match.group(1)) * scale
        if amount <= 0 or not math.isfinite(amount):
            raise BudgetError(f"budget: {text!r} must be positive and finite; write e.g. 60s or 2e7tokens")
        budget = cls(kind, amount, str(text).strip())
        if budget.is_reference_core:
            reference_core()  # a missing or broken reference file fails here, before any work
        return budget

    @property
    def is_wall_clock(self) -> bool:
        """Training seconds: how many tokens such a budget trains on is known only once it has run."""
        return self.kind == "seconds"

    @property
    def is_reference_core(self) -> bool:
        """Reference-core seconds: a budget's unit only, spent once `resolve` has made it FLOPs."""
        return self.kind == "refs"

    def tokens(self, flops_per_token: float | None = None) -> float | None:
        """The tokens this budget trains on when they are known before training: a token budget's
        amount, a FLOP budget's over `flops_per_token` (when given); None for a wall-clock budget
        and for reference-core seconds not yet resolved."""
        if self.kind == "tokens":
            return self.amount
        if self.kind == "flops" and flops_per_token:
            return self.amount / flops_per_token
        return None

    def resolve(self, arch: ArchConfig, mlm_rate: float = DEFAULT_MLM_RATE,
                reference: ReferenceCore | None = None) -> Budget:
        """The budget `arch` trains under: reference-core seconds become the FLOPs the reference core
        spends on `arch` in that time (amount / its seconds per token x its FLOPs per token), the
        text kept; any other budget is already one and comes back as it is."""
        if not self.is_reference_core:
            return self
        tokens = self.amount / (reference or reference_core()).seconds_per_token(arch, mlm_rate)
        return Budget("flops", tokens * arch.flops_per_token(arch.max_seq_len, mlm_rate), self.text)

    def fraction(self, seconds: float, tokens: int, flops: float) -> float:
        """Fraction of the budget spent (may exceed 1 by the last step's overshoot)."""
        self._check_resolved()
        spent = {"seconds": seconds, "tokens": tokens, "flops": flops}[self.kind]
        return spent / self.amount

    def tokens_left(self, tokens: int, flops_per_token: float) -> float:
        """Tokens that still fit a token or FLOP budget (inf for wall-clock budgets)."""
        self._check_resolved()
        total = self.tokens(flops_per_token)
        return math.inf if total is None else total - tokens

    def _check_resolved(self) -> None:
        if self.is_reference_core:  # a caller's mistake, not the user's: name the fix for the code
            raise BudgetError(f"budget: {self.text} is reference-core seconds, which spend nothing until "
                              "Budget.resolve converts them for an architecture")


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
