"""`ArchConfig`: the one contract between the search and the model.

Every model shape cramnas can build is one frozen `ArchConfig`. The search space draws them, the
trainer builds `trainer.model.CrammedBert` from them, MLflow logs them flat, and `fingerprint()`
names them. Parameter and FLOP counts are computed here analytically (no torch), so the search
space can constrain on them before anything is built; a test checks they equal the real model's.

Defaults are Cramming's final `crammed-bert` recipe (Geiping & Goldstein, 2022) at BERT-base width:
field for field the `arch` of trainer/configs/crammed-bert.yaml (a test checks they agree).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, fields
from typing import Any

from space.errors import CramnasError
from space.vocabulary import (
    ABSOLUTE_POSITIONS,
    FFN_ACTIVATION,
    GATED_FFN_KINDS,
    VOCABULARIES,
    Activation,
    FfnKind,
    NormKind,
    NormPlacement,
    Position,
)

# The names each categorical field takes, as plain strings for messages: space.vocabulary's, which
# `trainer.model` keys its registries by, so adding a variant means one member there and one
# registry entry (tests/test_vocabulary.py checks they agree).
CHOICES: dict[str, tuple[str, ...]] = {
    field: tuple(name.value for name in vocabulary) for field, vocabulary in VOCABULARIES.items()
}

# Fraction of tokens whose vocabulary logits are computed under sparse prediction: Cramming's MLM
# masking rate. Only used to count decoder FLOPs; the trainer's own rate is a training setting.
DEFAULT_MLM_RATE = 0.25

# FLOPs per element of the ops `ArchConfig.elementwise_flops_per_token` counts (forward). A
# transcendental (exp, erf) is counted as a few ops, the cost of the polynomial a vectorised math
# library evaluates it with; everything else is its arithmetic written out. Approximate by nature:
# they only need to rank variants and scale with width as the real ops do.
ELEMENTWISE_OPS: dict[str, int] = {
    NormKind.LAYERNORM: 6,  # mean: sum; centre: subtract; variance: square, sum; scale by 1/std; x weight
    NormKind.RMSNORM: 4,  # mean square: square, sum; scale by 1/rms; x weight (no centring)
    "bias": 1,  # one add per element: biases (norm_bias too), absolute positions, segments, ALiBi
    Activation.GELU: 8,  # 0.5 x (1 + erf(x / sqrt 2)) x x: erf ~5 (polynomial), a divide, an add, two multiplies
    Activation.SILU: 8,  # x / (1 + exp(-x)): exp ~5, a negate, an add, a divide
    Activation.RELU: 1,  # a max
    Activation.RELU2: 2,  # a max and a square
    "glu": 1,  # activation(gate) x value
    "scale": 1,  # scores x 1/sqrt(head_dim)
    "softmax": 5,  # per score: max, subtract, exp, sum, divide
    Position.ROTARY: 3,  # q cos + rotate_half(q) sin: two multiplies and an add (the half-swap only moves data)
    "residual": 1,  # x + f(x)
    "cross_entropy": 5,  # per logit of a predicted token: log-softmax's max, subtract, exp, sum, and the log
}

# Exponent notation that PyYAML (YAML 1.1) leaves as text: its floats need a dot and a signed exponent.
_TEXT_EXPONENT = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))[eE]([+-]?)(\d+)")


def yaml_number_hint(value: Any) -> str:
    """For a number PyYAML read as text (`1e-12`, `5e4`), how to write it so it is one; else ""."""
    match = _TEXT_EXPONENT.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        return ""
    mantissa, sign, exponent = match.groups()
    fixed = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{sign or '+'}{exponent}"
    return f" (YAML reads {value.strip()} as text: write {fixed})"


class ArchError(CramnasError):
    """An impossible architecture; the message names the field and what is allowed."""


@dataclass(frozen=True)
class ArchConfig:
    layers: int = 16
    hidden: int = 768
    heads: int = 12
    # FFN width as a multiple of `hidden`. Gated kinds (geglu, swiglu, reglu) have three matrices
    # instead of two, so their inner width is 2/3 of that (rounded to a multiple of 8): every
    # ffn_kind then has the same parameter count at the same ffn_mult. Cramming's GLU with
    # intermediate_size 3072 (split into two 1536 halves) is ffn_mult=3 here.
    ffn_mult: float = 3.0
    ffn_kind: str = FfnKind.GEGLU.value
    norm_kind: str = NormKind.LAYERNORM.value
    norm_placement: str = NormPlacement.PRE.value
    norm_eps: float = 1e-12
    final_norm: bool = True
    embedding_norm: bool = True
    qkv_bias: bool = False
    attn_out_bias: bool = False
    ffn_bias: bool = False  # also the bias of the head transform's dense layer
    norm_bias: bool = True
    decoder_bias: bool = False
    position: str = Position.SCALED_SINUSOIDAL.value
    segment_embeddings: bool = False  # BERT's token-type embeddings (2 types)
    tie_embeddings: bool = True
    head_transform: bool = False  # BERT's dense + GELU + norm before the decoder
    sparse_prediction: bool = True  # vocabulary logits only at masked positions
    init_std: float = 0.02
    max_seq_len: int = 128
    vocab_size: int = 32768
    # Sliding-window attention (Longformer; ModernBERT's alternation): a local layer's query sees the
    # keys at most `local_window` tokens away on each side; 0 makes every layer global. Layer i is
    # global when i % global_every == 0, as ModernBERT (global_every 3: layers 0, 3, 6, ...).
    local_window: int = 0
    global_every: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ArchError(f"{f.name}: expected true or false, got {value!r}")
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ArchError(f"{f.name}: expected an integer, got {value!r}")
            if f.type == "float":
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ArchError(f"{f.name}: expected a number, got {value!r}{yaml_number_hint(value)}")
                object.__setattr__(self, f.name, float(value))
            if f.type == "str":
                if value not in CHOICES[f.name]:
                    raise ArchError(f"{f.name}: {value!r} is not one of {', '.join(CHOICES[f.name])}")
                object.__setattr__(self, f.name, str(value))  # a vocabulary member stored as its plain string
        for name in ("layers", "hidden", "heads", "max_seq_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise ArchError(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("ffn_mult", "norm_eps", "init_std"):
            if getattr(self, name) <= 0:
                raise ArchError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.local_window < 0:
            raise ArchError(f"local_window: must not be negative, got {self.local_window}; write 0 for global "
                            f"attention in every layer, or the tokens each side a local layer sees")
        if self.global_every < 1:
            raise ArchError(f"global_every: must be at least 1, got {self.global_every}; write 1 for every layer "
                            f"global, or ModernBERT's 3 (every third layer global)")
        if self.hidden % self.heads:
            raise ArchError(f"heads: hidden={self.hidden} is not divisible by heads={self.heads}; "
                            f"choose heads that divide hidden")
        if self.position == Position.ROTARY and self.head_dim % 2:
            raise ArchError(f"position: rotary needs an even head dim, got hidden/heads={self.head_dim}")
        if self.position in (Position.SINUSOIDAL, Position.SCALED_SINUSOIDAL) and self.hidden % 2:
            raise ArchError(f"position: {self.position} needs an even hidden size, got {self.hidden}")
        if self.vocab_size < 5:
            raise ArchError(f"vocab_size: must hold at least the 5 BERT special tokens, got {self.vocab_size}")

    # ---- derived shape -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def gated(self) -> bool:
        return self.ffn_kind in GATED_FFN_KINDS

    @property
    def ffn_inner(self) -> int:
        """Width of the FFN's inner activation (see `ffn_mult` for the gated rule)."""
        width = self.ffn_mult * self.hidden
        if self.gated:
            return max(8, 8 * round(width * 2 / 3 / 8))
        return max(1, round(width))

    @property
    def norms_per_layer(self) -> int:
        return 4 if self.norm_placement == NormPlacement.SANDWICH else 2

    @property
    def position_params(self) -> int:
        """Parameters of the position scheme: a learned table, or the scale of scaled sinusoids."""
        if self.position == Position.LEARNED:
            return self.max_seq_len * self.hidden
        return 1 if self.position == Position.SCALED_SINUSOIDAL else 0

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends over the whole row rather than a local window."""
        return self.local_window == 0 or layer % self.global_every == 0

    def keys_per_query(self, layer: int, seq_len: int) -> int:
        """Keys each query of layer `layer` attends to in a row of `seq_len` tokens."""
        return seq_len if self.is_global(layer) else min(seq_len, 2 * self.local_window + 1)

    # ---- counts ----------------------------------------------------------------------------
    def num_params(self) -> int:
        """Trainable parameters (tied embeddings counted once); equals the built model's count."""
        h, v, i = self.hidden, self.vocab_size, self.ffn_inner
        norm = h * (2 if self.norm_bias else 1)
        embed = v * h + self.position_params + (2 * h if self.segment_embeddings else 0)
        embed += norm if self.embedding_norm else 0
        attn = 3 * h * h + (3 * h if self.qkv_bias else 0) + h * h + (h if self.attn_out_bias else 0)
        up = 2 * i if self.gated else i
        ffn = h * up + i * h + ((up + h) if self.ffn_bias else 0)
        layer = attn + ffn + self.norms_per_layer * norm
        head = (h * h + (h if self.ffn_bias else 0) + norm) if self.head_transform else 0
        head += norm if self.final_norm else 0
        decoder = (0 if self.tie_embeddings else v * h) + (v if self.decoder_bias else 0)
        return embed + self.layers * layer + head + decoder

    def flops_per_token(self, seq_len: int | None = None, mlm_rate: float = DEFAULT_MLM_RATE) -> float:
        """Training matmul FLOPs per input token: forward + backward = 3 x forward (Kaplan et al. 2020).

        Forward counts 2 FLOPs per multiply-add of every matmul: the layer weights, the attention
        scores and their weighted sum (2 x keys x hidden each, keys = seq_len in a global layer and
        min(seq_len, 2 x local_window + 1) in a local one), the head transform and the vocabulary
        projection. Under sparse prediction the head runs on `mlm_rate` of the tokens only. Without
        a window it equals torch's FlopCounterMode on the built model in every variant; local
        layers count the keys in their window, what a sliding-window kernel computes, while
        trainer.model's masked dense attention computes every score, so on it they cost as global ones.

        Matmuls only, as the scaling-law literature counts (Kaplan et al. 2020, Hoffmann et al.
        2022), and what FLOP budgets are measured in. The ops it leaves out (norms, activations,
        GLU products, softmax, biases, residual adds, positions, the loss) are
        `elementwise_flops_per_token`: 3-5% of this at width 64, less the wider the model.
        """
        t = seq_len or self.max_seq_len
        h, i = self.hidden, self.ffn_inner
        up = 2 * i if self.gated else i
        weights = 2 * (4 * h * h + h * up + i * h)
        attention = sum(2 * 2 * self.keys_per_query(layer, t) * h for layer in range(self.layers))
        predicted = mlm_rate if self.sparse_prediction else 1.0
        head = predicted * (2 * h * h * self.head_transform + 2 * h * self.vocab_size)
        return 3.0 * (self.layers * weights + attention + head)

    def elementwise_flops_per_token(self, seq_len: int | None = None, mlm_rate: float = DEFAULT_MLM_RATE) -> float:
        """Training FLOPs per input token of the ops `flops_per_token` leaves out: norms, activations,
        GLU products, softmax, biases, residual adds, positions and the loss, at the per-element
        costs of ELEMENTWISE_OPS; forward + backward = 3 x forward, as `flops_per_token` counts.

        Not FLOPs a budget spends: what a CPU spends time on besides matmuls (they run at a
        fraction of a matmul's FLOP/s), one input of `trainer.budget`'s reference-core model.
        Dropout (0 in Cramming's recipe) and the optimizer step (per parameter, not per token)
        are left out.
        """
        t = seq_len or self.max_seq_len
        h, i, v = self.hidden, self.ffn_inner, self.vocab_size
        ops = ELEMENTWISE_OPS
        norm = h * (ops[self.norm_kind] + ops["bias"] * self.norm_bias)
        # Each query meets every key in every head: trainer.model's masked attention computes all
        # scores in a local layer too, so this counts what the device spends, not the window.
        scores = self.heads * t
        attention = scores * (ops["scale"] + ops["softmax"] + ops["bias"] * (self.position == Position.ALIBI))
        attention += 2 * h * ops[Position.ROTARY] * (self.position == Position.ROTARY)  # queries and keys
        attention += ops["bias"] * (3 * h * self.qkv_bias + h * self.attn_out_bias)
        activation = ops[FFN_ACTIVATION[self.ffn_kind]]
        ffn = i * (activation + ops["glu"] * self.gated)
        ffn += ops["bias"] * ((2 * i if self.gated else i) + h) * self.ffn_bias
        layer = self.norms_per_layer * norm + attention + ffn + 2 * h * ops["residual"]
        absolute = self.position in ABSOLUTE_POSITIONS
        embed = h * ops["bias"] * (absolute + self.segment_embeddings) + norm * self.embedding_norm
        predicted = mlm_rate if self.sparse_prediction else 1.0  # rows whose logits are computed
        head = predicted * ((ops["bias"] * self.ffn_bias + ops[Activation.GELU]) * h + norm) * self.head_transform
        head += predicted * v * ops["bias"] * self.decoder_bias
        head += mlm_rate * v * ops["cross_entropy"]  # the loss is taken at the masked tokens only
        return 3.0 * (embed + self.layers * layer + norm * self.final_norm + head)

    def derived(self) -> dict[str, float]:
        """Quantities a search-space constraint may name besides the fields themselves."""
        flops = self.flops_per_token()
        return {
            "params_millions": self.num_params() / 1e6,
            "head_dim": self.head_dim,
            "ffn_inner": self.ffn_inner,
            "flops_per_token": flops,
            "gflops_per_token": flops / 1e9,
            "elementwise_flops_per_token": self.elementwise_flops_per_token(),
        }

    # ---- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArchConfig:
        if not isinstance(data, dict):
            raise ArchError(f"architecture: expected a mapping of fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ArchError(f"{unknown[0]}: unknown architecture field; allowed: {', '.join(sorted(known))}")
        return cls(**data)

    def replace(self, **changes: Any) -> ArchConfig:
        return dataclasses.replace(self, **changes)

    def canonical(self) -> ArchConfig:
        """The same network spelled one way: window fields that make no layer local are written as
        the defaults. No layer is local when the window is 0 or spans the whole row (local_window >=
        max_seq_len - 1), or when every layer is global (one layer, or global_every 1). Searches draw
        these fields independently, so without this two draws of one function get two fingerprints
        and both train. (Two windowed spellings of one network, as global_every 2 and 3 in two
        layers, stay apart: mapping one onto the other would rename crams already recorded.)"""
        window_reaches_every_key = self.local_window >= self.max_seq_len - 1
        if window_reaches_every_key or all(self.is_global(layer) for layer in range(self.layers)):
            return self.replace(local_window=0, global_every=1)
        return self

    def describe(self) -> str:
        """The architecture in one short line, the choices that most tell models apart:
        `4x256/4h geglu pre-norm rotary` (layers x hidden / heads, FFN, norm placement, positions),
        then `window 16/global every 3` when layers attend locally and `untied` when the decoder
        has its own weights (at small widths they are most of the model)."""
        line = (f"{self.layers}x{self.hidden}/{self.heads}h {self.ffn_kind} {self.norm_placement}-norm "
                f"{self.position}")
        windowed = self.canonical()
        if windowed.local_window:
            line += f" window {windowed.local_window}/global every {windowed.global_every}"
        return line + ("" if self.tie_embeddings else " untied")

    def fingerprint(self) -> str:
        """Short stable hash of every field of the canonical spelling (`canonical`): same in every
        process and Python hash seed, and one per network, so a study's repeat check sees through
        a window that changes nothing."""
        # Fields added after studies and runs had recorded fingerprints are hashed only when they
        # differ from their default, so an architecture that existed before keeps its name.
        named = {k: v for k, v in self.canonical().to_dict().items()
                 if not (k in _LATER_FIELDS and v == _DEFAULTS[k])}
        canonical = json.dumps(named, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


FIELD_TYPES: dict[str, str] = {f.name: f.type for f in fields(ArchConfig)}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ArchConfig)}
_LATER_FIELDS = ("local_window", "global_every")  # see fingerprint()
