"""Prefix tuning (Li and Liang 2021) through PEFT: trained key/value vectors of virtual tokens are
prepended to every attention layer's keys and values; the backbone is frozen and the task head
trains as well.

Sequence lengths do not change (the prefix lives in the attention cache), so pooling is untouched.
For T5, PEFT puts the prefix on the decoder's self-attention (its encoder takes no cache); that
needs PEFT's sequence-to-sequence wrapper.  ``projection_size`` turns on the paper's
reparametrisation: the prefix is produced by a two-layer MLP from smaller embeddings.  Width,
depth and heads come from the architecture description (DistilBERT names its width ``dim``);
a model whose forward takes no key/value cache (DistilBERT, DeBERTa-v2, ALBERT) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from petlprof.method_api import MAX_WIDTH, MethodConfig, MethodSpec, integer
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES


@dataclass
class PrefixTuningConfig(MethodConfig):
    num_virtual_tokens: int = integer(20, "prefix length in virtual tokens per layer (the Pareto knob)")
    projection_size: int | None = integer(
        None,
        "hidden size of the paper's MLP reparametrisation of the prefix; none: train the prefix directly",
        maximum=MAX_WIDTH,
        optional=True,
    )


def apply(classifier, config: PrefixTuningConfig):
    # peft and torch: the spec is listed and checked without them
    import peft

    from petlprof.methods.peft_common import prefix_task_type, prompt_shape, wrap_backbone
    from petlprof.models.architecture import require

    require("prefix_tuning", classifier.architecture)
    projection: dict[str, Any] = (
        {}
        if config.projection_size is None
        else {"prefix_projection": True, "encoder_hidden_size": config.projection_size}
    )
    peft_config = peft.PrefixTuningConfig(
        task_type=prefix_task_type(classifier),
        num_virtual_tokens=config.num_virtual_tokens,
        **prompt_shape(classifier, "prefix_tuning"),
        **projection,
    )
    return wrap_backbone(classifier, peft_config, "prefix_tuning")


SPEC = MethodSpec(
    name="prefix_tuning",
    description="trained key/value prefixes in every attention layer (PEFT) + task head",
    config_cls=PrefixTuningConfig,
    apply="petlprof.methods.prefix_tuning:apply",
    default_lr=1e-2,
    lr_source="PEFT's prefix-tuning seq2seq example: 1e-2; 86.7% on the offline default after one 2000-example "
    "epoch (300 eval examples)",
    pareto_knob="num_virtual_tokens",
    default_grid=(5, 20, 50),
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
