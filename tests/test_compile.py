"""Compile, fairly (issue 13): every architecture of a process is compiled, and compiling is not
paid out of the trial's budget.

A counting backend stands in for inductor: it sees every graph dynamo hands to a backend, without
the code generation that would take minutes on this CPU.
"""

from __future__ import annotations

import logging

import pytest
import torch

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB, CountingBackend, FakeTime
from trainer import loop
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.cram import cram

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
TRAIN = TrainConfig(batch_size=8, micro_batch=8, seed=1, compile=True)


@pytest.mark.slow
def test_ten_architectures_in_one_process_are_all_compiled(wiki_slice, monkeypatch, caplog):
    backend = CountingBackend()
    monkeypatch.setattr(loop, "COMPILE_BACKEND", backend)
    variants = [dict(position=position) for position in ("learned", "sinusoidal", "scaled_sinusoidal", "rotary",
                                                          "alibi", "none")]
    variants += [dict(ffn_kind="swiglu"), dict(norm_placement="post"), dict(norm_kind="rmsnorm"), dict(layers=2)]
    assert len(variants) == 10
    caplog.set_level(logging.WARNING, logger="torch._dynamo")
    for number, changes in enumerate(variants):
        before = backend.graphs
        result = cram(ARCH.replace(**changes), TRAIN, wiki_slice, Budget.parse(f"{16 * SLICE_SEQ}tokens"))
        assert result.compiled and backend.graphs > before, f"architecture {number} ({changes}) was not compiled"
    assert not [record for record in caplog.records if "recompile_limit" in record.getMessage()
                or "cache_size_limit" in record.getMessage()]


def test_the_budget_clock_starts_after_a_slow_compile(wiki_slice, monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(loop.Trainer, "clock", staticmethod(fake.clock))
    # Compiling takes 100 s on the fake clock (the first graph); every forward pass takes 0.35 s.
    backend = CountingBackend(on_compile=lambda: fake.advance(100.0) if backend.graphs == 1 else None)
    monkeypatch.setattr(loop, "COMPILE_BACKEND", backend)
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse("5s"), before_forward=lambda rows: fake.advance(0.35))
    assert result.compile_seconds >= 100.0
    assert abs(result.seconds - 5.0) <= 0.35 / 2 and result.micro_steps == 14  # the whole 5 s trained
    assert result.tokens_per_s == pytest.approx(result.tokens / result.seconds)


def test_a_micro_batch_that_does_not_fit_halves_during_the_warm_up(wiki_slice, monkeypatch):
    monkeypatch.setattr(loop, "COMPILE_BACKEND", CountingBackend())
    original = loop.mlm_backward

    def small_memory(step_fn, rows, *args, **kwargs):
        if len(rows) > 4:
            raise torch.OutOfMemoryError("simulated")
        return original(step_fn, rows, *args, **kwargs)

    monkeypatch.setattr(loop, "mlm_backward", small_memory)
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{8 * 8 * SLICE_SEQ}tokens"))
    assert result.compiled and result.oom_halvings == 1 and result.final_micro_batch == 4
    assert result.tokens == 8 * 8 * SLICE_SEQ  # the batch of 8 rows kept, in two micro-batches


def test_every_layer_reuses_one_compiled_block_graph(wiki_slice, monkeypatch):
    """Issue 20 §3: the trainer compiles a block, not the whole model, so a deeper model costs no
    more graphs to compile than a one-layer one; and only the blocks are compiled (validation runs
    eager: its graphs would be counted too)."""
    graphs = {}
    for layers in (1, 4):
        backend = CountingBackend()
        monkeypatch.setattr(loop, "COMPILE_BACKEND", backend)
        result = cram(ARCH.replace(layers=layers), TRAIN, wiki_slice, Budget.parse(f"{16 * SLICE_SEQ}tokens"))
        assert result.compiled
        graphs[layers] = backend.graphs
    assert graphs[1] == graphs[4] == 1, graphs


def test_the_trainer_compiles_each_block_with_fullgraph(wiki_slice, monkeypatch):
    calls = []
    original = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda module, **kwargs: (calls.append((type(module).__name__, kwargs.get("fullgraph"))),
                                                  original(module, **kwargs)))
    monkeypatch.setattr(loop, "COMPILE_BACKEND", CountingBackend())
    cram(ARCH.replace(layers=3), TRAIN, wiki_slice, Budget.parse(f"{16 * SLICE_SEQ}tokens"))
    assert calls == [("Block", True)] * 3
