"""The task models every method starts from; here the classifier: a backbone, a pooling rule and a linear head.

:func:`make_task_model` picks the task model of an objective: this :class:`SequenceClassifier` for
``classification``, :class:`petlprof.models.language_model.LanguageModel` (the backbone's own LM head) for ``lm``.

One wrapper for all three families, so every method is compared on the same head and pooling:

* encoder (BERT-like): masked mean over the final hidden states (all-MiniLM-L6-v2 was trained
  with mean pooling);
* encoder-decoder (T5-like): the encoder reads the input, the decoder reads it shifted right
  over the input's own positions, and the decoder state at the last non-padding position is
  pooled (as ``T5ForSequenceClassification`` pools at the final EOS): it has read every token but
  the last from the decoder side and the whole input through cross-attention, whatever the
  padding;
* decoder (GPT-2/LLaMA-like): the state of the last non-padding token (left or right padding).

``forward`` returns logits (``num_labels`` columns; one for regression).  Side-tuning methods
use :meth:`backbone_outputs` to tap every layer's hidden states and :meth:`classify` to put the
head on a corrected final state.

Prompt tuning prepends ``virtual_tokens`` trained embeddings to the input (PEFT does it inside the
backbone), so the backbone returns that many extra leading positions; pooling drops them, so the
same rule reads the same real tokens for every method.  Prefix tuning adds keys and values only,
so lengths do not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from petlprof.models.backbones import Backbone
from petlprof.models.families import DECODER, ENCODER, ENCODER_DECODER
from petlprof.models.language_model import LanguageModel
from petlprof.vocabulary import CLASSIFICATION, LM

if TYPE_CHECKING:
    from petlprof.method_api import MethodSpec


class _TokenInputs(TypedDict):
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


class BackboneInputs(_TokenInputs, total=False):
    """The keyword arguments :meth:`SequenceClassifier.model_inputs` gives the backbone: the tokens and their mask,
    a decoder's positions and an encoder-decoder's decoder input."""

    position_ids: torch.Tensor  # a decoder's (without virtual tokens): counted from the first real token
    decoder_input_ids: torch.Tensor  # an encoder-decoder's: the input shifted right
    decoder_attention_mask: torch.Tensor


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-padding position of each row, for left or right padding."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(dim=1)


def shift_right(ids: torch.Tensor, start_id: int) -> torch.Tensor:
    shifted = ids.new_full(ids.shape, start_id)
    shifted[:, 1:] = ids[:, :-1]
    return shifted


class SequenceClassifier(nn.Module):
    objective = CLASSIFICATION

    def __init__(self, backbone: Backbone, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.backbone = backbone.model
        self.family = backbone.family
        self.architecture = backbone.architecture  # described before any method wraps the backbone
        self.placement = backbone.placement  # where the method put its trainable pieces (the record shows it)
        self.num_labels = num_labels
        self.pad_token_id = backbone.tokenizer.pad_token_id
        self.tokenizer_path = getattr(backbone.tokenizer, "name_or_path", None)  # for prompt init from text
        # set by prompt tuning: PEFT prepends this many embeddings and drops position ids, so a decoder
        # counts positions from the prompt's start (right padding keeps them right)
        self.virtual_tokens = 0
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(self.architecture.final_width, num_labels)

    def freeze_backbone(self) -> SequenceClassifier:
        """No backbone weight trains; the task head does (what every parameter-efficient method starts from)."""
        for param in self.backbone.parameters():
            param.requires_grad_(False)
        for param in self.head.parameters():
            param.requires_grad_(True)
        return self

    def model_inputs(self, input_ids, attention_mask) -> BackboneInputs:
        """Keyword arguments for the backbone; the decoder of an encoder-decoder reads the input shifted right."""
        kwargs: BackboneInputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.family == DECODER and not self.virtual_tokens:
            # count positions from the first real token, so left padding is harmless
            kwargs["position_ids"] = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
        if self.family == ENCODER_DECODER:
            start = getattr(self.backbone.config, "decoder_start_token_id", None)
            start = self.pad_token_id if start is None else start
            kwargs["decoder_input_ids"] = shift_right(input_ids, start)
            kwargs["decoder_attention_mask"] = attention_mask  # decoder position i is real iff input i is
        return kwargs

    def backbone_outputs(self, input_ids, attention_mask, labels=None, output_hidden_states: bool = False):
        """The backbone's outputs (``labels`` is the language model's; a classifier's backbone never reads it)."""
        return self.backbone(
            **self.model_inputs(input_ids, attention_mask), output_hidden_states=output_hidden_states, return_dict=True
        )

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[batch, tokens, width] -> [batch, width] by the family's pooling rule.

        States longer than the mask start with prompt tuning's virtual tokens; they are not pooled.
        """
        hidden = hidden[:, hidden.shape[1] - attention_mask.shape[1] :]
        if self.family == ENCODER:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        if self.family in (DECODER, ENCODER_DECODER):
            # the last real position: it has read the whole input (decoder-only), or all but the
            # final token through the shifted decoder input and all of it through cross-attention (T5)
            index = last_token_index(self.pooling_mask(attention_mask))
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]
        raise AssertionError(self.family)

    def pooling_mask(self, attention_mask):
        """The real positions of the final states (also the decoder's in an encoder-decoder).

        A mask shifted along with the decoder input would give an unpadded row one real position
        fewer than a padded copy of it, so its prediction would depend on the batch it is in.
        """
        return attention_mask

    def decoder_mask(self, attention_mask, labels=None):
        """Real positions of an encoder-decoder's decoder states (the language model's reads ``labels``)."""
        return self.pooling_mask(attention_mask)

    def decoder_states(self, encoder_hidden, input_ids, attention_mask, labels=None) -> tuple:
        """Every decoder layer's states of an encoder-decoder whose decoder reads ``encoder_hidden``
        (READ's ``encoder_output`` wiring: a corrected encoder output), with autograd."""
        # transformers: slow to import, loaded only when used
        from transformers.modeling_outputs import BaseModelOutput

        out = self.backbone(
            **self.model_inputs(input_ids, attention_mask),
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_hidden),
            output_hidden_states=True,
            return_dict=True,
        )
        return out.decoder_hidden_states

    def classify(self, final_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(final_hidden, attention_mask)
        return self.head(self.dropout(pooled.to(self.head.weight.dtype)))

    def forward(self, input_ids, attention_mask):
        out = self.backbone_outputs(input_ids, attention_mask)
        return self.classify(out.last_hidden_state, attention_mask)


def make_task_model(backbone: Backbone, objective: str, num_labels: int) -> nn.Module:
    """The task model a method is applied to: :class:`petlprof.models.language_model.LanguageModel` for ``"lm"`` (the
    backbone must be loaded with ``lm_head=True``), else a :class:`SequenceClassifier` of ``num_labels``."""
    if objective == LM:
        return LanguageModel(backbone)
    return SequenceClassifier(backbone, num_labels)


def trainable_model(
    backbone: Backbone, objective: str, num_labels: int, method: MethodSpec, method_config: Any
) -> nn.Module:
    """The model a run trains and an estimate traces: the objective's task model (:func:`make_task_model`) with
    ``method`` applied by its ``build()`` at ``method_config``."""
    return method.build()(make_task_model(backbone, objective, num_labels), method_config)
