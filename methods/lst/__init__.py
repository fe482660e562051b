"""LST — Ladder Side-Tuning (Sung, Cho and Bansal 2022, arXiv 2206.06522), the closest peer of READ.

A side network ``r`` times narrower than the backbone, with one lightweight transformer layer per
backbone layer, is fed from each frozen layer through a downsampling linear "ladder"; a learned
gate ``μ_i = sigmoid(α_i / T)`` (``α_i`` initialised to 0, ``T = 0.1``: a balanced start) mixes
the ladder input with the side network's own state.  Its output is upsampled back to the model
width and added to the backbone's final hidden state; the task head sits on the sum.  The backbone
runs once per batch without autograd in eval mode, as in READ.  The side network is randomly
initialised (the paper's optional initialisation from a pruned backbone copy is not implemented),
and its upsampler is zero-initialised so step 0 reproduces the backbone.  The network itself is in
:mod:`petlprof.methods.lst.model`.

Under the LM objective the corrected final state of every position goes through the frozen LM head.
At generation the backbone keeps its KV cache (each new token goes through it once); the side network
attends over earlier tokens, so it runs again over the kept per-layer states of every position so far
(a side-network KV cache is not implemented: its cost per token grows with the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.method_api import MAX_WIDTH, MethodConfig, integer, number
from petlprof.registry import MethodSpec, register_method


@dataclass
class LstConfig(MethodConfig):
    reduction_factor: int = integer(
        8, "side network width = backbone width / r (the Pareto knob; paper: 8)", maximum=MAX_WIDTH
    )
    gate_temperature: float = number(
        0.1, "temperature T of the ladder gates sigmoid(alpha / T) (paper: 0.1)", minimum=0, above=True, maximum=1e4
    )
    num_heads: int = integer(4, "attention heads of each side layer (fewer if the side width is not divisible)")
    ffn_multiplier: int = integer(4, "feed-forward width of each side layer, in side widths", maximum=64)

    def check_width(self, width: int, backbone: str) -> None:
        """Called before a sweep starts: the side network must keep at least one unit."""
        if width // self.reduction_factor < 1:
            raise UsageError(
                f"lst reduction_factor {self.reduction_factor} leaves no side width for backbone "
                f"'{backbone}' of width {width}; use at most {width}"
            )


def apply(classifier, config: LstConfig):
    from petlprof.architecture import require
    from petlprof.methods.lst.model import LstModel

    require("lst", classifier.architecture)  # its side network reads every layer's states at one width
    return LstModel(classifier, config)


register_method(
    MethodSpec(
        name="lst",
        description="ladder side network (width / r, one light layer per backbone layer) + task head",
        config_cls=LstConfig,
        apply="petlprof.methods.lst:apply",
        default_lr=3e-3,
        lr_source="LST paper (arXiv 2206.06522), its T5 GLUE setting; not re-tuned on the offline default",
        pareto_knob="reduction_factor",
        default_grid=(4, 8, 16, 32),
        side_tuning=True,
        objectives=("classification", "lm"),
    )
)
