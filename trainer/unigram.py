"""The unigram floor: the MLM loss a model earns by knowing token frequencies and nothing else.

A model that predicts every masked token from the train split's token frequencies, ignoring its
context, has a validation loss of

    floor = -(1 / N_val) * sum over predicted validation tokens t of log p(t)
    p(t)  = (train_count(t) + 1) / (N_train + V)                  (add-one / Laplace smoothing)

in nats, where the counts run over the packed train and validation arrays, N_train and N_val are
their token counts and V is the number of non-special ids. Special tokens ([CLS], [SEP], [PAD],
[UNK], [MASK]) are left out of both counts and of V: `trainer.masking` never selects them, so they
are never predicted. Validation masks every other position with the same probability, so the
expected unigram loss over the masked positions is this mean over all of them. The positions one
fixed validation mask picks give a slightly different number (shared Wikipedia, vocab 8192: 6.937
over all positions; 6.93 to 6.97 over the ~9,500 that masks of rate 0.15 with seeds 0-4 and 1234
pick), so a `nats_below_unigram` within about 0.05 of zero is within that noise.

Add-one smoothing keeps a validation token that never occurs in train (possible with a tokenizer
file, or [unusedN] padding ids) finite; on a real corpus it moves the floor by a negligible amount
(V / N_train is about 3e-4 on the shared Wikipedia). A model's `validation_loss` below the floor
shows it learned something beyond token frequencies: `nats_below_unigram = floor - loss`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Rows counted per np.bincount call: bounds the int64 copy of a chunk at ~8 MB whatever the corpus.
COUNT_ROWS = 8192


def token_counts(rows: np.ndarray, vocab_size: int) -> np.ndarray:
    """How often each id in [0, vocab_size) occurs in `rows` (any shape; a memmap is read in chunks)."""
    rows = rows.reshape(len(rows), -1)
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(rows), COUNT_ROWS):
        counts += np.bincount(np.asarray(rows[start : start + COUNT_ROWS]).ravel(), minlength=vocab_size)
    return counts


def unigram_floor(train: np.ndarray, validation: np.ndarray, special_ids: Iterable[int], vocab_size: int,
                  train_counts: np.ndarray | None = None) -> float:
    """Cross-entropy in nats of the train split's smoothed token frequencies on the validation
    tokens, special tokens excluded (see the module docstring). `train_counts`: `token_counts(train)`
    when the caller has them already."""
    ordinary = np.ones(vocab_size, dtype=bool)
    ordinary[list(special_ids)] = False
    train_counts = (token_counts(train, vocab_size) if train_counts is None else train_counts)[ordinary]
    validation_counts = token_counts(validation, vocab_size)[ordinary]
    log_p = np.log(train_counts + 1) - np.log(train_counts.sum() + ordinary.sum())
    return float(-(validation_counts * log_p).sum() / validation_counts.sum())
