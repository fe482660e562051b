"""LST — Ladder Side-Tuning (Sung, Cho and Bansal 2022, arXiv 2206.06522), the closest peer of READ.

A side network beside the frozen backbone, with one layer per backbone layer, is fed from each frozen
layer through a downsampling linear "ladder"; a learned gate ``μ_i = sigmoid(α_i / T)`` (``α_i``
initialised to 0, ``T = 0.1``: a balanced start) mixes the side network's own state with the ladder
input.  As in the authors' code, the side network is the backbone's own configuration with its widths
divided by the reduction factor ``r`` (hidden size and feed-forward width; the head count kept, each head
``d / r / heads`` wide), and by default (``init=pruned``) it starts from the backbone's weights
structurally pruned to that width (rows/columns of largest L1 norm, the authors' criterion);
``init=random`` starts it from scratch.  Its output is upsampled back to the model width and added to
the backbone's final hidden state; the task head sits on the sum.  The upsampler is zero-initialised, so
step 0 reproduces the backbone.  The backbone runs once per batch without autograd in eval mode, as in
READ.  The network and its initialisation are in :mod:`petlprof.methods.lst.model` and
:mod:`petlprof.methods.lst.pruning`.

Under the LM objective the corrected final state of every position goes through the frozen LM head.
At generation the backbone keeps its KV cache (each new token goes through it once); the side network
attends over earlier tokens, so it runs again over the kept per-layer states of every position so far
(a side-network KV cache is not implemented: its cost per token grows with the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.method_api import MAX_WIDTH, MethodConfig, MethodSpec, choice, integer, number
from petlprof.models.backbones import backbone_config
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES

INITS = ("pruned", "random")


@dataclass
class LstConfig(MethodConfig):
    reduction_factor: int = integer(
        8, "side network width = backbone width / r (the Pareto knob; paper: 8)", maximum=MAX_WIDTH
    )
    gate_temperature: float = number(
        0.1, "temperature T of the ladder gates sigmoid(alpha / T) (paper: 0.1)", minimum=0, above=True, maximum=1e4
    )
    init: str = choice(
        "pruned",
        "side network start: the backbone's weights structurally pruned to its width (paper), or random",
        INITS,
    )

    def check_width(self, width: int, backbone: str) -> None:
        """Called before a sweep starts: the side network must keep at least one unit, and (since it keeps
        the backbone's head count) a width its heads split evenly."""
        if width // self.reduction_factor < 1:
            raise UsageError(
                f"lst reduction_factor {self.reduction_factor} leaves no side width for backbone "
                f"'{backbone}' of width {width}; use at most {width}"
            )
        heads = _heads_of(backbone)
        if heads:
            check_heads(width, heads, self.reduction_factor, backbone)


def workable_factors(width: int, heads: int, limit: int = 64) -> list[int]:
    """Reduction factors up to ``limit`` that leave a side width the backbone's heads split evenly."""
    return [r for r in range(1, min(width, limit) + 1) if width % r == 0 and (width // r) % heads == 0]


def check_heads(width: int, heads: int, reduction_factor: int, backbone: str) -> None:
    """The side network keeps the backbone's head count, so its width must split evenly across the heads."""
    side = width // reduction_factor
    if side < 1 or side % heads:
        works = ", ".join(str(r) for r in workable_factors(width, heads))
        raise UsageError(
            f"lst reduction_factor {reduction_factor} gives backbone '{backbone}' (width {width}, {heads} heads) "
            f"a side width of {side}, which its {heads} heads (kept from the backbone, as in the LST authors' code) "
            f"cannot split evenly; reduction factors that work: {works or 'none'}"
        )


def _heads_of(backbone: str) -> int | None:
    """The backbone's attention head count from its config (None if it cannot be read here: the model checks)."""
    try:
        return int(backbone_config(backbone).num_attention_heads)
    except Exception:  # noqa: BLE001 - a best-effort early check; building the model repeats it
        return None


def apply(classifier, config: LstConfig):
    # torch: the spec is listed and checked without it
    from petlprof.methods.lst.model import LstModel
    from petlprof.models.architecture import require

    require("lst", classifier.architecture)  # its side network reads every layer's states at one width
    backbone = classifier.backbone.config  # the side network keeps its head count
    width, heads = int(backbone.hidden_size), int(backbone.num_attention_heads)
    check_heads(width, heads, config.reduction_factor, getattr(backbone, "model_type", ""))
    return LstModel(classifier, config)


SPEC = MethodSpec(
    name="lst",
    description="ladder side network (backbone blocks at width / r, heads kept, pruned init) + task head",
    config_cls=LstConfig,
    apply="petlprof.methods.lst:apply",
    default_lr=3e-3,
    lr_source="LST paper (arXiv 2206.06522), its T5 GLUE setting; not re-tuned on the offline default",
    lm_lr=3e-4,
    lm_lr_source="chosen by --tune lr on smollm2/arith (reports/smollm2-arith-tuned; 64 validation examples, 1 seed): "
    "0.22 exact match after 8 steps against 0.06 for 9.49e-4; the lowest rate searched, so a lower one may do better",
    pareto_knob="reduction_factor",
    default_grid=(4, 8, 16, 32),
    side_tuning=True,
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,  # the pruned start reads a quantised backbone's weights dequantised
)
