"""Static shapes and no host syncs in the training step (issue 13, findings 3 and 4).

Training masks a fixed number of positions per row (`trainer.masking.mask_fixed_count`) and the
model gathers them, so every batch has one shape: the step compiles with `fullgraph=True`, once,
and a micro-step never waits for the device.
"""

from __future__ import annotations

import pytest
import torch

from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB, CountingBackend, Watch
from trainer import loop
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.cram import cram
from trainer.masking import IGNORE_INDEX, mask_fixed_count, predictions_per_row
from trainer.model import CrammedBert

SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
VOCAB = 64
SMALL = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=VOCAB, max_seq_len=16)


def rows(batch: int = 6, seq: int = 16, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(5, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[:, -1] = SPECIALS["cls"], SPECIALS["sep"]
    return ids


def test_fixed_count_masking_predicts_k_ordinary_tokens_per_row():
    original = rows(batch=400, seq=40)
    batch = mask_fixed_count(original, 0.25, special_ids=SPECIALS, vocab_size=VOCAB,
                             generator=torch.Generator().manual_seed(1))
    k = predictions_per_row(40, 0.25)
    assert k == 10 and batch.positions.shape == batch.labels.shape == (400, k)
    for row in range(400):  # K distinct positions, none a special token
        assert len(set(batch.positions[row].tolist())) == k
    assert (batch.labels == original.gather(1, batch.positions)).all()
    assert not torch.isin(batch.positions, torch.tensor([0, 39])).any()
    # Everything not picked is untouched; of the picked, 80% [MASK], 10% random, 10% kept (BERT).
    untouched = torch.ones_like(original, dtype=torch.bool).scatter(1, batch.positions, False)
    assert (batch.input_ids[untouched] == original[untouched]).all()
    picked = batch.input_ids.gather(1, batch.positions)
    masked = (picked == SPECIALS["mask"]).float().mean()
    kept = (picked == batch.labels).float().mean()
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02  # 4000 picks: std ~0.006


def test_a_row_with_too_few_ordinary_tokens_pads_with_ignored_picks():
    original = rows(batch=2, seq=16)
    original[1, 1:13] = SPECIALS["pad"]  # row 1: two ordinary tokens, K = 4
    batch = mask_fixed_count(original, 0.25, special_ids=SPECIALS, vocab_size=VOCAB)
    assert (batch.labels[0] != IGNORE_INDEX).all()
    assert int((batch.labels[1] != IGNORE_INDEX).sum()) == 2
    ignored = batch.positions[1][batch.labels[1] == IGNORE_INDEX]
    assert (batch.input_ids[1, ignored] == original[1, ignored]).all()  # specials are never corrupted


@pytest.mark.parametrize("sparse", [True, False])
def test_predicting_at_gathered_positions_equals_the_dense_logits_there(sparse):
    torch.manual_seed(0)
    model = CrammedBert(SMALL.replace(sparse_prediction=sparse)).eval()
    batch = mask_fixed_count(rows(), 0.25, special_ids=SPECIALS, vocab_size=VOCAB,
                             generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        dense, _ = model(batch.input_ids)
        logits, loss = model(batch.input_ids, labels=batch.labels, predict_at=batch.positions)
        # The same prediction as (B, T) labels, Hugging Face's layout (the boolean path).
        labels = torch.full_like(batch.input_ids, IGNORE_INDEX).scatter(1, batch.positions, batch.labels)
        _, loss_bool = model(batch.input_ids, labels=labels)
    at = dense.gather(1, batch.positions.unsqueeze(-1).expand(-1, -1, VOCAB))
    if sparse:
        assert logits.shape == (6, predictions_per_row(16, 0.25), VOCAB)
        torch.testing.assert_close(logits, at, rtol=1e-5, atol=1e-5)
    expected = torch.nn.functional.cross_entropy(at.reshape(-1, VOCAB), batch.labels.reshape(-1))
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(loss_bool, expected)


VARIANTS = [dict(position=p) for p in ("learned", "sinusoidal", "scaled_sinusoidal", "rotary", "alibi", "none")]
VARIANTS += [dict(ffn_kind="swiglu", norm_kind="rmsnorm"), dict(norm_placement="post"), dict(sparse_prediction=False),
             dict(head_transform=True, tie_embeddings=False)]


@pytest.mark.parametrize("changes", VARIANTS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_training_forward_and_loss_compile_as_one_graph(changes):
    torch._dynamo.reset()
    model = CrammedBert(SMALL.replace(**changes))
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # a graph break raises
    for seed in range(3):  # new masks, same shapes
        batch = mask_fixed_count(rows(seed=seed), 0.25, special_ids=SPECIALS, vocab_size=VOCAB)
        _, loss = compiled(batch.input_ids, labels=batch.labels, predict_at=batch.positions)
        loss.backward()
    assert torch.isfinite(loss)


def test_a_compiled_cram_compiles_before_its_budget_and_never_inside_it(wiki_slice, monkeypatch):
    backend = CountingBackend()
    monkeypatch.setattr(loop, "COMPILE_BACKEND", backend)
    arch = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
    graphs_at_start = []
    progress = lambda _: graphs_at_start.append(backend.graphs)  # noqa: E731
    train = TrainConfig(batch_size=32, micro_batch=8, seed=3, compile=True, report_every=0.25)
    result = cram(arch, train, wiki_slice, Budget.parse(f"{40 * 8 * SLICE_SEQ}tokens"), on_progress=progress)
    assert result.compiled and result.micro_steps == 40
    assert backend.graphs >= 1 and graphs_at_start and set(graphs_at_start) == {backend.graphs}


class HostReads(Watch):
    """Counts what makes the host wait for the device, while `active`: reading a tensor's value
    (`item`, `float`, `bool`, `tolist`) and indexing by a boolean tensor (a hidden `nonzero`)."""

    READS = ("item", "tolist", "__float__", "__bool__", "__int__")

    def __init__(self, monkeypatch) -> None:
        self.active, self.seen = False, []
        for name in self.READS:
            monkeypatch.setattr(torch.Tensor, name, self.wrap(name, getattr(torch.Tensor, name)))
        getitem = torch.Tensor.__getitem__

        def indexed(tensor, index):
            parts = index if isinstance(index, tuple) else (index,)
            if self.active and any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                self.seen.append("boolean index")
            return getitem(tensor, index)

        monkeypatch.setattr(torch.Tensor, "__getitem__", indexed)

    def wrap(self, name, method):
        def counted(tensor, *args, **kwargs):
            if self.active:
                self.seen.append(name)
            return method(tensor, *args, **kwargs)
        return counted


def test_a_micro_step_never_waits_for_the_device(wiki_slice, monkeypatch):
    reads = HostReads(monkeypatch)
    micro_step = loop.Trainer.micro_step

    def watched(self, rows, scale):
        with reads.watching():
            return micro_step(self, rows, scale)

    monkeypatch.setattr(loop.Trainer, "micro_step", watched)
    arch = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
    for changes in ({}, {"sparse_prediction": False}):
        result = cram(arch.replace(**changes), TrainConfig(batch_size=16, micro_batch=4, seed=0), wiki_slice,
                      Budget.parse(f"{24 * 4 * SLICE_SEQ}tokens"))
        assert result.micro_steps == 24 and result.steps >= 6
    assert reads.seen == []
