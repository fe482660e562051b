"""LST's ladder side network, shaped and initialised from the backbone, and its wiring into the three families.

For a stack with states ``h_0..h_L`` (``h_0`` the embedding output; width ``d``) and a side network of
width ``d' = d / r``, per token::

    g_0 = D_0 · h_0
    μ_i = sigmoid(α_i / T)                             (α_i = 0 at init: μ_i = 1/2)
    g_i = Layer_i(μ_i · g_{i-1} + (1 - μ_i) · D_i · h_i),   i = 1..L
    δ   = U · Norm(g_L)                                (U zero-initialised)
    y   = head(pool(h_L + δ))

(under the LM objective, given labels, the head only at the positions the loss reads; the side network
still runs at every position, since its attention reads earlier ones)

As in the authors' code (their side T5 is the backbone's config with ``d_model``, ``d_kv`` and ``d_ff``
divided by ``r``), ``Layer_i`` has the backbone block's shape with its widths divided by ``r``: the
backbone's head count (and key/value head count) is kept, each head ``d' / heads`` wide, the feed-forward
block ``d_ff / r`` wide, with the backbone's norm (LayerNorm or RMSNorm), norm placement (pre-norm, or
post-norm for BERT-style encoders), activation, gated or plain feed-forward, bias terms and attention
scaling (none in T5).  It is a generic block built from those facts, not the family's own module class:
transformers' blocks take model-level state (T5's shared relative position bias, LLaMA's rotary tables,
version-specific mask and cache arguments) that a standalone side block cannot be given reliably; the
side layers have no position encoding of their own and read positions from the ladders.

``lst.init=pruned`` (the default) initialises every side layer ``i`` from backbone layer ``i``
structurally pruned to the side width, as the LST paper does (their ``pruning_v2``: keep the rows and
columns of largest L1 norm): the ``d'`` residual dimensions whose embedding columns have the largest L1
norm (kept for the whole stack, so the residual stream stays aligned; the authors' code picks them
afresh after every projection); in each attention head the ``d' / heads`` query/key/value rows with the
largest L1 norm of the elementwise product of their query, key and value rows (the authors' importance,
taken per head so the kept head count means something); in the feed-forward block the ``d_ff / r`` units
with the largest L1 norm of the product of their input and output weights; norms restricted to the
kept dimensions; the final norm from the backbone's.  The ladders ``D_i`` then start as the selection of
the kept dimensions, so step 0's side network is the pruned backbone fed with the backbone's own states
(the authors' ladders start random, N(0, 0.01)).  ``lst.init=random`` keeps PyTorch's default init.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN

from petlprof.errors import UsageError
from petlprof.methods.lst.pruning import initialise_from_backbone
from petlprof.models.families import DECODER, ENCODER
from petlprof.side_tuning import SideTunedModel


class RMSNorm(nn.Module):
    """T5's and LLaMA's norm: no mean subtraction, no bias."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Shape:
    """What the side network takes from the backbone: widths, heads, norm, activation, placement."""

    def __init__(self, backbone, family: str, reduction_factor: int, kv_heads: int | None = None):
        config = backbone.config
        self.model_type = getattr(config, "model_type", "")
        self.width = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        # the backbone's own key/value heads as its projections have them (the architecture description's
        # kv_width): a config may not say (Falcon's multi-query before transformers 5.25 had no
        # num_key_value_heads), and the pruned initialisation copies those projections' rows
        self.kv_heads = kv_heads or int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.r = reduction_factor
        self.side = self.width // reduction_factor
        if self.heads % self.kv_heads:
            raise UsageError(f"lst cannot pair {self.heads} query heads with {self.kv_heads} key/value heads")
        self.head_dim = self.side // self.heads
        ffn = (
            getattr(config, "d_ff", None)
            or getattr(config, "intermediate_size", None)
            or getattr(config, "n_inner", None)
            or 4 * self.width
        )
        self.ffn = max(1, int(ffn) // reduction_factor)
        act = getattr(config, "dense_act_fn", None) or getattr(config, "hidden_act", None)
        act = act or getattr(config, "activation_function", None) or "gelu"
        self.activation = ACT2FN[act]
        self.activation_name = act
        names = {type(m).__name__ for m in backbone.modules()}
        self.rms = any("RMSNorm" in n or n == "T5LayerNorm" for n in names)
        self.eps = float(
            getattr(config, "layer_norm_epsilon", None)
            or getattr(config, "rms_norm_eps", None)
            or getattr(config, "layer_norm_eps", None)
            or 1e-5
        )
        self.post_norm = family == ENCODER and self.model_type != "t5"  # BERT-style: norm after each residual add
        self.gated = bool(getattr(config, "is_gated_act", False)) or self.model_type in ("llama", "mistral", "qwen2")
        self.bias = (
            any(isinstance(m, nn.Linear) and m.bias is not None for m in backbone.modules())
            or self.model_type == "gpt2"
        )
        self.scaled = self.model_type != "t5"  # T5 folds the 1/sqrt(d) into its initialisation
        # the backbone's attention implementation, which the side layers follow: eager (its scores materialised,
        # as `estimate --attention eager` prices the backbone) or scaled_dot_product_attention (sdpa, flash)
        self.eager = getattr(config, "_attn_implementation", None) == "eager"

    def norm(self) -> nn.Module:
        return RMSNorm(self.side, self.eps) if self.rms else nn.LayerNorm(self.side, eps=self.eps)

    def describe(self) -> dict:
        return {
            "width": self.side,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "ffn": self.ffn,
            "norm": "rms" if self.rms else "layernorm",
            "placement": "post" if self.post_norm else "pre",
            "attention": "eager" if self.eager else "sdpa",
            "activation": self.activation_name,
            "gated": self.gated,
        }


class Attention(nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        side, kv = shape.side, shape.kv_heads * shape.head_dim
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.scale = None if shape.scaled else 1.0
        self.eager = shape.eager
        self.query = nn.Linear(side, side, bias=shape.bias)
        self.key = nn.Linear(side, kv, bias=False)  # softmax ignores a key bias: it would get no gradient
        self.value = nn.Linear(side, kv, bias=shape.bias)
        self.out = nn.Linear(side, side, bias=shape.bias)

    def forward(self, x, memory, allowed):
        """``allowed`` [batch, 1, queries, keys] (bool): which keys each query may read."""

        def split(t, heads):
            t = t.reshape(t.shape[0], t.shape[1], heads, self.head_dim).transpose(1, 2)
            return t.repeat_interleave(self.heads // heads, dim=1) if heads != self.heads else t

        query, key, value = (
            split(self.query(x), self.heads),
            split(self.key(memory), self.kv_heads),
            split(self.value(memory), self.kv_heads),
        )
        if self.eager:
            mixed = eager_attention(query, key, value, allowed, self.scale)
        else:
            mixed = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=self.scale)
        return self.out(mixed.transpose(1, 2).reshape(x.shape))


def eager_attention(query, key, value, allowed, scale: float | None):
    """softmax(q k^T * scale) v with the scores materialised, as a backbone's eager attention computes it (``scale``
    None: 1/sqrt(head dim)); a key a query may not read gets the dtype's lowest score, so a query that may read
    none (a padding position) averages them all instead of giving NaN."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1), value)


class FeedForward(nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        self.activation = shape.activation
        self.inner = nn.Linear(shape.side, shape.ffn, bias=shape.bias)
        self.gate = nn.Linear(shape.side, shape.ffn, bias=shape.bias) if shape.gated else None
        self.outer = nn.Linear(shape.ffn, shape.side, bias=shape.bias)

    def forward(self, x):
        if self.gate is not None:  # act(gate(x)) * up(x), LLaMA's and T5 v1.1's gated unit
            return self.outer(self.activation(self.gate(x)) * self.inner(x))
        return self.outer(self.activation(self.inner(x)))


class SideLayer(nn.Module):
    """One side layer: the backbone block's structure at the side width."""

    def __init__(self, shape: Shape, cross: bool):
        super().__init__()
        self.post_norm = shape.post_norm
        self.norm_self = shape.norm()
        self.self_attention = Attention(shape)
        self.norm_cross = shape.norm() if cross else None
        self.cross_attention = Attention(shape) if cross else None
        self.norm_ffn = shape.norm()
        self.ffn = FeedForward(shape)

    def forward(self, x, allowed, memory=None, memory_allowed=None):
        if self.post_norm:
            x = self.norm_self(x + self.self_attention(x, x, allowed))
            if self.cross_attention is not None:
                x = self.norm_cross(x + self.cross_attention(x, memory, memory_allowed))
            return self.norm_ffn(x + self.ffn(x))
        normed = self.norm_self(x)
        x = x + self.self_attention(normed, normed, allowed)
        if self.cross_attention is not None:
            x = x + self.cross_attention(self.norm_cross(x), memory, memory_allowed)
        return x + self.ffn(self.norm_ffn(x))


class LadderStack(nn.Module):
    """The side network of one backbone stack of ``depth`` layers."""

    def __init__(self, shape: Shape, depth: int, config, causal: bool, cross: bool = False, upsample: bool = True):
        super().__init__()
        width, side = shape.width, shape.side
        self.causal = causal
        self.temperature = config.gate_temperature
        self.down = nn.ModuleList(nn.Linear(width, side) for _ in range(depth + 1))
        self.gate_logits = nn.Parameter(torch.zeros(depth))  # α_i: μ_i = 1/2 at init, as in the paper
        self.layers = nn.ModuleList(SideLayer(shape, cross) for _ in range(depth))
        self.norm = shape.norm()
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

    def side_states(self, stack, mask, memory=None, memory_mask=None) -> torch.Tensor:
        """``stack`` [batch, tokens, depth + 1, width] -> the normed final side state g_L [batch, tokens, d']."""
        if stack.shape[2] != len(self.down):
            raise ValueError(f"LST side network built for {len(self.down) - 1} layers got {stack.shape[2] - 1}")
        stack = stack.to(self.gate_logits.dtype)
        allowed = self.allowed(mask)
        memory_allowed = None if memory is None else memory_mask[:, None, None, :].bool()
        gates = torch.sigmoid(self.gate_logits / self.temperature)
        side = self.down[0](stack[:, :, 0])
        for i, layer in enumerate(self.layers):
            mixed = gates[i] * side + (1 - gates[i]) * self.down[i + 1](stack[:, :, i + 1])
            side = layer(mixed, allowed, memory, memory_allowed)
        return self.norm(side)

    def forward(self, stack, mask, memory=None, memory_mask=None):
        """-> (δ [batch, tokens, width] or None, g_L)."""
        side = self.side_states(stack, mask, memory, memory_mask)
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
        backbone = classifier.backbone
        arch = classifier.architecture
        self.shape = Shape(
            backbone, classifier.family, config.reduction_factor, kv_heads=arch.kv_width // arch.head_dim
        )
        self.init = config.init
        depth, decoder_depth = _depths(backbone.config)
        if self.encoder_decoder:
            self.encoder_side = LadderStack(self.shape, depth, config, causal=False, upsample=False)
            self.side = LadderStack(self.shape, decoder_depth, config, causal=True, cross=True)
        else:
            self.side = LadderStack(self.shape, depth, config, causal=classifier.family == DECODER)
        if config.init == "pruned":
            initialise_from_backbone(self, backbone)

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

    def side_network_summary(self) -> dict:
        """The side network's shape, layers, initialisation and trainable parameter count (side and ladders)."""
        stacks = [s for s in (getattr(self, "encoder_side", None), self.side) if s is not None]
        params = sum(p.numel() for s in stacks for p in s.parameters())
        return {**self.shape.describe(), "layers": [len(s.layers) for s in stacks], "init": self.init, "params": params}
