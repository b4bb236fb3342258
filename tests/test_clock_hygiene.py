"""Nothing in the training clock that is not training (issue 20, section 1).

A budget counts the time of training steps only: no host-device round trip beyond the one loss
read per optimizer step, no tensor built from Python data in a micro-step, no rollback snapshot,
no wait for the driver after a progress report, no recompile for a cut-short last micro-batch, and
no first allocation of AdamW's state inside the clock.
"""

from __future__ import annotations

import collections

import pytest
import torch

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB, FakeTime, Watch
from trainer import loop
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.cram import cram
from trainer.loop import Trainer
from trainer.rollback import RollbackGuard

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
MICRO = 4
TRAIN = TrainConfig(batch_size=2 * MICRO, micro_batch=MICRO, seed=2, snapshot_every=2, report_every=0.25)


class Transfers(Watch):
    """Records, while `active`, each read of a tensor back to the host (`item`, `tolist`, `cpu`,
    `to("cpu")`) and each tensor built from Python data (`torch.tensor`, `torch.as_tensor`), with the
    optimizer step it happened in (`trainer.state.steps`)."""

    def __init__(self, monkeypatch, trainer: Trainer) -> None:
        self.trainer, self.active = trainer, False
        self.reads: list[tuple[int, str]] = []
        self.built: list[tuple[int, str]] = []
        for name in ("item", "tolist", "cpu"):
            monkeypatch.setattr(torch.Tensor, name, self.recorded(self.reads, name, getattr(torch.Tensor, name)))
        to = torch.Tensor.to

        def moved(tensor, *args, **kwargs):
            # A copy to the host; not a move to the tensor's own device (clipping moves each
            # gradient's norm to the first gradient's device: a no-op here, on the GPU too).
            target = kwargs.get("device", args[0] if args else None)
            to_host = isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"
            if self.active and to_host and (tensor.device.type != "cpu" or kwargs.get("copy")):
                self.reads.append((self.trainer.state.steps, "to(cpu)"))
            return to(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", moved)
        for name in ("tensor", "as_tensor"):
            monkeypatch.setattr(torch, name, self.recorded(self.built, name, getattr(torch, name)))

    def recorded(self, into: list, name: str, function):
        def wrapper(*args, **kwargs):
            if self.active:
                into.append((self.trainer.state.steps, name))
            return function(*args, **kwargs)
        return wrapper


def test_an_optimizer_step_reads_the_device_once_and_builds_no_tensor_from_python_data(wiki_slice, monkeypatch):
    # Compiled (eager backend: the warm-up runs, no code generation), so the watch starts after the
    # warm-up as a real run's clock does; 12 steps of 2 micro-batches, with snapshots every 2 steps.
    monkeypatch.setattr(loop, "COMPILE_BACKEND", "eager")
    budget = Budget.parse(f"{24 * MICRO * SLICE_SEQ}tokens")
    trainer = Trainer(ARCH, TrainConfig(**{**TRAIN.to_dict(), "compile": True, "batch_ramp": 0.0}), wiki_slice,
                      budget, on_progress=None, device=torch.device("cpu"))
    transfers = Transfers(monkeypatch, trainer)
    with transfers.watching():
        trainer.run()
    assert trainer.state.steps == 12 and trainer.state.micro_steps == 24
    assert transfers.built == []  # e.g. torch.tensor(specials) in every micro-step's masking
    assert collections.Counter(transfers.reads) == {(step, "tolist"): 1 for step in range(12)}


def test_rollback_snapshots_are_not_training_time(wiki_slice, monkeypatch):
    accept, snapshots = RollbackGuard.accept, []

    def slow_accept(self, step, loss, batches_before):  # every accepted step may snapshot: 5 s each
        snapshots.append(step)
        fake.advance(5.0)
        return accept(self, step, loss, batches_before)

    fake = FakeTime()
    monkeypatch.setattr(Trainer, "clock", staticmethod(fake.clock))
    monkeypatch.setattr(RollbackGuard, "accept", slow_accept)
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{16 * MICRO * SLICE_SEQ}tokens"),
                  before_forward=lambda rows: fake.advance(0.1))
    assert snapshots and result.micro_steps == 16
    assert result.seconds == pytest.approx(16 * 0.1)


def test_waiting_for_the_driver_after_a_progress_report_is_not_training_time(wiki_slice, monkeypatch):
    fake, reports = FakeTime(), []

    def stalled_driver(progress):  # MLflow stalls: the report returns 10 s later
        reports.append(progress)
        fake.advance(10.0)

    monkeypatch.setattr(Trainer, "clock", staticmethod(fake.clock))
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{16 * MICRO * SLICE_SEQ}tokens"),
                  on_progress=stalled_driver, before_forward=lambda rows: fake.advance(0.1))
    assert len(reports) == 3 and result.micro_steps == 16
    assert result.seconds == pytest.approx(16 * 0.1)
    assert [report.seconds for report in reports] == pytest.approx([r.tokens / (MICRO * SLICE_SEQ) * 0.1
                                                                    for r in reports])


@pytest.mark.parametrize("budget", [f"{(10 * MICRO + 3) * SLICE_SEQ}tokens", "flops"])
def test_the_last_micro_batch_is_dropped_not_cut_short(wiki_slice, budget):
    # A budget that ends 3 rows into the 11th micro-batch: a cut-short one would be a new shape,
    # which a compiled step recompiles inside the budget.
    per_token = ARCH.flops_per_token(SLICE_SEQ, TRAIN.mlm_rate)
    amount = (10 * MICRO + 3) * SLICE_SEQ
    budget = Budget.parse(budget) if budget != "flops" else Budget("flops", amount * per_token, "test")
    shapes = []
    result = cram(ARCH, TRAIN, wiki_slice, budget, before_forward=shapes.append)
    assert shapes == [MICRO] * 10
    assert result.tokens == 10 * MICRO * SLICE_SEQ < amount  # the tokens trained on, no more


def test_adamw_state_and_the_snapshot_buffer_exist_before_the_clock_and_change_nothing(wiki_slice, monkeypatch):
    # Allocated before the compile warm-up, so that it runs with a training step's memory: a
    # micro-batch that fits there does not run out of memory at the first optimizer step.
    monkeypatch.setattr(loop, "COMPILE_BACKEND", "eager")
    trainer = Trainer(ARCH, TrainConfig(**{**TRAIN.to_dict(), "compile": True}), wiki_slice,
                      Budget.parse("1e4tokens"), on_progress=None, device=torch.device("cpu"))
    params = list(trainer.model.parameters())
    assert set(trainer.optimizer.state) == set(params)
    for state in trainer.optimizer.state.values():  # as AdamW's own first step would find them
        assert state["step"].item() == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    assert all(param.grad is None for param in params) and trainer.optimizer.param_groups[0]["lr"] == TRAIN.lr
    torch.manual_seed(TRAIN.seed)
    fresh = loop.CrammedBert(ARCH)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trainer.model.state_dict().values()))
    assert len(trainer.guard.copies) == len(trainer.guard.state) > len(params)  # weights and moments
