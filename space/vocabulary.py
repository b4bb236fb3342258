"""The architecture's vocabulary: every name a categorical `ArchConfig` field takes, defined once.

`ArchConfig` checks its fields against these, and so does a search-space file through
`space.arch.CHOICES`; `trainer.model` keys its registries by them (a test checks that each
registry holds exactly its vocabulary's names); code that branches on a value compares with a
member (`arch.position == Position.ROTARY`), never with a string of its own. A YAML file's
`position: rotary` is data choosing from this vocabulary.

Each name is a `str` enum member: equal to its plain string and hashing as it, so a registry
keyed by members finds `"rotary"` read from YAML. `ArchConfig` stores the plain string (PyYAML
cannot write a member). `(str, Enum)` rather than 3.11's `StrEnum`: trainer.export_hf copies this
module into every Hugging Face export, which may be loaded by an older Python.
"""

from __future__ import annotations

from enum import Enum


class Name(str, Enum):  # noqa: UP042 - (str, Enum) on purpose: see the docstring
    """One name of a vocabulary, printed as its plain string."""

    def __str__(self) -> str:
        return self.value


class Position(Name):
    """Where a model gets word order from."""

    LEARNED = "learned"
    SINUSOIDAL = "sinusoidal"
    SCALED_SINUSOIDAL = "scaled_sinusoidal"  # Cramming's: the sinusoid times one learned scalar
    ROTARY = "rotary"
    ALIBI = "alibi"
    NONE = "none"


class Activation(Name):
    """The nonlinearity of an FFN (of its gate, in a gated one)."""

    GELU = "gelu"
    RELU = "relu"
    RELU2 = "relu2"  # squared ReLU (So et al. 2021, Primer)
    SILU = "silu"


class FfnKind(Name):
    """An FFN: an activation, gated or not (`FFN_ACTIVATION`, `GATED_FFN_KINDS`). A plain FFN is
    named by its activation."""

    GELU = Activation.GELU.value
    RELU = Activation.RELU.value
    RELU2 = Activation.RELU2.value
    SILU = Activation.SILU.value
    GEGLU = "geglu"
    SWIGLU = "swiglu"
    REGLU = "reglu"


class NormKind(Name):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class NormPlacement(Name):
    """Where the norms sit around each sublayer."""

    PRE = "pre"
    POST = "post"
    SANDWICH = "sandwich"


# GLU variants (Shazeer 2020): three matrices instead of two, the activation on the gate.
GATED_FFN_KINDS = frozenset({FfnKind.GEGLU, FfnKind.SWIGLU, FfnKind.REGLU})
FFN_ACTIVATION: dict[FfnKind, Activation] = {
    FfnKind.GELU: Activation.GELU, FfnKind.RELU: Activation.RELU, FfnKind.RELU2: Activation.RELU2,
    FfnKind.SILU: Activation.SILU, FfnKind.GEGLU: Activation.GELU, FfnKind.SWIGLU: Activation.SILU,
    FfnKind.REGLU: Activation.RELU,
}
# Absolute schemes add a vector to each token's embedding; the others act inside attention.
ABSOLUTE_POSITIONS = frozenset({Position.LEARNED, Position.SINUSOIDAL, Position.SCALED_SINUSOIDAL})

# Each categorical ArchConfig field and the vocabulary its value comes from.
VOCABULARIES: dict[str, type[Name]] = {
    "ffn_kind": FfnKind,
    "norm_kind": NormKind,
    "norm_placement": NormPlacement,
    "position": Position,
}
