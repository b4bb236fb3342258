"""`search.run` warns, before any trial, when a trial's budget would read the corpus more than once."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from search.run import repeat_warning_for_study
from space import load_space
from tests.helpers import ROOT
from trainer.budget import Budget
from trainer.config import TrainConfig

SPACE = load_space(ROOT / "tests" / "search_files" / "tiny_space.yaml")
TRAIN = TrainConfig(mlm_rate=0.25, micro_batch=8)


def corpus(sequences: int, seq_len: int = 64):
    """What the warning reads of prepared data: the train rows and their length."""
    return SimpleNamespace(train=np.zeros((sequences, seq_len), dtype=np.uint16), seq_len=seq_len)


def test_a_token_budget_beyond_the_corpus_warns_once_per_study():
    data = corpus(1000)  # 64,000 tokens
    warning = repeat_warning_for_study(Budget.parse("2e5tokens"), SPACE, TRAIN, data)
    assert warning is not None and warning.startswith("warning:") and "3.1 times" in warning
    assert "per trial" in warning and "--corpus" in warning
    assert repeat_warning_for_study(Budget.parse("6e4tokens"), SPACE, TRAIN, data) is None


def test_a_flop_budget_is_judged_on_the_cheapest_architecture():
    data = corpus(1000)  # 64,000 tokens
    rng = random.Random(1)
    costs = [SPACE.sample_random(rng).flops_per_token(64, 0.25) for _ in range(200)]
    # Twice the corpus even at the dearest architecture's cost: every trial would repeat it.
    assert repeat_warning_for_study(Budget("flops", 2 * 64_000 * max(costs), "f"), SPACE, TRAIN, data)
    # Half the corpus at the cheapest's cost (a third of the dearest's): no trial reads it twice.
    assert max(costs) > 3 * min(costs)
    assert repeat_warning_for_study(Budget("flops", 0.5 * 64_000 * min(costs), "f"), SPACE, TRAIN, data) is None


def test_a_wall_clock_budget_times_the_cheapest_architecture_first(wiki_slice):
    # Any speed reads the slice many times over in a week (168 h); none reads it in a millisecond.
    warning = repeat_warning_for_study(Budget.parse("168h"), SPACE, TRAIN, wiki_slice)
    assert warning is not None and "tokens/s (timed before training)" in warning and "per trial" in warning
    assert repeat_warning_for_study(Budget.parse("0.001s"), SPACE, TRAIN, wiki_slice) is None
