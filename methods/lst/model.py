"""LST's ladder side network and its wiring into the three architecture families.

For a stack with states ``h_0..h_L`` (``h_0`` the embedding output; width ``d``) and a side
network of width ``d' = d / r``, per token::

    g_0 = D_0 · h_0
    μ_i = sigmoid(α_i / T)                             (α_i = 0 at init: μ_i = 1/2)
    g_i = Layer_i(μ_i · D_i · h_i + (1 - μ_i) · g_{i-1}),   i = 1..L
    δ   = U · LayerNorm(g_L)                           (U zero-initialised)
    y   = head(pool(h_L + δ))

(under the LM objective, given labels, the head only at the positions the loss reads; the side network
still runs at every position, since its attention reads earlier ones)

``D_i`` are the downsampling ladder connections (``d -> d'``), ``U`` the upsampler (``d' -> d``),
and ``Layer_i`` a pre-LayerNorm transformer layer of width ``d'`` (self-attention over the real
tokens, causal in decoder stacks, then a feed-forward block).  In an encoder-decoder the decoder
stack's side layers also cross-attend to the encoder side network's output ``g^enc_L`` (as LST's
side decoder does), so no gradient passes through a frozen layer.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from petlprof.backbones import DECODER
from petlprof.methods.side_tuning import SideTunedModel


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width, bias=False)  # softmax ignores a key bias: it would get no gradient
        self.value = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x, memory, allowed):
        """``allowed`` [batch, 1, queries, keys] (bool): which keys each query may read."""

        def split(t):
            return t.reshape(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(
            split(self.query(x)), split(self.key(memory)), split(self.value(memory)), attn_mask=allowed
        )
        return self.out(mixed.transpose(1, 2).reshape(x.shape))


class SideLayer(nn.Module):
    """A pre-LayerNorm transformer layer of the side network's width."""

    def __init__(self, width: int, heads: int, ffn_multiplier: int, cross: bool):
        super().__init__()
        self.norm_self = nn.LayerNorm(width)
        self.self_attention = Attention(width, heads)
        self.norm_cross = nn.LayerNorm(width) if cross else None
        self.cross_attention = Attention(width, heads) if cross else None
        self.norm_ffn = nn.LayerNorm(width)
        self.ffn = nn.Sequential(
            nn.Linear(width, ffn_multiplier * width), nn.GELU(), nn.Linear(ffn_multiplier * width, width)
        )

    def forward(self, x, allowed, memory=None, memory_allowed=None):
        normed = self.norm_self(x)
        x = x + self.self_attention(normed, normed, allowed)
        if self.cross_attention is not None:
            x = x + self.cross_attention(self.norm_cross(x), memory, memory_allowed)
        return x + self.ffn(self.norm_ffn(x))


def _heads(width: int, wanted: int) -> int:
    return max(h for h in range(1, min(wanted, width) + 1) if width % h == 0)


class LadderStack(nn.Module):
    """The side network of one backbone stack of ``depth`` layers."""

    def __init__(self, width: int, depth: int, config, causal: bool, cross: bool = False, upsample: bool = True):
        super().__init__()
        side = width // config.reduction_factor
        self.causal = causal
        self.temperature = config.gate_temperature
        self.down = nn.ModuleList(nn.Linear(width, side) for _ in range(depth + 1))
        self.gate_logits = nn.Parameter(torch.zeros(depth))  # α_i
        heads = _heads(side, config.num_heads)
        self.layers = nn.ModuleList(SideLayer(side, heads, config.ffn_multiplier, cross) for _ in range(depth))
        self.norm = nn.LayerNorm(side)
        self.up = nn.Linear(side, width) if upsample else None
        if self.up is not None:
            nn.init.zeros_(self.up.weight)  # step 0 reproduces the backbone exactly
            nn.init.zeros_(self.up.bias)

    def allowed(self, mask: torch.Tensor) -> torch.Tensor:
        """Queries read real keys (earlier ones only if causal); a padding query reads itself, so no row is empty."""
        tokens = mask.shape[1]
        eye = torch.eye(tokens, dtype=torch.bool, device=mask.device)
        allowed = mask[:, None, :].expand(-1, tokens, -1)
        if self.causal:
            allowed = allowed & torch.ones(tokens, tokens, dtype=torch.bool, device=mask.device).tril()
        return (allowed | eye)[:, None]

    def forward(self, stack, mask, memory=None, memory_mask=None):
        """``stack`` [batch, tokens, depth + 1, width] -> (δ [batch, tokens, width] or None, g_L)."""
        if stack.shape[2] != len(self.down):
            raise ValueError(f"LST side network built for {len(self.down) - 1} layers got {stack.shape[2] - 1}")
        stack = stack.to(self.gate_logits.dtype)
        allowed = self.allowed(mask)
        memory_allowed = None if memory is None else memory_mask[:, None, None, :].bool()
        gates = torch.sigmoid(self.gate_logits / self.temperature)
        side = self.down[0](stack[:, :, 0])
        for i, layer in enumerate(self.layers):
            mixed = gates[i] * self.down[i + 1](stack[:, :, i + 1]) + (1 - gates[i]) * side
            side = layer(mixed, allowed, memory, memory_allowed)
        side = self.norm(side)
        return (self.up(side) if self.up is not None else None), side


def _depths(config) -> tuple[int, int | None]:
    """(encoder or only stack depth, decoder depth of an encoder-decoder) from a transformers config."""
    if getattr(config, "is_encoder_decoder", False):
        enc = getattr(config, "encoder_layers", None) or config.num_hidden_layers
        dec = getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", None) or enc
        return int(enc), int(dec)
    return int(config.num_hidden_layers), None


class LstModel(SideTunedModel):
    """A frozen backbone with LST ladder side network(s) and a trainable head."""

    def __init__(self, classifier, config):
        super().__init__(classifier)
        depth, decoder_depth = _depths(classifier.backbone.config)
        if self.encoder_decoder:
            self.encoder_side = LadderStack(self.width, depth, config, causal=False, upsample=False)
            self.side = LadderStack(self.width, decoder_depth, config, causal=True, cross=True)
        else:
            self.side = LadderStack(self.width, depth, config, causal=classifier.family == DECODER)

    def side_forward(self, states, input_ids, attention_mask, labels=None):
        masks = self.state_masks(attention_mask, labels)
        if self.encoder_decoder:
            _, memory = self.encoder_side(states["encoder"], masks["encoder"])
            stack = states["decoder"]
            delta, _ = self.side(stack, masks["decoder"], memory, masks["encoder"])
        else:
            stack = states["layers"]
            delta, _ = self.side(stack, masks["layers"])
        final = stack[:, :, -1].to(delta.dtype) + delta  # every position: the side network attends over them
        return self.classifier.classify(final, attention_mask, **self.head_labels(labels))
