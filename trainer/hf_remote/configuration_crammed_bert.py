"""`CrammedBertConfig`: a transformers config that carries every `ArchConfig` field as is.

config.json then reads like arch.yaml plus transformers' own keys; `arch` rebuilds the ArchConfig,
which checks the fields as cramnas does.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from space.arch import ArchConfig

ARCH_FIELDS = tuple(ArchConfig().to_dict())


class CrammedBertConfig(PretrainedConfig):
    model_type = "crammed_bert"
    # transformers' standard names (Trainer, pipelines, FLOP estimates) read the ArchConfig fields.
    attribute_map = {
        "hidden_size": "hidden",
        "num_hidden_layers": "layers",
        "num_attention_heads": "heads",
        "max_position_embeddings": "max_seq_len",
        "initializer_range": "init_std",
    }

    def __init__(self, dropout: float = 0.1, **kwargs):
        # Dropout of the encoder and the classification head while training (glue.finetune's 0.1).
        self.dropout = dropout
        arch = ArchConfig.from_dict({name: kwargs.pop(name) for name in ARCH_FIELDS if name in kwargs})
        for name, value in arch.to_dict().items():
            setattr(self, name, value)
        # transformers ties the decoder to the token embedding only when this says so.
        kwargs["tie_word_embeddings"] = arch.tie_embeddings
        super().__init__(**kwargs)

    @property
    def arch(self) -> ArchConfig:
        return ArchConfig.from_dict({name: getattr(self, name) for name in ARCH_FIELDS})
