"""transformers models around `CrammedBert`: the encoder, masked-LM and sequence-classification heads.

Each class holds the whole `CrammedBert` as `crammed` (its MLM head included, as glue.finetune's
classifier does), so one exported state dict loads into every class. Logits are dense: sparse
prediction is a training speed-up that gives the same loss (`CrammedBert.forward`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

from trainer.hf_remote.configuration_crammed_bert import CrammedBertConfig
from trainer.model import POSITIONS, ClassificationHead, CrammedBert, NoPositions, RMSNorm, SlidingWindow


def copy_buffers(fresh: nn.Module, module: nn.Module) -> None:
    for name, buffer in fresh.named_buffers():
        module.get_buffer(name).copy_(buffer)


class CrammedBertPreTrainedModel(PreTrainedModel):
    config_class = CrammedBertConfig
    base_model_prefix = "crammed"
    _tied_weights_keys = {"crammed.head.decoder.weight": "crammed.embeddings.tokens.weight"}

    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.crammed = CrammedBert(config.arch, dropout=config.dropout)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """What CrammedBert's constructor does, for a module transformers left uninitialised.

        transformers builds the model on the meta device and loads the weights; a new head's layers,
        the position tables and the sliding-window mask (non-persistent buffers, never saved) are
        made here. transformers guards `nn.init`, so weights that were loaded are left as they are.
        """
        if isinstance(module, (nn.Linear, nn.Embedding)):
            self.crammed._init_weights(module)
        elif isinstance(module, (nn.LayerNorm, RMSNorm)):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, NoPositions):
            copy_buffers(POSITIONS[self.config.position](self.config.arch), module)
        elif isinstance(module, SlidingWindow):
            copy_buffers(SlidingWindow(self.config.arch), module)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.crammed.embeddings.tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.crammed.embeddings.tokens = value


class CrammedBertModel(CrammedBertPreTrainedModel):
    """The encoder: hidden states after the final norm."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self.crammed.encode(input_ids, attention_mask, token_type_ids))


class CrammedBertForMaskedLM(CrammedBertPreTrainedModel):
    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.crammed.head.decoder

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> MaskedLMOutput:
        hidden = self.crammed.encode(input_ids, attention_mask, token_type_ids)
        logits = self.crammed.mlm_logits(hidden)
        loss = None
        if labels is not None:  # -100: not predicted, as transformers' MLM collator labels
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=(hidden,))


class CrammedBertForSequenceClassification(CrammedBertPreTrainedModel):
    """glue.finetune's head on the encoder: [CLS] state -> dense + tanh -> dropout -> linear."""

    def __init__(self, config: CrammedBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.head = ClassificationHead(config.arch, config.num_labels, config.dropout)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None) -> SequenceClassifierOutput:
        hidden = self.crammed.encode(input_ids, attention_mask, token_type_ids)
        logits = self.head(hidden, attention_mask)
        # transformers' own loss: regression for one label, else cross-entropy (or BCE for multi-label).
        loss = None if labels is None else self.loss_function(labels, logits, self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits)
