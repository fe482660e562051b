"""BitFit (Ben Zaken et al. 2022): only the bias terms of the backbone and the task head train.

Families without bias terms (T5, LLaMA) leave only the head trainable; the run warns about it.

Under the LM objective the head is the backbone's pretrained LM head, which stays frozen; it has no bias
of its own in any supported family, so BitFit adds one: a bias on the logits, starting at zero (step 0
is the plain LM), trains with the backbone's bias terms.  On T5 or LLaMA that bias is all that trains
(the run warns about it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from petlprof.method_api import MethodConfig, MethodSpec
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import LM, OBJECTIVES


@dataclass
class BitFitConfig(MethodConfig):
    """BitFit has no method-specific knobs: the set of bias terms is fixed by the architecture."""


def apply(classifier, config: BitFitConfig):
    lm = classifier.objective == LM
    if lm:
        classifier.freeze_backbone()
    biases = 0
    for name, param in classifier.backbone.named_parameters():
        is_bias = name.endswith(".bias") or name == "bias"
        param.requires_grad_(is_bias)
        biases += is_bias
    if lm:
        classifier.add_logit_bias()  # the LM head's bias term (it has none of its own), zero at step 0
    else:
        for param in classifier.head.parameters():
            param.requires_grad_(True)
    if biases == 0:
        warnings.warn(
            f"BitFit: the {classifier.backbone.config.model_type} backbone has no bias terms; "
            + ("only a bias on the LM head's logits trains" if lm else "only the task head trains"),
            stacklevel=2,
        )
    return classifier


SPEC = MethodSpec(
    name="bitfit",
    description="backbone bias terms + task head",
    config_cls=BitFitConfig,
    apply="petlprof.methods.bitfit:apply",
    default_lr=1e-3,
    lr_source="BitFit paper grid 1e-4..1e-3 (Ben Zaken et al. 2022)",
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
