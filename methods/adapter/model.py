"""The bottleneck adapter module and its attachment to a frozen backbone by forward hooks.

A forward hook on a sub-layer's output projection replaces that projection's output ``h`` with
``h + W_up · f(W_down · h)``; what follows in the backbone (dropout, residual add, LayerNorm)
is unchanged, which is where Houlsby et al. place the adapter.
"""

from __future__ import annotations

import torch
from torch import nn

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}


class Bottleneck(nn.Module):
    def __init__(self, width: int, reduction_factor: int, activation: str, dtype: torch.dtype):
        super().__init__()
        self.down = nn.Linear(width, width // reduction_factor, dtype=dtype)
        self.act = _ACTIVATIONS[activation]()
        self.up = nn.Linear(width // reduction_factor, width, dtype=dtype)
        nn.init.trunc_normal_(self.down.weight, std=1e-2, a=-2e-2, b=2e-2)  # Houlsby's near-identity init
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)  # zero update: the adapted model starts as the backbone
        nn.init.zeros_(self.up.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.up(self.act(self.down(hidden)))

    def hook(self, module, args, output):
        return self(output)


def add_adapters(classifier, module_names: list[str], config):
    """Freeze the backbone, hook one adapter after each named module, keep the head trainable."""
    classifier.freeze_backbone()
    width = classifier.backbone.config.hidden_size
    dtype = next(classifier.backbone.parameters()).dtype
    modules = dict(classifier.backbone.named_modules())
    classifier.adapters = nn.ModuleDict()
    for name in module_names:
        adapter = Bottleneck(width, config.reduction_factor, config.activation, dtype)
        classifier.adapters[name.replace(".", "_")] = adapter
        modules[name].register_forward_hook(adapter.hook)
    return classifier
