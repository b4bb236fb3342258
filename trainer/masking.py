"""BERT's masked-language-model corruption: which tokens a batch hides and what the loss predicts.

    inputs, labels = mask_tokens(rows, 0.25, special_ids=data.special_ids, vocab_size=data.vocab_size)
    _, loss = model(inputs, labels=labels)       # cross-entropy over the positions not IGNORE_INDEX

Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) are never selected, so they are never predicted;
`trainer.unigram` leaves them out of the unigram floor for the same reason. `trainer.model`'s MLM
loss skips the positions labelled IGNORE_INDEX.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

# MLM corruption of the selected positions, as in BERT: 80% [MASK], 10% random, 10% unchanged.
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1
# Label of positions that are not predicted (the default ignore_index of cross_entropy).
IGNORE_INDEX = -100


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
    specials = torch.tensor(sorted(set(special_ids.values())), device=device)
    selected = (torch.rand(input_ids.shape, generator=generator, device=device) < rate) & ~torch.isin(
        input_ids, specials
    )
    labels = torch.where(selected, input_ids, IGNORE_INDEX)

    action = torch.rand(input_ids.shape, generator=generator, device=device)
    to_mask = selected & (action < MASK_FRACTION)
    to_random = selected & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
    all_ids = torch.arange(vocab_size, device=device)
    ordinary_ids = all_ids[~torch.isin(all_ids, specials)]
    random_ids = ordinary_ids[
        torch.randint(len(ordinary_ids), input_ids.shape, generator=generator, device=device)
    ]

    masked = torch.where(to_mask, special_ids["mask"], input_ids)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels
