"""Zero-shot: the language model as it comes, nothing trained — the row every generative sweep gets,
so a reader sees what tuning bought.

Every parameter is frozen, so the run skips training (its training phase takes no time and no energy)
and goes straight to evaluation and generation.  Only the language-modelling objective: a
classifier's head is random before training, so its zero-shot score would mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.method_api import MethodConfig, MethodSpec
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import LM, ZERO_SHOT


@dataclass
class ZeroShotConfig(MethodConfig):
    """Zero-shot has no knobs: the model is evaluated as loaded."""


def apply(model, config: ZeroShotConfig):
    for param in model.parameters():
        param.requires_grad_(False)
    return model


SPEC = MethodSpec(
    name=ZERO_SHOT,
    description="nothing trains: the language model before any tuning (the row every generative sweep gets)",
    config_cls=ZeroShotConfig,
    apply="petlprof.methods.zero_shot:apply",
    default_lr=0.0,
    lr_source="nothing trains",
    objectives=(LM,),
    quantize=QUANTIZE_CHOICES,
)
