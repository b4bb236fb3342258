"""The references every loss is read against (trainer/references.py), the regimes (trainer/regimes.py)
and the validation loss by corruption kind (trainer/validation.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from space.arch import ArchConfig
from trainer.model import CrammedBert
from trainer.references import (
    Shown,
    compute_references,
    context_sample,
    corruption_floor,
    shown_positions,
)
from trainer.regimes import REGIMES, describe_loss, regime, regime_of
from trainer.unigram import token_counts
from trainer.validation import validation_losses, validation_masks

SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def test_corruption_floor_by_hand():
    """Three ordinary ids 5, 6, 7 seen 3, 1 and 0 times: add-one frequencies 4/7, 2/7, 1/7. One
    position of each kind; the copying posterior written out by hand (module docstring)."""
    counts = np.array([9, 9, 9, 9, 9, 3, 1, 0])  # the specials' counts must not matter
    ordinary = np.array([False] * 5 + [True] * 3)
    shown = Shown(shown=np.array([4, 6, 7]), target=np.array([5, 6, 5]), left=np.array([2, 5, 5]),
                  right=np.array([3, 5, 5]), kind=np.array([0, 2, 1]))
    p5, p6, p7 = 4 / 7, 2 / 7, 1 / 7
    at_mask = -math.log(p5)
    unchanged = -math.log(p6 * (0.1 + 0.1 / 3) / (0.1 * p6 + 0.1 / 3))  # shown 6, and it was 6
    random = -math.log(p5 * (0.1 / 3) / (0.1 * p7 + 0.1 / 3))  # shown 7, but it was 5
    floor, by_kind = corruption_floor(counts, ordinary, shown)
    assert by_kind == pytest.approx({"mask": at_mask, "unchanged": unchanged, "random": random})
    assert floor == pytest.approx((at_mask + unchanged + random) / 3)
    assert by_kind["unchanged"] < 0.5 < by_kind["mask"]  # copying is nearly free: why the unigram floor misleads


def counting_rows(rows: int, seq_len: int, vocab_size: int, seed: int) -> np.ndarray:
    """[CLS] a a+1 a+2 ... [SEP] over the ordinary ids (wrapping): each token is fixed by either neighbour."""
    ordinary = vocab_size - len(SPECIAL_IDS)
    starts = np.random.default_rng(seed).integers(0, ordinary, size=(rows, 1))
    body = len(SPECIAL_IDS) + (starts + np.arange(seq_len - 2)) % ordinary
    cls = np.full((rows, 1), SPECIAL_IDS["cls"])
    sep = np.full((rows, 1), SPECIAL_IDS["sep"])
    return np.concatenate([cls, body, sep], axis=1).astype(np.uint16)


def references_of(train: np.ndarray, validation: np.ndarray, vocab_size: int) -> dict:
    shown = shown_positions(((ids.numpy(), labels.numpy()) for ids, labels in
                             validation_masks(validation, SPECIAL_IDS, vocab_size)), SPECIAL_IDS["mask"])
    return compute_references(train, shown, token_counts(train, vocab_size), SPECIAL_IDS.values(), vocab_size,
                              SPECIAL_IDS["mask"])


def test_context_reference_knows_a_deterministic_neighbour_rule():
    vocab_size = 37  # 32 ordinary ids
    references = references_of(counting_rows(2000, 24, vocab_size, seed=0),
                               counting_rows(128, 24, vocab_size, seed=1), vocab_size)
    # Every ordinary id is equally frequent, so frequencies tell nothing at [MASK]: log 32 nats ...
    assert references["corruption_floor_by_kind"]["mask"] == pytest.approx(math.log(32), abs=0.05)
    # ... while the neighbours give the token away (the rare position with both neighbours masked
    # too falls back to frequencies: the small rest).
    assert references["context_reference_by_kind"]["mask"] < 0.1
    assert references["context_reference"] < 0.1 < references["corruption_floor"]
    assert not references["context_reference_sampled"]
    assert references["predicted_positions"] > 100


def test_context_reference_of_a_large_corpus_comes_from_a_sample_and_says_so(monkeypatch):
    train = counting_rows(100, 16, 21, seed=0)
    sample, rows = context_sample(train, max_tokens=16 * 10)
    assert rows == len(sample) == 10 and sample[0].tolist() == train[0].tolist()
    assert context_sample(train, max_tokens=10**9)[1] == 100
    monkeypatch.setattr("trainer.references.CONTEXT_MAX_TOKENS", 16 * 10)
    references = references_of(train, counting_rows(64, 16, 21, seed=1), 21)
    assert references["context_reference_sampled"] and references["context_reference_rows"] == 10


@pytest.mark.parametrize(("loss", "expected"), [(5.84, "plateau"), (5.80, "neighbours"), (3.30, "neighbours"),
                                                (3.10, "beyond-ngrams")])
def test_regime_thresholds(loss, expected):
    assert regime(loss, corruption_floor=5.856, context_reference=3.19) == expected
    assert expected in REGIMES


def test_regime_of_recorded_metrics_and_the_words():
    assert regime_of({"validation_loss": 3.0, "corruption_floor": 5.9, "context_reference": 3.2}) == "beyond-ngrams"
    assert regime_of({"validation_loss": 3.0}) is None  # recorded before the references existed
    line = describe_loss(5.83, unigram=6.39, corruption=5.856, context=3.19)
    assert line.startswith("regime plateau: 0.026 nats below the corruption floor 5.856")


@pytest.mark.slow
def test_validation_loss_by_kind_adds_up_to_the_total(wiki_slice):
    """The parts by kind weigh up to the total, and the total is the model's own MLM loss over the mask."""
    arch = ArchConfig(layers=1, hidden=32, heads=2, vocab_size=wiki_slice.vocab_size, max_seq_len=wiki_slice.seq_len)
    torch.manual_seed(0)
    model = CrammedBert(arch)
    total, by_kind = validation_losses(model, wiki_slice, torch.device("cpu"))
    assert set(by_kind) == {"mask", "random", "unchanged"}
    counts = {"mask": 0, "random": 0, "unchanged": 0}
    own_sum, own_count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for ids, labels in validation_masks(wiki_slice.validation, wiki_slice.special_ids, wiki_slice.vocab_size):
            predicted = labels >= 0
            counts["mask"] += int((ids[predicted] == wiki_slice.special_ids["mask"]).sum())
            counts["unchanged"] += int((ids[predicted] == labels[predicted]).sum())
            _, loss = model(ids, labels=labels)
            own_sum, own_count = own_sum + float(loss) * int(predicted.sum()), own_count + int(predicted.sum())
    counts["random"] = own_count - counts["mask"] - counts["unchanged"]
    assert counts["mask"] > 5 * counts["random"] > 0  # 80/10/10
    assert total == pytest.approx(own_sum / own_count, rel=1e-5)
    assert total == pytest.approx(sum(by_kind[k] * counts[k] for k in counts) / own_count, rel=1e-5)


@pytest.mark.slow
def test_prepared_data_carries_the_references(wiki_slice):
    references = wiki_slice.manifest["references"]
    assert wiki_slice.context_reference < wiki_slice.corruption_floor < wiki_slice.unigram_floor
    assert set(references["corruption_floor_by_kind"]) == {"mask", "random", "unchanged"}
    assert references["predicted_positions"] > 0


def test_the_report_warns_when_most_complete_trials_are_in_the_plateau():
    import pandas as pd

    from dashboards.analysis import plateau_warning, regime_column

    def trials(losses, states=None):
        return pd.DataFrame({"state": states or ["complete"] * len(losses), "metrics.validation_loss": losses,
                             "metrics.corruption_floor": 5.856, "metrics.context_reference": 3.192})

    plateau = trials([5.85, 5.83, 5.9, 4.5])
    assert list(regime_column(plateau)) == ["plateau", "plateau", "plateau", "neighbours"]
    assert plateau_warning(plateau).startswith("3 of 4 complete trials ended in the plateau")
    assert plateau_warning(trials([5.85, 4.5, 3.0])) is None  # most left it
    # Pruned trials do not count: the warning is about what complete trials reached.
    assert plateau_warning(trials([5.85, 5.85, 4.5], ["pruned", "pruned", "complete"])) is None
    old = pd.DataFrame({"state": ["complete"], "metrics.validation_loss": [5.9], "metrics.corruption_floor": [float("nan")],
                        "metrics.context_reference": [float("nan")]})
    assert plateau_warning(old) is None and list(regime_column(old)) == [None]  # logged before the references
