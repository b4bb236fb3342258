"""What a validation loss is read against: the lines a model must cross to have learned anything.

Three references, each computed once per prepared dataset on the validation set's own fixed mask
(`trainer.validation.validation_masks`, the positions and corruption every validation loss uses):

- `unigram_floor` (trainer/unigram.py): token frequencies alone, blind to the input.
- `corruption_floor`: token frequencies plus what BERT's corruption gives away for free. Of the
  predicted positions 80% show [MASK], 10% a random ordinary token and 10% the original token. A
  model that has learned nothing but frequencies and this rule still copies: shown an ordinary
  token `x` at a predicted position, the original is `x` with posterior

      P(t = x | shown x) = p(x) (0.1 + 0.1 / V) / (0.1 p(x) + 0.1 / V)

  and any other `t` has p(t) (0.1 / V) / (0.1 p(x) + 0.1 / V) (V ordinary ids, from which the
  random replacement is drawn uniformly). This is the "learned nothing" line: a loss between the
  unigram floor and it is copying the unchanged tokens, not language.
- `context_reference`: a count model that predicts a masked token from its two neighbours as the
  model sees them (`two_neighbour_model`), with the same corruption posterior. A neural model that
  does not beat it has learned no more than bigram statistics.

`trainer.regimes` names where a loss stands among them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from trainer.masking import MASK_FRACTION, RANDOM_FRACTION

# Kinds of predicted position by what the model was shown there (BERT's 80/10/10 corruption).
CORRUPTION_KINDS = ("mask", "random", "unchanged")

# Absolute discount of the count model's interpolation (Ney, Essen & Kneser 1994's usual 0.75).
DISCOUNT = 0.75
# At most this many train tokens feed the count model, so that it takes under a minute and 2 GB:
# the whole shared Wikipedia (38M tokens at the CPU profile) does; a larger corpus is sampled
# (whole rows, evenly spaced), and the manifest says so (`context_reference_sampled`).
CONTEXT_MAX_TOKENS = 50_000_000
# Rows counted at once (~2M tokens at rows of 64): bounds the temporary key arrays.
COUNT_ROWS = 32768


@dataclass(frozen=True)
class Shown:
    """The fixed validation mask, flattened to its predicted positions: what the model saw there
    (`shown`), the original token (`target`), the neighbours it saw on each side, and the kind."""

    shown: np.ndarray
    target: np.ndarray
    left: np.ndarray
    right: np.ndarray
    kind: np.ndarray  # index into CORRUPTION_KINDS


def shown_positions(masked_rows: Iterable[tuple[np.ndarray, np.ndarray]], mask_id: int) -> Shown:
    """`Shown` from (corrupted ids, labels) batches of (B, T), labels IGNORE_INDEX (<0) where not
    predicted. A position's neighbours are its row neighbours as corrupted; predicted positions
    are never at a row's ends ([CLS] and [SEP] are never selected)."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ("shown", "target", "left", "right")}
    for ids, labels in masked_rows:
        rows, cols = np.nonzero(labels >= 0)
        parts["shown"].append(ids[rows, cols])
        parts["target"].append(labels[rows, cols])
        parts["left"].append(ids[rows, np.maximum(cols - 1, 0)])
        parts["right"].append(ids[rows, np.minimum(cols + 1, ids.shape[1] - 1)])
    shown, target, left, right = (np.concatenate(parts[name]).astype(np.int64) for name in parts)
    kind = np.where(shown == mask_id, 0, np.where(shown == target, 2, 1))
    return Shown(shown, target, left, right, kind)


def corrupted_log_likelihood(p_target: np.ndarray, p_shown: np.ndarray, shown: Shown, ordinary: int) -> np.ndarray:
    """log P(target | what was shown) for a predictor whose context alone gives p(target) and
    p(shown), knowing BERT's corruption (module docstring). At [MASK] that is just log p(target)."""
    keep = 1.0 - MASK_FRACTION - RANDOM_FRACTION  # the unchanged share; equal to the random share in BERT
    uniform = RANDOM_FRACTION / ordinary
    evidence = keep * p_shown + uniform
    likelihood = np.where(shown.target == shown.shown, p_target * (keep + uniform), p_target * uniform) / evidence
    return np.where(shown.kind == 0, np.log(p_target), np.log(likelihood))


def unigram_probabilities(train_counts: np.ndarray, ordinary: np.ndarray) -> np.ndarray:
    """Add-one smoothed frequencies over the ordinary ids (0 for specials), as trainer/unigram.py."""
    p = np.where(ordinary, train_counts + 1, 0).astype(np.float64)
    return p / p.sum()


def loss_by_kind(log_likelihood: np.ndarray, shown: Shown) -> tuple[float, dict[str, float]]:
    """Mean negative log-likelihood over every predicted position, and over each corruption kind."""
    by_kind = {name: float(-log_likelihood[shown.kind == k].mean()) for k, name in enumerate(CORRUPTION_KINDS)
               if (shown.kind == k).any()}
    return float(-log_likelihood.mean()), by_kind


def corruption_floor(train_counts: np.ndarray, ordinary: np.ndarray, shown: Shown) -> tuple[float, dict[str, float]]:
    """The frequency-only predictor's loss under the corruption rule, and by kind (module docstring)."""
    p = unigram_probabilities(train_counts, ordinary)
    return loss_by_kind(corrupted_log_likelihood(p[shown.target], p[shown.shown], shown, int(ordinary.sum())), shown)


class TwoNeighbourModel:
    """P(t | left, right) from counts of (left, t, right) in the train rows: interpolated absolute
    discounting (Ney, Essen & Kneser 1994) backing off to the mean of the left- and right-bigram
    models, each backing off to add-one unigram frequencies. Every level is a proper distribution
    over the ordinary ids. An unknown neighbour (a [MASK], or one never seen) drops that side."""

    def __init__(self, rows: np.ndarray, vocab_size: int, ordinary: np.ndarray, unknown: int):
        self.vocab_size, self.unknown = vocab_size, unknown
        v = np.int64(vocab_size)
        # Keys: (left, t, right) -> (left V + t) V + right; (side, t) -> side V + t. Contexts drop t.
        contexts = {"trigram": lambda k: k // (v * v) * (v * v) + k % v,
                    "left": lambda k: k - k % v, "right": lambda k: k - k % v}
        chunks: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {name: [] for name in contexts}
        target_counts = np.zeros(vocab_size, dtype=np.int64)
        for start in range(0, len(rows), COUNT_ROWS):  # in chunks: memory stays bounded whatever the corpus
            block = np.asarray(rows[start:start + COUNT_ROWS], dtype=np.int64)
            left, target, right = block[:, :-2].ravel(), block[:, 1:-1].ravel(), block[:, 2:].ravel()
            keep = ordinary[target]  # specials are never predicted
            left, target, right = left[keep], target[keep], right[keep]
            target_counts += np.bincount(target, minlength=vocab_size)
            for name, keys in (("trigram", (left * v + target) * v + right), ("left", left * v + target),
                               ("right", right * v + target)):
                chunks[name].append(np.unique(keys, return_counts=True))
        self.unigram = unigram_probabilities(target_counts, ordinary)
        self.trigram, self.left_bigram, self.right_bigram = (_Level(chunks.pop(name), contexts[name])
                                                             for name in ("trigram", "left", "right"))

    def probability(self, target: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """P(target | left, right) for aligned arrays of ids."""
        v = np.int64(self.vocab_size)
        unigram = self.unigram[target]
        from_left = self.left_bigram.interpolate(left * v + target, unigram)
        from_right = self.right_bigram.interpolate(right * v + target, unigram)
        left_known, right_known = left != self.unknown, right != self.unknown
        backoff = np.where(left_known & right_known, (from_left + from_right) / 2,
                           np.where(left_known, from_left, np.where(right_known, from_right, unigram)))
        both = self.trigram.interpolate((left * v + target) * v + right, backoff)
        return np.where(left_known & right_known, both, backoff)


class _Level:
    """One n-gram level: counts of (context, token) keys and of their contexts, looked up by
    binary search in sorted arrays (no dict of tens of millions of Python ints)."""

    def __init__(self, chunks: list[tuple[np.ndarray, np.ndarray]], context_of: Callable[[np.ndarray], np.ndarray]):
        """`chunks`: (unique keys, counts) of parts of the rows, merged here."""
        self.keys, inverse = np.unique(np.concatenate([keys for keys, _ in chunks]), return_inverse=True)
        self.counts = np.bincount(inverse, weights=np.concatenate([counts for _, counts in chunks])).astype(np.int64)
        self.context_of = context_of
        # Per context: its total count and its number of distinct tokens (the N1+ of the interpolation).
        self.contexts, inverse = np.unique(context_of(self.keys), return_inverse=True)
        self.context_totals = np.bincount(inverse, weights=self.counts)
        self.context_types = np.bincount(inverse)

    def interpolate(self, keys: np.ndarray, lower: np.ndarray) -> np.ndarray:
        """Discounted counts of `keys`, the discounted mass spread by `lower`; `lower` where the
        context was never seen."""
        count = _lookup(self.keys, self.counts, keys)
        contexts = self.context_of(keys)
        total = _lookup(self.contexts, self.context_totals, contexts).astype(np.float64)
        types = _lookup(self.contexts, self.context_types, contexts)
        mixed = (np.maximum(count - DISCOUNT, 0.0) + DISCOUNT * types * lower) / np.maximum(total, 1.0)
        return np.where(total > 0, mixed, lower)


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == keys, values[at], 0)


def context_sample(train: np.ndarray, max_tokens: int | None = None) -> tuple[np.ndarray, int]:
    """The train rows the count model is built from: all of them, or an evenly spaced sample of
    whole rows holding about `max_tokens` (default CONTEXT_MAX_TOKENS); with how many rows that is."""
    wanted = max(1, (max_tokens or CONTEXT_MAX_TOKENS) // train.shape[1])
    if wanted >= len(train):
        return train, len(train)
    return train[np.linspace(0, len(train) - 1, wanted).astype(np.int64)], wanted


def compute_references(train: np.ndarray, shown: Shown, train_counts: np.ndarray, special_ids: Iterable[int],
                       vocab_size: int, mask_id: int) -> dict:
    """Every reference of one prepared dataset, as its manifest keeps them (`references`)."""
    start = time.perf_counter()
    ordinary = np.ones(vocab_size, dtype=bool)
    ordinary[list(special_ids)] = False
    floor, floor_by_kind = corruption_floor(train_counts, ordinary, shown)
    sample, sample_rows = context_sample(train)
    model = TwoNeighbourModel(sample, vocab_size, ordinary, unknown=mask_id)
    p_target = model.probability(shown.target, shown.left, shown.right)
    p_shown = np.where(ordinary[shown.shown], model.probability(shown.shown, shown.left, shown.right), 0.0)
    context, context_by_kind = loss_by_kind(corrupted_log_likelihood(p_target, p_shown, shown, int(ordinary.sum())),
                                            shown)
    return {
        "corruption_floor": floor,
        "corruption_floor_by_kind": floor_by_kind,
        "context_reference": context,
        "context_reference_by_kind": context_by_kind,
        "context_reference_rows": sample_rows,
        "context_reference_sampled": sample_rows < len(train),
        "predicted_positions": int(len(shown.target)),
        "seconds": round(time.perf_counter() - start, 2),
    }
