"""Diverging steps: a non-finite loss or a spike is rolled back to the last good state and recorded;
one that keeps coming back ends the run after `max_rollbacks` with the reason."""

from __future__ import annotations

import math

import pytest
import torch

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB
from trainer.budget import Budget
from trainer.config import ConfigError, TrainConfig
from trainer.cram import cram_with_model
from trainer.loop import Trainer
from trainer.rollback import SPIKE_MIN_HISTORY, LossSpike, NonFiniteLoss, RollbackGuard

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
# One micro-batch per step, so forward pass n is step n - 1; a copy every 4 steps.
TRAIN = TrainConfig(batch_size=8, micro_batch=8, seed=1, snapshot_every=4)
BUDGET = Budget.parse(f"{30 * 8 * SLICE_SEQ}tokens")


def poison_weights_at(monkeypatch, forwards: set[int] | None, first: int = 0) -> list[int]:
    """From forward pass `first` on (or at those in `forwards`), fill a weight with NaN before the pass:
    the loss turns non-finite through the model itself."""
    original, calls = Trainer.forward_backward, []

    def poisoned(self, rows, scale):
        calls.append(len(rows))
        if (forwards is None and len(calls) >= first) or (forwards is not None and len(calls) in forwards):
            with torch.no_grad():
                next(self.model.parameters()).fill_(math.nan)
        return original(self, rows, scale)

    monkeypatch.setattr(Trainer, "forward_backward", poisoned)
    return calls


def test_a_nan_step_is_rolled_back_and_the_run_completes(wiki_slice, monkeypatch):
    poison_weights_at(monkeypatch, {11})  # step 10: the last copy was taken before step 8
    model, result = cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET)
    assert result.tokens == BUDGET.amount  # the skipped batches' tokens count: the budget was spent on them
    assert result.rollbacks == [{"step": 10, "tokens": 11 * 8 * SLICE_SEQ, "loss": None, "reason": "non-finite loss nan",
                                 "action": "restored the state before step 8 from memory, skipped 3 batches"}]
    assert math.isfinite(result.validation_loss) and all(torch.isfinite(p).all() for p in model.parameters())
    assert result.to_dict()["rollbacks"] == result.rollbacks  # what result.json holds


def test_a_nan_every_step_fails_after_max_rollbacks(wiki_slice, monkeypatch):
    poison_weights_at(monkeypatch, None, first=6)
    with pytest.raises(NonFiniteLoss) as info:
        cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET)
    assert str(info.value) == ("training loss became nan at step 5 after 3 rollbacks (train.max_rollbacks); "
                               "lower lr or check the architecture")


def test_a_spike_is_rolled_back_unless_spike_detection_is_off(wiki_slice, monkeypatch):
    original, calls = Trainer.forward_backward, []

    def spiking(self, rows, scale):
        calls.append(1)
        loss = original(self, rows, scale)
        return 100 * loss if len(calls) == 15 else loss

    monkeypatch.setattr(Trainer, "forward_backward", spiking)
    _, result = cram_with_model(ARCH, TRAIN, wiki_slice, BUDGET)
    [record] = result.rollbacks
    assert record["step"] == 14 and record["loss"] > 100 and record["reason"].startswith(f"loss {record['loss']:.4g} > 4 x")
    calls.clear()
    _, unguarded = cram_with_model(ARCH, TrainConfig(**{**TRAIN.to_dict(), "spike_factor": 0.0}), wiki_slice, BUDGET)
    assert unguarded.rollbacks == [] and max(loss for _, loss in unguarded.loss_curve) > 100


def test_the_guard_needs_history_before_it_calls_a_spike():
    model = torch.nn.Linear(2, 2)
    guard = RollbackGuard(TRAIN, model, torch.optim.AdamW(model.parameters()), [], [])
    assert guard.verdict(1e6) is None  # no history yet: the first losses may be anything
    for step in range(SPIKE_MIN_HISTORY):
        guard.accept(step, 2.0, batches_before=step)
    assert guard.verdict(7.9) is None and guard.verdict(8.1).startswith("loss 8.1 > 4 x recent median 2")
    assert guard.verdict(math.inf) == "non-finite loss inf"
    with pytest.raises(LossSpike, match=r"^training loss spiked at step 9 \(why\) after 0 rollbacks"):
        RollbackGuard(TrainConfig(max_rollbacks=0), model, guard.optimizer, [], []).roll_back(9, 0, 9.0, "why", 0)


@pytest.mark.parametrize("setting,value,message", [
    ("spike_factor", 0.5, "train.spike_factor: must be above 1 (or 0: off), got 0.5"),
    ("max_rollbacks", -1, "train.max_rollbacks: must not be negative, got -1"),
    ("snapshot_every", 0, "train.snapshot_every: must be positive, got 0"),
])
def test_recovery_settings_are_checked(setting, value, message):
    with pytest.raises(ConfigError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**{setting: value})


def test_a_trial_reports_its_rollbacks():
    from search.study.report import trial_metrics

    result = {key: 0.0 for key in ("validation_loss", "unigram_floor", "nats_below_unigram", "corruption_floor",
                                   "nats_below_floor", "context_reference", "tokens", "tokens_per_s", "params",
                                   "flops_per_token", "seconds", "validation_seconds", "steps", "oom_halvings")}
    result["validation_loss_by_kind"] = {"mask": 0.0, "random": 0.0, "unchanged": 0.0}
    assert trial_metrics({**result, "rollbacks": [{"step": 3}, {"step": 9}]}, None)["rollbacks"] == 2.0
