"""READ's side network and its wiring into the three architecture families.

For a stack with states ``h_0..h_L`` (``h_0`` the embedding output; each ``[batch, tokens, width]``),
per token::

    x_i = W_j · LayerNorm(h_i) + b_j   (+ W_c · c  in the decoder stack, ``t5_wiring="side"``)
    s_i = RNN(s_{i-1}, x_i),           s_0 = 0  or  tanh(W_0 · LayerNorm(h_0))
    δ   = W_o · agg(s_1..s_L) + b_o    (W_o, b_o zero-initialised; agg = last or mean)
    y   = head(pool(h_L + δ))

computed at the real (non-padding) tokens only; padding positions, which no pooling rule reads,
get δ = 0.  Under the LM objective the corrected state of every position goes through the frozen LM
head (``y = lm_head(h_L + δ)``; READ's captioning setup); in training and the teacher-forced loss only
the positions whose logits the loss reads are corrected and projected (each position is corrected on
its own, so the rest would be thrown away), and at generation the side network runs once
per new token, on that position's per-layer states alone (it recurs over depth, not time), while the
backbone keeps its KV cache.

Encoder-decoder wirings:

* ``side`` (default; no back-propagation through any frozen layer): the encoder stack's
  correction δ_enc is mean-pooled over the source tokens into ``c``, which enters every step of
  the decoder stack's joiner; the decoder states come from the same no-autograd pass.
* ``encoder_output`` (the authors' code): the frozen decoder attends to the corrected encoder
  output ``h^enc_L + δ_enc``, so it runs again *with* autograd (its weights stay frozen; the
  gradient flows through its activations into the encoder side network), and the decoder side
  network reads the states of that pass.
"""

from __future__ import annotations

import torch
from torch import nn

from petlprof.side_tuning import SideTunedModel, masked_mean

_CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


def _given_context(context: torch.Tensor | None) -> torch.Tensor:
    if context is None:
        raise ValueError("this READ side network reads a context vector, and none was passed")
    return context


class SideNetwork(nn.Module):
    """One recurrent network shared by all layers of one stack."""

    def __init__(self, width: int, config, with_context: bool = False):
        super().__init__()
        hidden = config.hidden_size
        self.cell = config.cell
        self.aggregation = config.aggregation
        self.norm = nn.LayerNorm(width)
        self.joiner = nn.Linear(width, hidden)
        self.context = nn.Linear(width, hidden, bias=False) if with_context else None
        self.init = nn.Linear(width, hidden) if config.init_state == "embedding" else None
        self.rnn = _CELLS[config.cell](hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, width)
        nn.init.zeros_(self.out.weight)  # step 0 reproduces the backbone exactly
        nn.init.zeros_(self.out.bias)

    def forward(self, stack: torch.Tensor, mask: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """``stack`` [batch, tokens, layers + 1, width] (embedding output first) -> δ [batch, tokens, width].

        The RNN runs on the real tokens of ``mask`` only; padding positions get δ = 0 (no pooling rule
        reads them)."""
        if self.context is None:
            delta = self.correct(stack[mask])
        else:
            rows = mask.nonzero(as_tuple=True)[0]
            delta = self.correct(stack[mask], _given_context(context)[rows])
        return delta.new_zeros(*mask.shape, delta.shape[-1]).masked_scatter(mask.unsqueeze(-1), delta)

    def correct(self, real: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """δ ``[N, width]`` of ``N`` positions from their states ``[N, layers + 1, width]`` (and their rows'
        context ``[N, width]``): the network on those positions alone (each is corrected on its own)."""
        param_dtype = self.joiner.weight.dtype
        real = real.to(param_dtype)
        x = self.joiner(self.norm(real[:, 1:]))
        if self.context is not None:
            x = x + self.context(_given_context(context).to(param_dtype))[:, None, :]
        h0: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None
        if self.init is not None:
            hidden = torch.tanh(self.init(self.norm(real[:, 0]))).unsqueeze(0)
            h0 = (hidden, torch.zeros_like(hidden)) if self.cell == "lstm" else hidden
        states, _ = self.rnn(x, h0)
        summary = states[:, -1] if self.aggregation == "last" else states.mean(dim=1)
        return self.out(summary)


class ReadModel(SideTunedModel):
    """A frozen backbone with READ side network(s) and a trainable head (a frozen LM head under the LM objective)."""

    keeps_generation_states = False  # a per-position network: generation feeds it the new position only

    def __init__(self, classifier, config):
        super().__init__(classifier)
        self.wiring = config.t5_wiring if self.encoder_decoder else None
        self.side = SideNetwork(self.width, config, with_context=self.wiring == "side")
        self.encoder_side = SideNetwork(self.width, config) if self.encoder_decoder else None

    def backbone_states(self, input_ids, attention_mask, labels=None) -> dict[str, torch.Tensor]:
        if self.wiring == "encoder_output":  # the decoder runs in side_forward, on the corrected encoder output
            return self.encoder_states(input_ids, attention_mask)
        return super().backbone_states(input_ids, attention_mask, labels)

    def state_masks(self, attention_mask, labels=None) -> dict[str, torch.Tensor]:
        """The positions the side network reads: the real ones; under the LM objective a decoder's only where
        the loss reads the logits (each position is corrected on its own, so the hidden-state cache keeps only
        those; an encoder-decoder's decoder positions are the targets already)."""
        if self.wiring == "encoder_output":
            return {"encoder": attention_mask.bool()}
        masks = super().state_masks(attention_mask, labels)
        scored = self.scored_positions(labels)
        if scored is not None and not self.encoder_decoder:
            masks["layers"] = masks["layers"] & scored
        return masks

    def side_forward(self, states, input_ids, attention_mask, labels=None):
        masks = self.state_masks(attention_mask, labels)
        context = None
        if not self.encoder_decoder:
            stack, at = states["layers"], masks["layers"]
        elif self.wiring == "side":
            delta_enc = self.encoder_side(states["encoder"], masks["encoder"])
            stack, at = states["decoder"], masks["decoder"]
            context = masked_mean(delta_enc, attention_mask)
        else:
            encoder = states["encoder"]
            delta_enc = self.encoder_side(encoder, masks["encoder"])
            corrected = encoder[:, :, -1].to(delta_enc.dtype) + delta_enc
            stack = torch.stack(self.classifier.decoder_states(corrected, input_ids, attention_mask, labels), dim=2)
            at = self.classifier.decoder_mask(attention_mask, labels).bool()
        scored = self.scored_positions(labels)
        if scored is None:  # a classifier (it pools), or the LM head at every position
            delta = self.side(stack, at, context)
            corrected_final = stack[:, :, -1].to(delta.dtype) + delta
            return self.classifier.classify(corrected_final, attention_mask)
        at = at & scored  # the LM objective: only the positions whose logits the loss reads
        real = stack[at]
        delta = self.side.correct(real, None if context is None else context[at.nonzero(as_tuple=True)[0]])
        return self.classifier.score(real[:, -1].to(delta.dtype) + delta, labels, at)

    # --- generation: the side network once per new token -------------------------------------------------------

    def generation_start(self, input_ids, attention_mask):
        if self.wiring != "encoder_output":
            return super().generation_start(input_ids, attention_mask)
        encoder = self.encoder_states(input_ids, attention_mask)["encoder"]
        delta_enc = self.encoder_side(encoder, attention_mask.bool())
        corrected = encoder[:, :, -1].to(delta_enc.dtype) + delta_enc
        dtype = next(self.classifier.backbone.parameters()).dtype
        new, cache = self.classifier.prefill(
            input_ids, attention_mask, output_hidden_states=True, encoder_hidden=corrected.to(dtype)
        )
        return self._generation_begin(input_ids, attention_mask, new, cache)

    def generation_logits(self, state, new) -> torch.Tensor:
        """The side network on the newest position's per-layer states only (the context of the ``side``
        wiring, from the encoder's correction, is computed once per prompt)."""
        stack = new["decoder" if self.encoder_decoder else "layers"][:, -1:]
        context = None
        if self.wiring == "side":
            if "context" not in state:
                delta_enc = self.encoder_side(state["states"]["encoder"], state["attention_mask"].bool())
                state["context"] = masked_mean(delta_enc, state["attention_mask"])
            context = state["context"]
        real = torch.ones(stack.shape[:2], dtype=torch.bool, device=stack.device)
        delta = self.side(stack, real, context)
        return self.classifier.classify(stack[:, :, -1].to(delta.dtype) + delta)[:, -1]
