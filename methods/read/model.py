"""READ's side network and its wiring into the three architecture families.

For a stack with layer states ``h_1..h_L`` (each ``[batch, tokens, width]``), per token::

    x_i = W_j · LayerNorm(h_i) + b_j   (+ W_c · c  in the decoder stack of an encoder-decoder)
    s_i = RNN(s_{i-1}, x_i),           s_0 = 0  or  tanh(W_0 · LayerNorm(h_0))
    δ   = W_o · agg(s_1..s_L) + b_o    (W_o, b_o zero-initialised; agg = last or mean)
    y   = head(pool(h_L + δ))

Encoder-decoder wiring (default: no back-propagation through any frozen layer): the encoder
stack's correction δ_enc is mean-pooled over the source tokens into ``c``, which enters every
step of the decoder stack's joiner.
"""

from __future__ import annotations

import torch
from torch import nn

from petlprof.backbones import ENCODER_DECODER

_CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


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

    def forward(self, layer_states, embeddings, context=None):
        batch, tokens, width = layer_states[0].shape
        param_dtype = self.joiner.weight.dtype
        stacked = torch.stack(layer_states, dim=2).to(param_dtype)  # [B, T, L, D]
        x = self.joiner(self.norm(stacked))
        if self.context is not None:
            x = x + self.context(context.to(param_dtype))[:, None, None, :]
        x = x.reshape(batch * tokens, len(layer_states), -1)
        h0 = None
        if self.init is not None:
            h0 = torch.tanh(self.init(self.norm(embeddings.to(param_dtype)))).reshape(1, batch * tokens, -1)
            if self.cell == "lstm":
                h0 = (h0, torch.zeros_like(h0))
        states, _ = self.rnn(x, h0)
        summary = states[:, -1] if self.aggregation == "last" else states.mean(dim=1)
        return self.out(summary).reshape(batch, tokens, width)


class ReadModel(nn.Module):
    """A frozen :class:`SequenceClassifier` backbone with READ side network(s) and a trainable head."""

    def __init__(self, classifier, config):
        super().__init__()
        self.classifier = classifier
        for param in classifier.backbone.parameters():
            param.requires_grad_(False)
        for param in classifier.head.parameters():
            param.requires_grad_(True)
        width = classifier.backbone.config.hidden_size
        self.encoder_decoder = classifier.family == ENCODER_DECODER
        self.side = SideNetwork(width, config, with_context=self.encoder_decoder)
        self.encoder_side = SideNetwork(width, config) if self.encoder_decoder else None

    def train(self, mode: bool = True):
        super().train(mode)
        self.classifier.backbone.eval()  # frozen backbone: no dropout, states never change
        return self

    def forward(self, input_ids, attention_mask):
        with torch.no_grad():
            out = self.classifier.backbone_outputs(input_ids, attention_mask, output_hidden_states=True)
        if self.encoder_decoder:
            enc = out.encoder_hidden_states
            delta_enc = self.encoder_side(list(enc[1:]), enc[0])
            mask = attention_mask.unsqueeze(-1).to(delta_enc.dtype)
            context = (delta_enc * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            states = out.decoder_hidden_states
            delta = self.side(list(states[1:]), states[0], context)
        else:
            states = out.hidden_states
            delta = self.side(list(states[1:]), states[0])
        corrected = out.last_hidden_state.to(delta.dtype) + delta
        return self.classifier.classify(corrected, attention_mask)
