"""Between `transformers.BertForMaskedLM` and the original-BERT `CrammedBert`, both ways.

`from_hf_bert` proves `CrammedBert` is BERT when configured as BERT (a test compares logits) and
lets a user start from any BERT checkpoint they hold locally; `to_hf_bert` is its inverse, which
`trainer.export_hf` uses to export an original-BERT checkpoint as a plain BertForMaskedLM.
"""

from __future__ import annotations

import torch

from space.arch import ArchConfig
from space.vocabulary import FfnKind, NormKind, NormPlacement, Position
from trainer.model import CrammedBert

# The ArchConfig settings that make CrammedBert the original BERT; shape fields come from the caller.
ORIGINAL_BERT = dict(
    ffn_kind=FfnKind.GELU, norm_kind=NormKind.LAYERNORM, norm_placement=NormPlacement.POST, final_norm=False,
    embedding_norm=True, qkv_bias=True, attn_out_bias=True, ffn_bias=True, norm_bias=True,
    decoder_bias=True, position=Position.LEARNED, segment_embeddings=True, tie_embeddings=True,
    head_transform=True, sparse_prediction=False,
)


def arch_from_hf_config(config) -> ArchConfig:
    """The ArchConfig of a `transformers.BertConfig` (absolute positions, GELU only)."""
    if config.hidden_act != "gelu" or config.type_vocab_size != 2:
        raise ValueError("hf config: only hidden_act='gelu' and type_vocab_size=2 map onto CrammedBert")
    return ArchConfig(
        layers=config.num_hidden_layers, hidden=config.hidden_size, heads=config.num_attention_heads,
        ffn_mult=config.intermediate_size / config.hidden_size, norm_eps=config.layer_norm_eps,
        max_seq_len=config.max_position_embeddings, vocab_size=config.vocab_size,
        init_std=config.initializer_range, **ORIGINAL_BERT,
    )


QKV = ("query", "key", "value")  # BertForMaskedLM's three matrices, fused in this order into CrammedBert's qkv


def _renames(layers: int) -> list[tuple[str, str]]:
    """(CrammedBert name, BertForMaskedLM name) of every tensor that maps one to one (q, k, v do not)."""
    pairs = [
        ("embeddings.tokens.weight", "bert.embeddings.word_embeddings.weight"),
        ("embeddings.positions.table.weight", "bert.embeddings.position_embeddings.weight"),
        ("embeddings.segments.weight", "bert.embeddings.token_type_embeddings.weight"),
        ("head.decoder.bias", "cls.predictions.bias"),
    ]
    for kind in ("weight", "bias"):
        pairs += [
            (f"embeddings.norm.{kind}", f"bert.embeddings.LayerNorm.{kind}"),
            (f"head.transform.0.{kind}", f"cls.predictions.transform.dense.{kind}"),
            (f"head.transform.2.{kind}", f"cls.predictions.transform.LayerNorm.{kind}"),
        ]
        for i in range(layers):
            src, dst = f"bert.encoder.layer.{i}.", f"blocks.{i}."
            pairs += [
                (f"{dst}attention.sublayer.out.{kind}", f"{src}attention.output.dense.{kind}"),
                (f"{dst}attention.norm.{kind}", f"{src}attention.output.LayerNorm.{kind}"),
                (f"{dst}ffn.sublayer.up.{kind}", f"{src}intermediate.dense.{kind}"),
                (f"{dst}ffn.sublayer.down.{kind}", f"{src}output.dense.{kind}"),
                (f"{dst}ffn.norm.{kind}", f"{src}output.LayerNorm.{kind}"),
            ]
    return pairs


def convert_hf_bert_state_dict(hf: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Rename (and fuse q, k, v of) a BertForMaskedLM state dict into CrammedBert's names."""
    out = {ours: hf[theirs] for ours, theirs in _renames(layers)}
    out["head.decoder.weight"] = hf.get("cls.predictions.decoder.weight", hf["bert.embeddings.word_embeddings.weight"])
    for i in range(layers):
        for kind in ("weight", "bias"):
            out[f"blocks.{i}.attention.sublayer.qkv.{kind}"] = torch.cat(
                [hf[f"bert.encoder.layer.{i}.attention.self.{name}.{kind}"] for name in QKV]
            )
    return out


def to_hf_bert_state_dict(ours: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """The inverse of `convert_hf_bert_state_dict`: CrammedBert names (and split q, k, v) -> BertForMaskedLM's."""
    out = {theirs: ours[mine] for mine, theirs in _renames(layers)}
    out["cls.predictions.decoder.weight"] = ours["head.decoder.weight"]  # tied: the token embedding
    out["cls.predictions.decoder.bias"] = ours["head.decoder.bias"]  # tied to cls.predictions.bias
    for i in range(layers):
        for kind in ("weight", "bias"):
            fused = ours[f"blocks.{i}.attention.sublayer.qkv.{kind}"]
            for name, part in zip(QKV, fused.chunk(3), strict=True):
                out[f"bert.encoder.layer.{i}.attention.self.{name}.{kind}"] = part
    return out


def from_hf_bert(hf_model) -> CrammedBert:
    """A CrammedBert with the weights of a `transformers.BertForMaskedLM`."""
    arch = arch_from_hf_config(hf_model.config)
    model = CrammedBert(arch)
    model.load_state_dict(convert_hf_bert_state_dict(hf_model.state_dict(), arch.layers), strict=True)
    return model


def is_original_bert(arch: ArchConfig) -> bool:
    """Whether `arch` is exactly BERT, so `to_hf_bert` can make it a BertForMaskedLM.

    Sparse prediction is left out: it only changes which logits training computes, not the model.
    """
    return all(getattr(arch, name) == value for name, value in ORIGINAL_BERT.items() if name != "sparse_prediction")


def hf_config_from_arch(arch: ArchConfig):
    """The `transformers.BertConfig` of an original-BERT ArchConfig (`arch_from_hf_config` inverted)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads, intermediate_size=arch.ffn_inner, hidden_act="gelu",
        max_position_embeddings=arch.max_seq_len, type_vocab_size=2, initializer_range=arch.init_std,
        layer_norm_eps=arch.norm_eps,
    )


def to_hf_bert(model: CrammedBert):
    """A `transformers.BertForMaskedLM` with the weights of an original-BERT CrammedBert."""
    from transformers import BertForMaskedLM

    if not is_original_bert(model.arch):
        raise ValueError("to_hf_bert: the architecture is not the original BERT (see ORIGINAL_BERT)")
    hf = BertForMaskedLM(hf_config_from_arch(model.arch))
    hf.load_state_dict(to_hf_bert_state_dict(model.state_dict(), model.arch.layers), strict=True)
    return hf.eval()
