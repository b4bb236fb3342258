"""CrammedBert: every BERT variant the search space can draw, built from one `ArchConfig`.

Each knob of the architecture is a small module picked from a registry (positions, norms, FFN
activations, residual placement) keyed by the names of `space.vocabulary`, so `forward` reads like
the paper whatever the variant:

    x = embed(tokens) -> [x = attention_residual(x); x = ffn_residual(x)] * layers -> final norm
    logits = decoder(head_transform(x[masked]))        # sparse prediction: masked rows only

With post-norm, learned positions, all biases, GELU, head transform, embedding norm, segment
embeddings and dense prediction it is the original BERT, and `trainer.hf_compat` loads a
`transformers.BertForMaskedLM` state dict into it with identical outputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# trainer.export_hf copies this module into every Hugging Face export, making these imports relative:
# keep each cramnas import a one-line `from <module> import ...` of a module that needs only torch.
from space.arch import DEFAULT_MLM_RATE, ArchConfig
from space.vocabulary import FFN_ACTIVATION, Activation, NormKind, NormPlacement, Position
from trainer.masking import IGNORE_INDEX

# ---------------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019), with an optional bias so `norm_bias` means one thing."""

    def __init__(self, dim: int, eps: float, bias: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return x if self.bias is None else x + self.bias


NORMS = {
    NormKind.LAYERNORM: lambda arch: nn.LayerNorm(arch.hidden, eps=arch.norm_eps, bias=arch.norm_bias),
    NormKind.RMSNORM: lambda arch: RMSNorm(arch.hidden, eps=arch.norm_eps, bias=arch.norm_bias),
}


def make_norm(arch: ArchConfig) -> nn.Module:
    return NORMS[arch.norm_kind](arch)


# ---------------------------------------------------------------------------------------------
# Positions. One module per model, shared by all layers, with three hooks: absolute schemes add
# to the embeddings, rotary rotates queries and keys, ALiBi adds a bias to the attention scores.
# ---------------------------------------------------------------------------------------------


class NoPositions(nn.Module):
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def attention_bias(self, seq_len: int) -> torch.Tensor | None:
        return None


class LearnedPositions(NoPositions):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.table = nn.Embedding(arch.max_seq_len, arch.hidden)

    def embed(self, x):
        return x + self.table.weight[: x.shape[1]]


def sinusoid_table(seq_len: int, dim: int) -> torch.Tensor:
    """Vaswani et al.'s table: sin on even, cos on odd channels."""
    position = torch.arange(seq_len, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(seq_len, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table


class SinusoidalPositions(NoPositions):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.register_buffer("table", sinusoid_table(arch.max_seq_len, arch.hidden), persistent=False)

    def embed(self, x):
        return x + self.table[: x.shape[1]]


class ScaledSinusoidalPositions(SinusoidalPositions):
    """Cramming's choice: the sinusoid times one learned scalar, initialised to 1/sqrt(hidden)."""

    def __init__(self, arch: ArchConfig):
        super().__init__(arch)
        self.scale = nn.Parameter(torch.tensor(arch.hidden**-0.5))

    def embed(self, x):
        return x + self.scale * self.table[: x.shape[1]]


class RotaryPositions(NoPositions):
    """RoPE (Su et al. 2021) on queries and keys: scores depend on relative position only."""

    def __init__(self, arch: ArchConfig, base: float = 10000.0):
        super().__init__()
        dim = arch.head_dim
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        angles = torch.outer(torch.arange(arch.max_seq_len, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim), halves share frequencies
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return torch.cat([-second, first], dim=-1)

    def rotate(self, q, k):
        t = q.shape[-2]
        cos, sin = self.cos[:t].to(q.dtype), self.sin[:t].to(q.dtype)
        return q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin


class AlibiPositions(NoPositions):
    """ALiBi (Press et al. 2022), symmetric for a bidirectional encoder: -slope_h * |i - j|."""

    def __init__(self, arch: ArchConfig):
        super().__init__()
        # Geometric slopes 2^(-8/n), 2^(-16/n), ... as in the paper, for any head count.
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / arch.heads) for h in range(arch.heads)])
        pos = torch.arange(arch.max_seq_len)
        distance = (pos[None, :] - pos[:, None]).abs().float()
        self.register_buffer("bias", -slopes[:, None, None] * distance, persistent=False)

    def attention_bias(self, seq_len):
        return self.bias[:, :seq_len, :seq_len]


POSITIONS = {
    Position.NONE: lambda arch: NoPositions(),
    Position.LEARNED: LearnedPositions,
    Position.SINUSOIDAL: SinusoidalPositions,
    Position.SCALED_SINUSOIDAL: ScaledSinusoidalPositions,
    Position.ROTARY: RotaryPositions,
    Position.ALIBI: AlibiPositions,
}


class SlidingWindow(nn.Module):
    """The additive mask of local attention layers: 0 where |query - key| <= local_window, -inf
    beyond. Built once for max_seq_len rows and sliced, so its shape is static; a query always sees
    itself, so no row is all -inf (nor, with padding's finite minimum added, NaN after softmax)."""

    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.register_buffer("bias", window_bias(arch.max_seq_len, arch.local_window), persistent=False)

    def restrict(self, mask: torch.Tensor | None, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
        """`mask` (padding and ALiBi's, or None) with the window added."""
        window = self.bias[:seq_len, :seq_len].to(dtype)
        return window if mask is None else mask + window


def window_bias(seq_len: int, window: int) -> torch.Tensor:
    pos = torch.arange(seq_len)
    far = (pos[None, :] - pos[:, None]).abs() > window
    return torch.zeros(seq_len, seq_len).masked_fill(far, float("-inf"))


# ---------------------------------------------------------------------------------------------
# Attention and feed-forward sublayers
# ---------------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    def __init__(self, arch: ArchConfig, dropout: float):
        super().__init__()
        self.heads = arch.heads
        self.qkv = nn.Linear(arch.hidden, 3 * arch.hidden, bias=arch.qkv_bias)
        self.out = nn.Linear(arch.hidden, arch.hidden, bias=arch.attn_out_bias)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, positions: NoPositions, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        q, k = positions.rotate(q, k)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, t, h))


def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (So et al. 2021, Primer)."""
    return F.relu(x).square()


class FeedForward(nn.Module):
    def __init__(self, arch: ArchConfig, activation):
        super().__init__()
        self.up = nn.Linear(arch.hidden, arch.ffn_inner, bias=arch.ffn_bias)
        self.down = nn.Linear(arch.ffn_inner, arch.hidden, bias=arch.ffn_bias)
        self.activation = activation

    def forward(self, x):
        return self.down(self.activation(self.up(x)))


class GatedFeedForward(nn.Module):
    """GLU variants (Shazeer 2020): down(activation(gate) * value) from one fused up-projection."""

    def __init__(self, arch: ArchConfig, activation):
        super().__init__()
        self.up = nn.Linear(arch.hidden, 2 * arch.ffn_inner, bias=arch.ffn_bias)
        self.down = nn.Linear(arch.ffn_inner, arch.hidden, bias=arch.ffn_bias)
        self.activation = activation

    def forward(self, x):
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(self.activation(gate) * value)


ACTIVATIONS = {Activation.GELU: F.gelu, Activation.RELU: F.relu, Activation.RELU2: relu2, Activation.SILU: F.silu}


def make_ffn(arch: ArchConfig) -> nn.Module:
    """The FFN of `arch.ffn_kind`: its activation and whether it gates are the vocabulary's to say."""
    activation = ACTIVATIONS[FFN_ACTIVATION[arch.ffn_kind]]
    return GatedFeedForward(arch, activation) if arch.gated else FeedForward(arch, activation)


# ---------------------------------------------------------------------------------------------
# Residual placement of the norms around a sublayer
# ---------------------------------------------------------------------------------------------


class PreNorm(nn.Module):
    """x + f(norm(x)): the stable choice that lets Cramming train at high learning rates."""

    def __init__(self, arch: ArchConfig, sublayer: nn.Module, dropout: float):
        super().__init__()
        self.norm, self.sublayer, self.dropout = make_norm(arch), sublayer, nn.Dropout(dropout)

    def forward(self, x, **kwargs):
        return x + self.dropout(self.sublayer(self.norm(x), **kwargs))


class PostNorm(PreNorm):
    """norm(x + f(x)): the original BERT/Transformer."""

    def forward(self, x, **kwargs):
        return self.norm(x + self.dropout(self.sublayer(x, **kwargs)))


class SandwichNorm(PreNorm):
    """x + norm_out(f(norm_in(x))) (Ding et al. 2021, CogView)."""

    def __init__(self, arch: ArchConfig, sublayer: nn.Module, dropout: float):
        super().__init__(arch, sublayer, dropout)
        self.norm_out = make_norm(arch)

    def forward(self, x, **kwargs):
        return x + self.dropout(self.norm_out(self.sublayer(self.norm(x), **kwargs)))


RESIDUALS = {NormPlacement.PRE: PreNorm, NormPlacement.POST: PostNorm, NormPlacement.SANDWICH: SandwichNorm}


class Block(nn.Module):
    def __init__(self, arch: ArchConfig, dropout: float):
        super().__init__()
        residual = RESIDUALS[arch.norm_placement]
        self.attention = residual(arch, SelfAttention(arch, dropout), dropout)
        self.ffn = residual(arch, make_ffn(arch), dropout)

    def forward(self, x, positions, mask):
        x = self.attention(x, positions=positions, mask=mask)
        return self.ffn(x)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class Embeddings(nn.Module):
    def __init__(self, arch: ArchConfig, positions: NoPositions, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(arch.vocab_size, arch.hidden)
        self.positions = positions
        self.segments = nn.Embedding(2, arch.hidden) if arch.segment_embeddings else None
        self.norm = make_norm(arch) if arch.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids=None):
        x = self.positions.embed(self.tokens(input_ids))
        if self.segments is not None:
            x = x + self.segments(torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        return self.dropout(self.norm(x))


class PredictionHead(nn.Module):
    """Optional BERT head transform (dense, GELU, norm), then the vocabulary projection."""

    def __init__(self, arch: ArchConfig, token_embedding: nn.Embedding):
        super().__init__()
        if arch.head_transform:
            self.transform = nn.Sequential(
                nn.Linear(arch.hidden, arch.hidden, bias=arch.ffn_bias), nn.GELU(), make_norm(arch)
            )
        else:
            self.transform = nn.Identity()
        self.decoder = nn.Linear(arch.hidden, arch.vocab_size, bias=arch.decoder_bias)
        if arch.tie_embeddings:
            self.decoder.weight = token_embedding.weight

    def forward(self, hidden):
        return self.decoder(self.transform(hidden))


POOLINGS = ("cls", "mean")


class ClassificationHead(nn.Module):
    """Cramming's GLUE head (glue.finetune, and the exported transformers model): the first
    token's state, or the mean of the real tokens' states, -> dense + tanh -> dropout -> linear."""

    def __init__(self, arch: ArchConfig, num_labels: int, dropout: float, pooling: str = "cls"):
        super().__init__()
        self.pooling = pooling
        self.pooler = nn.Linear(arch.hidden, arch.hidden)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(arch.hidden, num_labels)
        for layer in (self.pooler, self.classifier):  # the encoder's own init, as Cramming does
            nn.init.normal_(layer.weight, std=arch.init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pooling == "cls":
            summary = hidden[:, 0]
        elif attention_mask is None:
            summary = hidden.mean(1)
        else:  # mean over the real tokens, padding left out
            keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summary = (hidden * keep).sum(1) / keep.sum(1)
        return self.classifier(self.dropout(torch.tanh(self.pooler(summary))))


def padding_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, T) keep-mask -> additive (B, 1, 1, T) bias, or None when nothing is padded.

    A large finite negative instead of -inf: a fully padded row then gets uniform attention
    rather than the NaN of a softmax over all -inf.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()[:, None, None, :]
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


class CrammedBert(nn.Module):
    def __init__(self, arch: ArchConfig, dropout: float = 0.0):
        super().__init__()
        self.arch = arch
        self.embeddings = Embeddings(arch, POSITIONS[arch.position](arch), dropout)
        self.blocks = nn.ModuleList(Block(arch, dropout) for _ in range(arch.layers))
        # Only models with a layer that is local in effect have one (ArchConfig.canonical): the
        # others build no mask, as before windows existed.
        self.window = SlidingWindow(arch) if arch.canonical().local_window else None
        self.final_norm = make_norm(arch) if arch.final_norm else nn.Identity()
        self.head = PredictionHead(arch, self.embeddings.tokens)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.arch.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def positions(self) -> NoPositions:
        return self.embeddings.positions  # owned by the embeddings, used by every layer

    def encode(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, hidden)."""
        x = self.embeddings(input_ids, token_type_ids)
        mask = padding_bias(attention_mask, x.dtype)
        alibi = self.positions.attention_bias(input_ids.shape[1])
        if alibi is not None:
            mask = alibi.to(x.dtype) if mask is None else mask + alibi.to(x.dtype)
        local_mask = mask if self.window is None else self.window.restrict(mask, input_ids.shape[1], x.dtype)
        positions = self.positions
        for layer, block in enumerate(self.blocks):
            x = block(x, positions, mask if self.arch.is_global(layer) else local_mask)
        return self.final_norm(x)

    def mlm_logits(self, hidden: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Vocabulary logits: (B, T, V) densely; (B, K, V) at (B, K) integer `positions` (gathered:
        a static shape); (N, V) at the N rows a (B, T) bool mask selects."""
        if positions is not None and positions.dtype == torch.bool:
            hidden = hidden[positions]
        elif positions is not None:
            hidden = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return self.head(hidden)

    def forward(self, input_ids, labels=None, attention_mask=None, token_type_ids=None, predict_at=None):
        """MLM logits, and the loss when `labels` are given.

        Labels come in two layouts (trainer/masking.py): (B, T) with IGNORE_INDEX where not
        predicted (Hugging Face's), or (B, K) for the (B, K) positions `predict_at` (training's
        static shapes). With sparse prediction, logits are computed at the predicted positions
        only: nearly the whole CPU speed-up of a crammed model over BERT (docs/stack.md).
        """
        hidden = self.encode(input_ids, attention_mask, token_type_ids)
        if labels is None:
            return self.mlm_logits(hidden), None
        if predict_at is None:  # (B, T) labels: predict where they are not IGNORE_INDEX
            predict_at = labels != IGNORE_INDEX
            labels = labels[predict_at]
        if self.arch.sparse_prediction:
            logits = self.mlm_logits(hidden, predict_at)
            return logits, F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        logits = self.mlm_logits(hidden)  # dense: every position's logits, the loss at the predicted ones
        if predict_at.dtype == torch.bool:
            at = logits[predict_at]
        else:
            at = logits.gather(1, predict_at.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        return logits, F.cross_entropy(at.float().reshape(-1, at.shape[-1]), labels.reshape(-1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared (tied) tensors counted once

    def flops_per_token(self, seq_len: int | None = None, mlm_rate: float = DEFAULT_MLM_RATE) -> float:
        return self.arch.flops_per_token(seq_len, mlm_rate)
