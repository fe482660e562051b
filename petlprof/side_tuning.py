"""What READ and LST share: a frozen backbone tapped once per batch, and a trainable side network.

A side-tuning model splits its forward pass in two, so the hidden-state cache
(:mod:`petlprof.run.cache`) can skip the first half once it has seen an example:

* :meth:`SideTunedModel.backbone_states` runs the frozen backbone under ``torch.no_grad`` in eval
  mode and returns named token-aligned tensors ``[batch, tokens, layers + 1, width]`` (index 0 is
  the embedding output, the last index the final hidden state; ``"layers"`` for encoder-only and
  decoder-only models, ``"encoder"`` and ``"decoder"`` for an encoder-decoder);
* :meth:`SideTunedModel.side_forward` turns those tensors into logits;
* :meth:`SideTunedModel.state_masks` says which token positions of each tensor are real (the rest
  is padding, which the side network never reads into a real position).

``forward`` is the composition of the two, so the training loop treats a side-tuning model like
any other model.  Works with any Hugging Face model that returns per-layer hidden states.

The task model is a :class:`~petlprof.models.classifier.SequenceClassifier` or a
:class:`~petlprof.models.language_model.LanguageModel` (``self.classifier`` either way): ``classify`` puts its head on
the corrected final state, pooled for a classifier, at every position before the frozen LM head for a
language model (as the READ authors' captioning code does).  Under the LM objective every method also
takes ``labels`` (an encoder-decoder's decoder reads the targets; ``state_masks`` then marks the target
positions of the ``"decoder"`` states), passed only when given, so a classification plug-in's
``side_forward(states, input_ids, attention_mask)`` keeps working.  Given labels, a language model's
``classify(final, attention_mask, labels)`` puts the LM head only on the positions the loss reads and
returns :class:`petlprof.models.language_model.TargetLogits`; a side network that corrects each position on its own
(READ) corrects only those (``classifier.scored_positions(labels)``, then ``classifier.score``).  A
plug-in that returns every position's logits still trains: the loss takes either.

Generation (:func:`petlprof.models.language_model.greedy_generate`): the backbone keeps its KV cache and each new
token goes through it once, giving that position's per-layer states.  By default the side network
then runs again over the states of every position so far (kept as they come) and the last position's
logits are taken, which is right for any side network (LST's attends over earlier tokens); a side
network that works per position (READ recurs over depth, not time) overrides
:meth:`SideTunedModel.generation_logits` to run once on the new position and sets
``keeps_generation_states = False``.

This is the abstract base of the method contract (:mod:`petlprof.method_api`, exported as
``petlprof.SideTunedModel``): a plug-in subclasses it, implements :meth:`side_forward` (and
overrides the other two only to tap the backbone differently), declares ``side_tuning=True`` in
its spec, and gets the hidden-state cache.  It stands with the contract, below the methods
(``petlprof.methods.read``, ``petlprof.methods.lst``), which import it from here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from petlprof.models.families import ENCODER_DECODER
from petlprof.models.language_model import last_logits
from petlprof.vocabulary import LM


class SideTunedModel(nn.Module, ABC):
    """A frozen :class:`~petlprof.models.classifier.SequenceClassifier` backbone plus a trainable side network and
    head."""

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

    keeps_generation_states = True  # generation keeps every position's states for the side network

    @torch.no_grad()
    def backbone_states(self, input_ids, attention_mask, labels=None) -> dict[str, torch.Tensor]:
        """Every layer's hidden states from one no-autograd pass of the frozen backbone."""
        out = self.classifier.backbone_outputs(input_ids, attention_mask, labels=labels, output_hidden_states=True)
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

    def scored_positions(self, labels) -> torch.Tensor | None:
        """``[B, T]`` bool: the positions whose logits a language model's loss reads, given ``labels``; None for
        a classifier, without labels, or where the task model puts its head everywhere."""
        if labels is None or getattr(self.classifier, "objective", None) != LM:
            return None
        return self.classifier.scored_positions(labels)

    def head_labels(self, labels) -> dict[str, torch.Tensor]:
        """``{"labels": labels}`` for the task model's ``classify`` under the LM objective (the head then goes
        only where the loss reads it), else ``{}``."""
        return {"labels": labels} if self.scored_positions(labels) is not None else {}

    def state_masks(self, attention_mask, labels=None) -> dict[str, torch.Tensor]:
        """Real (non-padding) token positions of each tensor :meth:`backbone_states` returns."""
        mask = attention_mask.bool()
        if self.encoder_decoder:
            return {"encoder": mask, "decoder": self.classifier.decoder_mask(attention_mask, labels).bool()}
        return {"layers": mask}

    @abstractmethod
    def side_forward(self, states: dict[str, torch.Tensor], input_ids, attention_mask, labels=None) -> torch.Tensor:
        """Logits from the states :meth:`backbone_states` returned (or the cache assembled: zeros at
        padding positions); the only part of a step that trains."""

    def forward(self, input_ids, attention_mask, labels=None):
        extra = {} if labels is None else {"labels": labels}
        return self.side_forward(
            self.backbone_states(input_ids, attention_mask, **extra), input_ids, attention_mask, **extra
        )

    # --- generation (language models) ------------------------------------------------------------------------

    def generation_start(self, input_ids, attention_mask):
        """(logits of the first new token [B, V], generation state): the backbone reads the prompts once,
        filling its KV cache, and the side network corrects the newest position's final state."""
        new, cache = self.classifier.prefill(input_ids, attention_mask, output_hidden_states=True)
        return self._generation_begin(input_ids, attention_mask, new, cache)

    def _generation_begin(self, input_ids, attention_mask, new, cache):
        state = {"cache": cache, "input_ids": input_ids, "attention_mask": attention_mask}
        state["states"] = {name: value for name, value in new.items() if name != "final"}
        if self.encoder_decoder:  # the decoder's targets so far: a placeholder for the position being predicted
            state["labels"] = input_ids.new_full((input_ids.shape[0], 1), self.classifier.pad_token_id)
        return self.generation_logits(state, new), state

    def generation_step(self, token, state):
        """(logits of the next token [B, V], generation state) after feeding ``token`` [B] through the backbone
        with its KV cache (only that token goes through it)."""
        new, cache = self.classifier.extend(token, state["cache"], output_hidden_states=True)
        state = {**state, "cache": cache}
        if self.encoder_decoder:
            labels = state["labels"]
            state["labels"] = torch.cat([labels[:, :-1], token[:, None], labels[:, -1:]], dim=1)
        else:
            mask = state["attention_mask"]
            state["input_ids"] = torch.cat([state["input_ids"], token[:, None]], dim=1)
            state["attention_mask"] = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        if self.keeps_generation_states:
            name = "decoder" if self.encoder_decoder else "layers"
            state["states"] = {**state["states"], name: torch.cat([state["states"][name], new[name]], dim=1)}
        return self.generation_logits(state, new), state

    def generation_logits(self, state, new) -> torch.Tensor:
        """The next token's logits [B, V]: by default the side network over the states of every position so far
        (``state["states"]``), the last position's logits.  ``new``: the newest position's states alone."""
        extra = {"labels": state["labels"]} if self.encoder_decoder else {}
        logits = self.side_forward(state["states"], state["input_ids"], state["attention_mask"], **extra)
        return last_logits(logits, state["input_ids"].shape[0])


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[batch, tokens, width] averaged over the real tokens of ``mask`` [batch, tokens]."""
    weights = mask.unsqueeze(-1).to(values.dtype)
    return (values * weights).sum(1) / weights.sum(1).clamp(min=1.0)
