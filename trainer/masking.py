"""BERT's masked-language-model corruption: which tokens a batch hides and what the loss predicts.

Two ways to choose the hidden tokens, both with BERT's 80/10/10 corruption:

    inputs, labels = mask_tokens(rows, 0.15, special_ids=data.special_ids, vocab_size=data.vocab_size)
    _, loss = model(inputs, labels=labels)       # labels (B, T): IGNORE_INDEX where not predicted

    batch = mask_fixed_count(rows, 0.25, special_ids=data.special_ids, vocab_size=data.vocab_size)
    _, loss = model(batch.input_ids, labels=batch.labels, predict_at=batch.positions)   # (B, K) each

`mask_tokens` selects each token independently (Hugging Face's collator; validation uses it, so
held-out losses stay comparable across recipes). Training uses `mask_fixed_count`: K =
round(rate x T) positions per row, as the original BERT's pretraining data did
(`max_predictions_per_seq`), so every batch has the same shape: the compiled step never
recompiles, and predicting at K gathered positions needs no boolean indexing (a graph break and a
host-device sync per step).

Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) are never selected, so they are never predicted;
`trainer.unigram` leaves them out of the unigram floor for the same reason. `trainer.model`'s MLM
loss skips the positions labelled IGNORE_INDEX.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple

import torch

# MLM corruption of the selected positions, as in BERT: 80% [MASK], 10% random, 10% unchanged.
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1
# Label of positions that are not predicted (the default ignore_index of cross_entropy).
IGNORE_INDEX = -100


@functools.lru_cache(maxsize=8)
def special_token_ids(specials: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The special ids as a tensor on `device`, built once per vocabulary: a tensor made from
    Python data in every micro-step would be a blocking host-to-device copy each time."""
    return torch.tensor(specials, device=device)


@functools.lru_cache(maxsize=8)
def ordinary_token_ids(vocab_size: int, specials: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The ids that are not special, in order, on `device`: built once per vocabulary, not in
    every micro-step, and with a stable sort instead of a boolean index, whose result size the
    host would have to wait for."""
    all_ids = torch.arange(vocab_size, device=device)
    is_special = torch.isin(all_ids, special_token_ids(specials, device)).to(torch.int8)
    return all_ids[torch.argsort(is_special, stable=True)[:vocab_size - len(specials)]]


def _specials(special_ids: Mapping[str, int]) -> tuple[int, ...]:
    """The special ids as the cache key of `special_token_ids` and `ordinary_token_ids`."""
    return tuple(sorted(set(special_ids.values())))


def mask_tokens(
    input_ids: torch.Tensor,
    rate: float = 0.25,
    *,
    special_ids: Mapping[str, int],
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's MLM corruption of a batch (B, T), as Cramming and Hugging Face's collator do it.

    Every position that is not a special token is selected independently with probability
    `rate` (Bernoulli: the count per row varies around rate x maskable positions). Of the
    selected positions, 80% become [MASK], 10% a uniformly drawn non-special token and 10% stay
    as they are. Returns (masked_input_ids, labels); labels hold the original token at selected
    positions and IGNORE_INDEX (-100) elsewhere. The input is not modified.
    """
    device = input_ids.device
    specials = special_token_ids(_specials(special_ids), device)
    selected = (torch.rand(input_ids.shape, generator=generator, device=device) < rate) & ~torch.isin(
        input_ids, specials
    )
    labels = torch.where(selected, input_ids, IGNORE_INDEX)

    action = torch.rand(input_ids.shape, generator=generator, device=device)
    to_mask = selected & (action < MASK_FRACTION)
    to_random = selected & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
    ordinary_ids = ordinary_token_ids(vocab_size, _specials(special_ids), device)
    random_ids = ordinary_ids[
        torch.randint(len(ordinary_ids), input_ids.shape, generator=generator, device=device)
    ]

    masked = torch.where(to_mask, special_ids["mask"], input_ids)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels


class MaskedBatch(NamedTuple):
    input_ids: torch.Tensor  # (B, T) corrupted
    positions: torch.Tensor  # (B, K) where the loss predicts
    labels: torch.Tensor  # (B, K) the original tokens there; IGNORE_INDEX where a row had too few ordinary tokens


def predictions_per_row(seq_len: int, rate: float) -> int:
    """K: the positions `mask_fixed_count` predicts in every row of length `seq_len`."""
    return max(1, min(seq_len, round(rate * seq_len)))


def mask_fixed_count(
    input_ids: torch.Tensor,
    rate: float = 0.25,
    *,
    special_ids: Mapping[str, int],
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> MaskedBatch:
    """BERT's corruption of `predictions_per_row(T, rate)` random ordinary tokens per row of (B, T).

    Static shapes, no host sync: the positions are the top K of random scores in which special
    tokens score below every ordinary one, so a row with fewer than K ordinary tokens picks
    specials, labelled IGNORE_INDEX (never predicted, as in `mask_tokens`). `generator` must be on
    `input_ids`' device: masking runs where the batch is.
    """
    device = input_ids.device
    specials = special_token_ids(_specials(special_ids), device)
    count = predictions_per_row(input_ids.shape[1], rate)
    scores = torch.rand(input_ids.shape, generator=generator, device=device)
    scores = scores.masked_fill(torch.isin(input_ids, specials), -1.0)
    picked_scores, positions = scores.topk(count, dim=1, sorted=False)
    ordinary = picked_scores >= 0
    originals = input_ids.gather(1, positions)
    labels = torch.where(ordinary, originals, IGNORE_INDEX)

    action = torch.rand(positions.shape, generator=generator, device=device)
    ordinary_ids = ordinary_token_ids(vocab_size, _specials(special_ids), device)
    random_ids = ordinary_ids[torch.randint(len(ordinary_ids), positions.shape, generator=generator, device=device)]
    replaced = torch.where(action < MASK_FRACTION, special_ids["mask"], originals)
    replaced = torch.where((action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION), random_ids, replaced)
    corrupted = input_ids.scatter(1, positions, torch.where(ordinary, replaced, originals))
    return MaskedBatch(corrupted, positions, labels)
