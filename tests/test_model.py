"""CrammedBert: every variant builds and trains, counts are right, and original-BERT is BERT."""

from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from space.arch import CHOICES, FIELD_TYPES, ArchConfig
from trainer import model as M
from trainer.hf_compat import ORIGINAL_BERT, from_hf_bert

TINY = ArchConfig(layers=2, hidden=32, heads=4, vocab_size=64, max_seq_len=24, ffn_mult=2.0)
CRAMMED_BERT = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "crammed-bert.yaml"


def test_arch_defaults_are_the_crammed_bert_config_field_for_field():
    config = yaml.safe_load(CRAMMED_BERT.read_text())["arch"]
    assert ArchConfig().to_dict() == ArchConfig(**config).to_dict() == config


def variants() -> list:
    """TINY with each categorical choice and each flipped boolean, one knob at a time."""
    out = []
    for field, options in CHOICES.items():
        for option in options:
            out.append(pytest.param(TINY.replace(**{field: option}), id=f"{field}={option}"))
    for field, kind in FIELD_TYPES.items():
        if kind == "bool":
            flipped = not getattr(TINY, field)
            out.append(pytest.param(TINY.replace(**{field: flipped}), id=f"{field}={flipped}"))
    out.append(pytest.param(TINY.replace(local_window=2, global_every=2), id="local_window=2"))
    return out


def batch(arch, b=3, t=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, arch.vocab_size, (b, t), generator=g)
    labels = torch.full_like(ids, -100)
    picked = torch.rand(b, t, generator=g) < 0.25
    picked[:, 0] = True  # at least one predicted token per row
    labels[picked] = ids[picked]
    return ids, labels


@pytest.mark.parametrize("arch", variants())
def test_variant_trains_with_finite_gradients(arch):
    torch.manual_seed(0)
    model = M.CrammedBert(arch)
    ids, labels = batch(arch)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    logits, loss = model(ids, labels=labels, attention_mask=mask)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    assert model.num_params() == arch.num_params()  # the analytic count the search constrains on


@pytest.mark.parametrize("position", CHOICES["position"])
@pytest.mark.parametrize("placement", CHOICES["norm_placement"])
def test_fully_padded_row_gives_no_nan(position, placement):
    arch = TINY.replace(position=position, norm_placement=placement)
    model = M.CrammedBert(arch).eval()
    ids, _ = batch(arch, b=2)
    mask = torch.ones_like(ids)
    mask[0] = 0  # a row with nothing to attend to
    hidden = model.encode(ids, attention_mask=mask)
    assert torch.isfinite(hidden).all()


def test_a_padded_row_under_a_window_gives_no_nan():
    model = M.CrammedBert(WINDOWED).eval()
    ids, _ = batch(WINDOWED, b=2)
    mask = torch.ones_like(ids)
    mask[0], mask[1, 4:] = 0, 0  # nothing to attend to; padding beyond a query's window
    assert torch.isfinite(model.encode(ids, attention_mask=mask)).all()


def test_padding_does_not_change_unpadded_tokens():
    model = M.CrammedBert(TINY).eval()
    ids, _ = batch(TINY, b=1, t=10)
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1).long()
    short = model.encode(ids)
    long = model.encode(padded, attention_mask=mask)[:, :10]
    torch.testing.assert_close(short, long, atol=1e-5, rtol=1e-5)


def test_sparse_prediction_equals_dense_logits_at_masked_positions():
    model = M.CrammedBert(TINY).eval()
    ids, labels = batch(TINY)
    sparse_logits, sparse_loss = model(ids, labels=labels)
    dense_model = M.CrammedBert(TINY.replace(sparse_prediction=False)).eval()
    dense_model.load_state_dict(model.state_dict())
    dense_logits, dense_loss = dense_model(ids, labels=labels)
    assert sparse_logits.shape == (int((labels != -100).sum()), TINY.vocab_size)
    torch.testing.assert_close(sparse_logits, dense_logits[labels != -100])
    torch.testing.assert_close(sparse_loss, dense_loss)


def test_rotary_scores_depend_only_on_relative_position():
    arch = TINY.replace(position="rotary")
    rotary = M.RotaryPositions(arch)
    g = torch.Generator().manual_seed(1)
    u, w = torch.randn(arch.head_dim, generator=g), torch.randn(arch.head_dim, generator=g)

    def score(i, j):
        q = torch.zeros(1, 1, arch.max_seq_len, arch.head_dim)
        k = torch.zeros_like(q)
        q[0, 0, i], k[0, 0, j] = u, w
        q, k = rotary.rotate(q, k)
        return float(q[0, 0, i] @ k[0, 0, j])

    for i, j in [(0, 3), (5, 2), (7, 7)]:
        for shift in (1, 4, 11):
            assert score(i, j) == pytest.approx(score(i + shift, j + shift), abs=1e-5)
    assert score(0, 3) != pytest.approx(score(0, 5), abs=1e-3)  # but it does see the distance


def test_alibi_bias_depends_only_on_relative_position():
    alibi = M.AlibiPositions(TINY.replace(position="alibi")).attention_bias(20)
    for shift in (1, 5):
        torch.testing.assert_close(alibi[:, :-shift, :-shift], alibi[:, shift:, shift:])
    assert (alibi[:, 0, 1] < 0).all() and (alibi[:, 0, 2] < alibi[:, 0, 1]).all()
    assert torch.equal(alibi, alibi.transpose(1, 2))  # bidirectional: symmetric


def test_gated_ffn_width_keeps_parameter_count_comparable():
    plain, gated = TINY.replace(ffn_kind="gelu", hidden=96, heads=4), TINY.replace(ffn_kind="swiglu", hidden=96, heads=4)
    ffn = lambda arch: sum(p.numel() for p in M.make_ffn(arch).parameters())
    assert abs(ffn(gated) - ffn(plain)) / ffn(plain) < 0.02


@pytest.mark.parametrize("sparse", [True, False])
def test_flops_formula_matches_counted_matmul_flops(sparse):
    arch = ArchConfig(layers=2, hidden=64, heads=4, vocab_size=512, max_seq_len=32, sparse_prediction=sparse,
                      head_transform=True)
    model = M.CrammedBert(arch)
    ids = torch.randint(5, arch.vocab_size, (4, 32))
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]  # exactly 25% predicted
    with FlopCounterMode(display=False) as counter:
        model(ids, labels=labels)
    # FlopCounterMode does not see SDPA's CPU kernel: add its QK^T and AV, 2*T*h FLOPs each.
    attention = arch.layers * 2 * (2 * 32 * arch.hidden)
    forward_per_token = counter.get_total_flops() / ids.numel() + attention
    assert model.flops_per_token(32, mlm_rate=0.25) / 3 == pytest.approx(forward_per_token, rel=0.02)


def test_flops_count_the_keys_in_each_local_window():
    arch = ArchConfig(layers=3, hidden=64, heads=4, vocab_size=512, max_seq_len=32)
    windowed = arch.replace(local_window=4, global_every=3)  # layer 0 global, layers 1 and 2 local
    assert [windowed.is_global(layer) for layer in range(3)] == [True, False, False]
    # Each local layer's scores and weighted sum see 9 keys per query instead of 32.
    saved = 2 * 3.0 * (2 * 2 * (32 - 9) * arch.hidden)
    assert arch.flops_per_token(32) - windowed.flops_per_token(32) == pytest.approx(saved)
    assert arch.replace(local_window=16, global_every=3).flops_per_token(32) == arch.flops_per_token(32)  # 33 >= 32
    assert windowed.num_params() == arch.num_params()


WINDOWED = TINY.replace(layers=3, local_window=2, global_every=3, position="rotary")


def test_global_models_build_no_window():
    assert M.CrammedBert(TINY).window is None
    # Nor one whose window changes no layer (space.ArchConfig.canonical): it reaches every key.
    assert M.CrammedBert(WINDOWED.replace(local_window=TINY.max_seq_len - 1)).window is None
    # The mask is not a weight: a windowed model's state dict is a global one's.
    assert M.CrammedBert(WINDOWED).state_dict().keys() == M.CrammedBert(WINDOWED.replace(local_window=0)).state_dict().keys()


def test_a_window_over_the_whole_row_is_global_attention():
    # One row shorter than the longest, so the model keeps (and this tests) its mask.
    ids, _ = batch(WINDOWED, t=TINY.max_seq_len - 1)
    torch.manual_seed(0)
    windowed = M.CrammedBert(WINDOWED.replace(local_window=TINY.max_seq_len - 2)).eval()
    assert windowed.window is not None
    full = M.CrammedBert(WINDOWED.replace(local_window=0)).eval()
    full.load_state_dict(windowed.state_dict())
    torch.testing.assert_close(windowed(ids)[0], full(ids)[0], atol=1e-6, rtol=1e-6)
    small = M.CrammedBert(WINDOWED).eval()
    small.load_state_dict(windowed.state_dict())
    assert (small(ids)[0] - full(ids)[0]).abs().max() > 1e-3  # a window that restricts changes the logits


def test_a_local_layer_sees_only_its_window():
    torch.manual_seed(0)
    model = M.CrammedBert(WINDOWED).eval()
    local = model.blocks[1]  # layer 1 of 3 with global_every 3: local
    t, query = 16, 8
    x = torch.randn(1, t, WINDOWED.hidden, requires_grad=True)
    mask = model.window.restrict(None, t, x.dtype)
    local(x, model.positions, mask)[0, query].sum().backward()
    reaches = x.grad[0].abs().sum(-1) > 0
    assert reaches.tolist() == [abs(key - query) <= WINDOWED.local_window for key in range(t)]


@pytest.mark.parametrize("padding", [False, True])
def test_original_bert_matches_transformers(padding):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=192, max_position_embeddings=40)
    hf = transformers.BertForMaskedLM(config).eval()
    ours = from_hf_bert(hf).eval()
    assert all(getattr(ours.arch, k) == v for k, v in ORIGINAL_BERT.items())
    ids = torch.randint(5, 120, (4, 24))
    mask = torch.ones_like(ids)
    if padding:
        mask[1, 15:] = 0
        mask[3, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 12:] = 1
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        logits, _ = ours(ids, attention_mask=mask, token_type_ids=types)
    keep = mask.bool()
    torch.testing.assert_close(logits[keep], expected[keep], atol=1e-5, rtol=0)
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())


def test_dropout_only_in_training():
    model = M.CrammedBert(TINY, dropout=0.5)
    ids, _ = batch(TINY)
    model.eval()
    torch.testing.assert_close(model.encode(ids), model.encode(ids))
    model.train()
    assert not torch.allclose(model.encode(ids), model.encode(ids))

