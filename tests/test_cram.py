"""The budgeted cramming loop: budgets, schedules, determinism, learning, checkpoints, failures."""

from __future__ import annotations

import math
import weakref

import pytest
import torch
import yaml

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB, FakeTime
from trainer.budget import Budget, BudgetError, micro_batches_per_step, triangle_lr
from trainer.checkpoint import load_checkpoint
from trainer.config import TrainConfig
from trainer.cram import NonFiniteLoss, cram
from trainer.loop import Trainer, validation_loss
from trainer.model import CrammedBert

ARCH = ArchConfig(layers=2, hidden=64, heads=4, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
TRAIN = TrainConfig(batch_size=32, micro_batch=8, seed=3)


# ---- budgets and schedules ----------------------------------------------------------------------

@pytest.mark.parametrize("text,kind,amount", [
    ("60s", "seconds", 60), ("5m", "seconds", 300), ("24h", "seconds", 86400), ("1.5h", "seconds", 5400),
    ("2e7tokens", "tokens", 2e7), ("1e15flops", "flops", 1e15), (" 30S ", "seconds", 30),
])
def test_budget_parses_every_unit(text, kind, amount):
    budget = Budget.parse(text)
    assert (budget.kind, budget.amount) == (kind, amount)


@pytest.mark.parametrize("text", ["60", "5 minutes", "2e7tok", "-5m", "0s", "abc", ""])
def test_budget_rejects_bad_text_with_the_fix(text):
    with pytest.raises(BudgetError, match="budget: .*(60s|write e.g.)"):
        Budget.parse(text)


def test_triangle_lr_is_cramming_budget_triangle2():
    assert triangle_lr(0.0) == pytest.approx(0.25)
    assert triangle_lr(0.75) == pytest.approx(1.0)
    assert triangle_lr(1.0) == pytest.approx(0.0)
    assert triangle_lr(0.875) == pytest.approx(0.5)
    values = [triangle_lr(i / 100) for i in range(101)]
    peak = values.index(max(values))
    assert all(a <= b for a, b in zip(values[:peak], values[1:peak + 1]))
    assert all(a >= b for a, b in zip(values[peak:], values[peak + 1:]))


def test_batch_ramp_reaches_target_at_ramp_fraction():
    steps = [micro_batches_per_step(i / 100, 8192, 128, 0.6) for i in range(101)]
    assert steps[0] == 1 and steps[60] == 64 and steps[100] == 64
    assert all(a <= b for a, b in zip(steps, steps[1:]))
    assert micro_batches_per_step(0.3, 8192, 128, 0.6) == 32
    assert micro_batches_per_step(0.0, 256, 128, 0.0) == 2  # no ramp


# ---- the loop on real text --------------------------------------------------------------------

@pytest.mark.slow
def test_token_budget_is_exact_and_runs_are_reproducible(wiki_slice):
    tokens = 37 * SLICE_SEQ  # not a multiple of the micro-batch: the last one, which does not fit whole, is dropped
    first = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{tokens}tokens"))
    second = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{tokens}tokens"))
    assert first.tokens == 32 * SLICE_SEQ and first.micro_steps == 4
    assert first.unigram_floor == wiki_slice.unigram_floor > 0
    assert first.nats_below_unigram == pytest.approx(first.unigram_floor - first.validation_loss)
    assert first.corruption_floor == wiki_slice.corruption_floor
    assert first.nats_below_floor == pytest.approx(first.corruption_floor - first.validation_loss)
    assert first.regime == "plateau" and set(first.validation_loss_by_kind) == {"mask", "random", "unchanged"}
    assert {"validation_loss", "unigram_floor", "nats_below_unigram", "context_reference"} <= set(first.to_dict())
    assert first.loss_curve == second.loss_curve
    assert first.validation_loss == second.validation_loss
    other_seed = cram(ARCH, TrainConfig(batch_size=32, micro_batch=8, seed=4), wiki_slice,
                      Budget.parse(f"{tokens}tokens"))
    assert other_seed.validation_loss != first.validation_loss


def test_flop_budget_stops_at_its_token_equivalent(wiki_slice):
    per_token = ARCH.flops_per_token(SLICE_SEQ, TRAIN.mlm_rate)
    result = cram(ARCH, TRAIN, wiki_slice, Budget("flops", 20 * SLICE_SEQ * per_token, "test"))
    assert result.tokens == 16 * SLICE_SEQ  # whole micro-batches of 8: the one that would not fit is dropped


def test_time_budget_ends_within_half_a_micro_step(wiki_slice, monkeypatch):
    # A fake clock on which every forward pass takes 0.35 s: after 17 micro-steps (5.95 s) an 18th
    # would end at 6.30 s, more than half of itself past the 6 s budget, so the run stops there.
    fake = FakeTime()
    monkeypatch.setattr(Trainer, "clock", staticmethod(fake.clock))
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse("6s"), before_forward=lambda rows: fake.advance(0.35))
    assert result.micro_steps == 17 and result.seconds == pytest.approx(17 * 0.35)
    assert abs(result.seconds - 6.0) <= 0.35 / 2
    assert result.tokens_per_s == pytest.approx(result.tokens / result.seconds)


def test_progress_reports_at_budget_fractions(wiki_slice):
    reports = []
    cram(ARCH, TrainConfig(batch_size=16, micro_batch=8, report_every=0.25), wiki_slice,
         Budget.parse(f"{64 * SLICE_SEQ}tokens"), on_progress=reports.append)
    fractions = [r.fraction for r in reports]
    assert len(reports) == 3 and fractions[-1] < 1.0  # none at the end: the caller's final report is
    assert fractions == sorted(fractions)
    assert all(math.isfinite(r.train_loss) and r.tokens_per_s > 0 for r in reports)
    lrs = [r.lr for r in reports]  # the one-cycle triangle: rising to 75% of the budget
    assert lrs[0] < lrs[1] < lrs[2] <= TrainConfig().lr


@pytest.mark.slow
def test_validation_loss_falls_on_wikipedia(wiki_slice):
    torch.manual_seed(0)
    untrained = validation_loss(CrammedBert(ARCH), wiki_slice, torch.device("cpu"))
    # A token budget, so the result does not depend on the machine's speed: about 200 steps of 16
    # sequences (a 30 s budget gave a third of that on a loaded 2-core machine, too few to learn).
    result = cram(ARCH, TrainConfig(batch_size=16, micro_batch=16, seed=0), wiki_slice, Budget.parse("2e5tokens"))
    assert untrained == pytest.approx(math.log(SLICE_VOCAB), abs=0.5)
    assert result.validation_loss < untrained - 1.0, (untrained, result.validation_loss, result.steps)


def test_checkpoint_reloads_with_identical_outputs(wiki_slice, tmp_path):
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{16 * SLICE_SEQ}tokens"), out_dir=tmp_path / "ckpt")
    model, tokenizer_path = load_checkpoint(tmp_path / "ckpt")
    assert tokenizer_path.read_text() == wiki_slice.tokenizer_path.read_text()
    assert yaml.safe_load((tmp_path / "ckpt" / "arch.yaml").read_text()) == ARCH.to_dict()
    assert validation_loss(model, wiki_slice, torch.device("cpu")) == pytest.approx(result.validation_loss,
                                                                                          abs=1e-6)


def test_nan_loss_raises_with_its_step(wiki_slice, monkeypatch):
    calls = {"n": 0}
    original = Trainer.forward_backward

    def poisoned(self, rows, scale):
        calls["n"] += 1
        return torch.tensor(float("nan")) if calls["n"] == 6 else original(self, rows, scale)

    monkeypatch.setattr(Trainer, "forward_backward", poisoned)
    with pytest.raises(NonFiniteLoss) as info:
        cram(ARCH, TrainConfig(batch_size=8, micro_batch=8, max_rollbacks=0), wiki_slice, Budget.parse("2e5tokens"))
    assert info.value.step == 5 and "step 5" in str(info.value)  # no rollbacks allowed: the first NaN ends it


@pytest.mark.slow
def test_out_of_memory_halves_the_micro_batch_and_keeps_the_batch(wiki_slice, monkeypatch):
    original = Trainer.forward_backward
    seen = []

    def small_memory(self, rows, scale):
        if len(rows) > 4 and len(seen) >= 3:
            raise torch.OutOfMemoryError("simulated")
        seen.append(len(rows))
        return original(self, rows, scale)

    monkeypatch.setattr(Trainer, "forward_backward", small_memory)
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{24 * 8 * SLICE_SEQ}tokens"))
    assert result.oom_halvings == 1 and result.final_micro_batch == 4
    assert result.tokens == 24 * 8 * SLICE_SEQ  # nothing skipped: every row was trained on
    assert seen[:3] == [8, 8, 8] and set(seen[3:]) == {4}


def test_out_of_memory_retry_starts_after_the_failed_pass_is_freed(wiki_slice):
    """The halved retry runs only once nothing references the failed pass's tensors: on a GPU they
    are its activations, and a retry beside them would run out of memory again."""
    failed_pass: list[weakref.ref] = []
    alive_at_retry: list[bool] = []

    def before_forward(rows: int) -> None:
        if rows > 4:
            activations = torch.ones(rows, 1024)  # what the failed pass holds when memory runs out
            failed_pass.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("simulated")
        if failed_pass and not alive_at_retry:
            alive_at_retry.append(failed_pass[0]() is not None)

    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{8 * SLICE_SEQ}tokens"), before_forward=before_forward)
    assert result.oom_halvings == 1 and alive_at_retry == [False]


def test_data_must_match_the_architecture(wiki_slice):
    with pytest.raises(ValueError, match="vocab_size"):
        cram(ARCH.replace(vocab_size=4096), TRAIN, wiki_slice, Budget.parse("1e4tokens"))
