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
output projections that the architecture description (:mod:`petlprof.models.architecture`) finds: an
explicit entry for the bert, t5, gpt2 and llama families, for any other model the last projection
back to the model width of each block's (first) attention module and of its feed-forward part.
The backbone's weights and parameter names stay untouched, and the adapters live in the model's
``adapters`` module dict (:mod:`petlprof.methods.adapter.model`).  ALBERT runs one shared layer
at every depth, so its adapters are shared the same way.  Under the LM objective the hooks sit on the
same projections inside the model with its LM head, which stays frozen: only the adapters train.
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.method_api import MAX_WIDTH, MethodConfig, MethodSpec, choice, integer
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES

PLACEMENTS = ("houlsby", "pfeiffer")
ACTIVATIONS = ("relu", "gelu", "silu", "tanh")


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


def apply(classifier, config: AdapterConfig):
    # torch: the spec is listed and checked without it
    from petlprof.methods.adapter.model import add_adapters
    from petlprof.models.architecture import name_patterns, require

    arch = classifier.architecture
    config.check_width(arch.width, arch.model_type)
    require("adapter", arch)
    names = arch.sublayer_outputs(attention=config.placement == "houlsby")
    classifier.placement.update(
        method="adapter", hooks_from=f"architecture description ({arch.path})", hooks=name_patterns(names)
    )
    return add_adapters(classifier, names, config)


SPEC = MethodSpec(
    name="adapter",
    description="bottleneck adapters after attention and/or feed-forward blocks (Houlsby/Pfeiffer) + task head",
    config_cls=AdapterConfig,
    apply="petlprof.methods.adapter:apply",
    default_lr=1e-3,
    lr_source="Houlsby et al. 2019 swept 3e-5..1e-3; the top of that range for a one-epoch budget (84.3% on the "
    "offline default after one 2000-example epoch, 300 eval examples)",
    pareto_knob="reduction_factor",
    default_grid=(4, 16, 64),
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
