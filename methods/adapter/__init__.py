"""Bottleneck adapters (Houlsby et al. 2019; Pfeiffer et al. 2021): a small residual MLP
``h + W_up · f(W_down · h)`` after a transformer sub-layer's output projection, before the
residual connection; the backbone is frozen and the task head trains as well.

Placements: ``houlsby`` puts one adapter after the attention block and one after the
feed-forward block of every layer; ``pfeiffer`` only after the feed-forward block.  In the T5
decoder the attention adapter follows self-attention, not cross-attention (as in the ``adapters``
library's defaults).  The bottleneck width is ``width // reduction_factor``; ``W_up`` starts at
zero, so step 0 reproduces the backbone exactly.

Why not the ``adapters`` library: its 1.3.0 release requires ``transformers~=4.57.6`` (installing
it would downgrade the transformers 5 petlprof uses) and does not even import next to it
(``huggingface_hub`` 1.x no longer has ``HfFolder``).  So the adapters are forward hooks on the
output projections, found by name per architecture below; the backbone's weights and parameter
names stay untouched, and the adapters live in the model's ``adapters`` module dict
(:mod:`petlprof.methods.adapter.model`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.method_api import MAX_WIDTH, MethodConfig, choice, integer
from petlprof.registry import MethodSpec, register_method

PLACEMENTS = ("houlsby", "pfeiffer")
ACTIVATIONS = ("relu", "gelu", "silu", "tanh")

# model_type -> (attention block's output projection, feed-forward block's output projection), full names
SUBLAYER_OUTPUTS: dict[str, tuple[str, str]] = {
    "bert": (r"(.*\.)?layer\.\d+\.attention\.output\.dense", r"(.*\.)?layer\.\d+\.output\.dense"),
    "t5": (
        r"(encoder|decoder)\.block\.\d+\.layer\.0\.SelfAttention\.o",
        r"(encoder|decoder)\.block\.\d+\.layer\.\d+\.DenseReluDense\.wo",
    ),
    "gpt2": (r"(.*\.)?h\.\d+\.attn\.c_proj", r"(.*\.)?h\.\d+\.mlp\.c_proj"),
    "llama": (r"(.*\.)?layers\.\d+\.self_attn\.o_proj", r"(.*\.)?layers\.\d+\.mlp\.down_proj"),
}


@dataclass
class AdapterConfig(MethodConfig):
    reduction_factor: int = integer(
        16, "bottleneck width = backbone width / reduction_factor (the Pareto knob)", maximum=MAX_WIDTH
    )
    placement: str = choice(
        "houlsby", "houlsby: after attention and feed-forward; pfeiffer: after feed-forward", PLACEMENTS
    )
    activation: str = choice("relu", "bottleneck non-linearity", ACTIVATIONS)

    def check_width(self, width: int, backbone: str) -> None:
        """Called before a sweep starts: the bottleneck must keep at least one unit."""
        if width // self.reduction_factor < 1:
            raise UsageError(
                f"adapter reduction_factor {self.reduction_factor} leaves no bottleneck for backbone "
                f"'{backbone}' of width {width}; use at most {width}"
            )


def adapted_modules(backbone, placement: str) -> list[str]:
    """Names of the backbone modules whose output gets an adapter, in model order."""
    model_type = backbone.config.model_type
    if model_type not in SUBLAYER_OUTPUTS:
        raise UsageError(
            f"adapter knows where the sub-layers of {', '.join(SUBLAYER_OUTPUTS)} models end, not of '{model_type}'"
        )
    attention, feedforward = SUBLAYER_OUTPUTS[model_type]
    pattern = re.compile(feedforward if placement == "pfeiffer" else f"{attention}|{feedforward}")
    names = [name for name, _ in backbone.named_modules() if pattern.fullmatch(name)]
    if not names:
        raise UsageError(f"adapter found no sub-layer outputs in this {model_type} backbone")
    return names


def apply(classifier, config: AdapterConfig):
    from petlprof.methods.adapter.model import add_adapters

    width = classifier.backbone.config.hidden_size
    config.check_width(width, classifier.backbone.config.model_type)
    return add_adapters(classifier, adapted_modules(classifier.backbone, config.placement), config)


register_method(
    MethodSpec(
        name="adapter",
        description="bottleneck adapters after attention and/or feed-forward blocks (Houlsby/Pfeiffer) + task head",
        config_cls=AdapterConfig,
        apply="petlprof.methods.adapter:apply",
        default_lr=1e-3,
        lr_source="Houlsby et al. 2019 swept 3e-5..1e-3; the top of that range for a one-epoch budget (84.3% on the "
        "offline default after one 2000-example epoch, 300 eval examples)",
        pareto_knob="reduction_factor",
        default_grid=(4, 16, 64),
    )
)
