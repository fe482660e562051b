"""What READ and LST share: a frozen backbone tapped once per batch, and a trainable side network.

A side-tuning model splits its forward pass in two, so the hidden-state cache
(:mod:`petlprof.cache`) can skip the first half once it has seen an example:

* :meth:`SideTunedModel.backbone_states` runs the frozen backbone under ``torch.no_grad`` in eval
  mode and returns named token-aligned tensors ``[batch, tokens, layers + 1, width]`` (index 0 is
  the embedding output, the last index the final hidden state; ``"layers"`` for encoder-only and
  decoder-only models, ``"encoder"`` and ``"decoder"`` for an encoder-decoder);
* :meth:`SideTunedModel.side_forward` turns those tensors into logits;
* :meth:`SideTunedModel.state_masks` says which token positions of each tensor are real (the rest
  is padding, which the side network never reads into a real position).

``forward`` is the composition of the two, so the training loop treats a side-tuning model like
any other model.  Works with any Hugging Face model that returns per-layer hidden states.

This is the abstract base of the method contract (:mod:`petlprof.method_api`, exported as
``petlprof.SideTunedModel``): a plug-in subclasses it, implements :meth:`side_forward` (and
overrides the other two only to tap the backbone differently), declares ``side_tuning=True`` in
its spec, and gets the hidden-state cache.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from petlprof.backbones import ENCODER_DECODER


class SideTunedModel(nn.Module, ABC):
    """A frozen :class:`~petlprof.modeling.SequenceClassifier` backbone plus a trainable side network and head."""

    def __init__(self, classifier):
        super().__init__()
        self.classifier = classifier
        classifier.freeze_backbone()
        self.width = int(classifier.backbone.config.hidden_size)
        self.encoder_decoder = classifier.family == ENCODER_DECODER

    def train(self, mode: bool = True):
        super().train(mode)
        self.classifier.backbone.eval()  # frozen backbone: no dropout, so its states never change
        return self

    @torch.no_grad()
    def backbone_states(self, input_ids, attention_mask) -> dict[str, torch.Tensor]:
        """Every layer's hidden states from one no-autograd pass of the frozen backbone."""
        out = self.classifier.backbone_outputs(input_ids, attention_mask, output_hidden_states=True)
        if self.encoder_decoder:
            return {
                "encoder": torch.stack(out.encoder_hidden_states, dim=2),
                "decoder": torch.stack(out.decoder_hidden_states, dim=2),
            }
        return {"layers": torch.stack(out.hidden_states, dim=2)}

    @torch.no_grad()
    def encoder_states(self, input_ids, attention_mask) -> dict[str, torch.Tensor]:
        """The encoder stack's hidden states only (for wirings that re-run the frozen decoder)."""
        out = self.classifier.backbone.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True
        )
        return {"encoder": torch.stack(out.hidden_states, dim=2)}

    def state_masks(self, attention_mask) -> dict[str, torch.Tensor]:
        """Real (non-padding) token positions of each tensor :meth:`backbone_states` returns."""
        mask = attention_mask.bool()
        if self.encoder_decoder:
            return {"encoder": mask, "decoder": self.classifier.pooling_mask(attention_mask).bool()}
        return {"layers": mask}

    @abstractmethod
    def side_forward(self, states: dict[str, torch.Tensor], input_ids, attention_mask) -> torch.Tensor:
        """Logits from the states :meth:`backbone_states` returned (or the cache assembled: zeros at
        padding positions); the only part of a step that trains."""

    def forward(self, input_ids, attention_mask):
        return self.side_forward(self.backbone_states(input_ids, attention_mask), input_ids, attention_mask)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch, tokens, width] averaged over the real tokens of ``mask`` [batch, tokens]."""
    weights = mask.unsqueeze(-1).to(values.dtype)
    return (values * weights).sum(1) / weights.sum(1).clamp(min=1.0)
