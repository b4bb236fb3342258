"""The held-out MLM loss every result reports, on one fixed mask, in total and by corruption kind.

    loss, by_kind = validation_losses(model, data, device)   # by_kind: {"mask": .., "random": .., "unchanged": ..}

The validation rows are masked once the same way for every model (`validation_masks`: a fixed
seed, BERT's standard rate, batches of 64 in order), so losses of different recipes and trials are
comparable, and the references of `trainer.references` are computed on exactly these positions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from trainer.device import autocast
from trainer.masking import IGNORE_INDEX, mask_tokens
from trainer.references import CORRUPTION_KINDS

if TYPE_CHECKING:
    from trainer.data import PretrainData
    from trainer.model import CrammedBert

# Validation masks at BERT's standard rate whatever the recipe trains with, so losses of different
# recipes (Cramming trains at 0.25, BERT at 0.15) and of different trials are comparable.
VALIDATION_MLM_RATE = 0.15
VALIDATION_SEED = 1234
VALIDATION_BATCH = 64  # the mask depends on the batch shapes drawn: one size, everywhere


def validation_masks(validation: np.ndarray, special_ids: Mapping[str, int],
                     vocab_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(corrupted ids, labels) of the validation rows in batches, the same on every call."""
    generator = torch.Generator().manual_seed(VALIDATION_SEED)
    for start in range(0, len(validation), VALIDATION_BATCH):
        rows = torch.from_numpy(validation[start:start + VALIDATION_BATCH].astype(np.int64))
        yield mask_tokens(rows, VALIDATION_MLM_RATE, special_ids=special_ids, vocab_size=vocab_size,
                          generator=generator)


def corruption_kind(ids: torch.Tensor, labels: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Index into CORRUPTION_KINDS of each position: what the model was shown there."""
    return torch.where(ids == mask_id, 0, torch.where(ids == labels, 2, 1))


# Eager even when the trainer compiled the model's blocks in place (`Trainer.compiled`): validation's
# batch, padding and eval mode differ from training's, and each would compile the blocks again.
@torch.compiler.set_stance("force_eager")
@torch.no_grad()
def validation_losses(model: CrammedBert, data: PretrainData, device: torch.device) -> tuple[float, dict[str, float]]:
    """Mean MLM loss over the fixed validation mask's predicted positions, and the same mean over
    the positions shown [MASK], a random token and the unchanged token."""
    model.eval()
    sums, counts = torch.zeros(len(CORRUPTION_KINDS), dtype=torch.float64), torch.zeros(len(CORRUPTION_KINDS))
    for ids, labels in validation_masks(data.validation, data.special_ids, data.vocab_size):
        predicted = labels != IGNORE_INDEX
        with autocast(device):
            logits, _ = model(ids.to(device), labels=labels.to(device))
        if logits.dim() == 3:  # dense prediction: logits at every position
            logits = logits[predicted.to(device)]
        losses = F.cross_entropy(logits.float(), labels[predicted].to(device), reduction="none").double().cpu()
        kinds = corruption_kind(ids, labels, data.special_ids["mask"])[predicted]
        sums += torch.bincount(kinds, weights=losses, minlength=len(CORRUPTION_KINDS))
        counts += torch.bincount(kinds, minlength=len(CORRUPTION_KINDS))
    model.train()
    by_kind = {name: float(sums[k] / counts[k]) for k, name in enumerate(CORRUPTION_KINDS) if counts[k]}
    return float(sums.sum() / max(counts.sum(), 1)), by_kind


def validation_loss(model: CrammedBert, data: PretrainData, device: torch.device) -> float:
    """`validation_losses`' total alone: the number intermediate validation curves record."""
    return validation_losses(model, data, device)[0]
