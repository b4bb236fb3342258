"""Load a `transformers.BertForMaskedLM` state dict into the original-BERT `CrammedBert`.

This is what proves `CrammedBert` is BERT when configured as BERT (a test compares logits), and
lets a user start from any BERT checkpoint they hold locally.
"""

from __future__ import annotations

import torch

from space.arch import ArchConfig
from trainer.model import CrammedBert

# The ArchConfig settings that make CrammedBert the original BERT; shape fields come from the caller.
ORIGINAL_BERT = dict(
    ffn_kind="gelu", norm_kind="layernorm", norm_placement="post", final_norm=False,
    embedding_norm=True, qkv_bias=True, attn_out_bias=True, ffn_bias=True, norm_bias=True,
    decoder_bias=True, position="learned", segment_embeddings=True, tie_embeddings=True,
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


def convert_hf_bert_state_dict(hf: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Rename (and fuse q, k, v of) a BertForMaskedLM state dict into CrammedBert's names."""
    out = {
        "embeddings.tokens.weight": hf["bert.embeddings.word_embeddings.weight"],
        "embeddings.positions.table.weight": hf["bert.embeddings.position_embeddings.weight"],
        "embeddings.segments.weight": hf["bert.embeddings.token_type_embeddings.weight"],
        "embeddings.norm.weight": hf["bert.embeddings.LayerNorm.weight"],
        "embeddings.norm.bias": hf["bert.embeddings.LayerNorm.bias"],
        "head.transform.0.weight": hf["cls.predictions.transform.dense.weight"],
        "head.transform.0.bias": hf["cls.predictions.transform.dense.bias"],
        "head.transform.2.weight": hf["cls.predictions.transform.LayerNorm.weight"],
        "head.transform.2.bias": hf["cls.predictions.transform.LayerNorm.bias"],
        "head.decoder.weight": hf.get("cls.predictions.decoder.weight", hf["bert.embeddings.word_embeddings.weight"]),
        "head.decoder.bias": hf["cls.predictions.bias"],
    }
    for i in range(layers):
        src, dst = f"bert.encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{dst}attention.sublayer.qkv.{kind}"] = torch.cat(
                [hf[f"{src}attention.self.{name}.{kind}"] for name in ("query", "key", "value")]
            )
            out[f"{dst}attention.sublayer.out.{kind}"] = hf[f"{src}attention.output.dense.{kind}"]
            out[f"{dst}attention.norm.{kind}"] = hf[f"{src}attention.output.LayerNorm.{kind}"]
            out[f"{dst}ffn.sublayer.up.{kind}"] = hf[f"{src}intermediate.dense.{kind}"]
            out[f"{dst}ffn.sublayer.down.{kind}"] = hf[f"{src}output.dense.{kind}"]
            out[f"{dst}ffn.norm.{kind}"] = hf[f"{src}output.LayerNorm.{kind}"]
    return out


def from_hf_bert(hf_model) -> CrammedBert:
    """A CrammedBert with the weights of a `transformers.BertForMaskedLM`."""
    arch = arch_from_hf_config(hf_model.config)
    model = CrammedBert(arch)
    model.load_state_dict(convert_hf_bert_state_dict(hf_model.state_dict(), arch.layers), strict=True)
    return model
