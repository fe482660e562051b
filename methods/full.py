"""Full fine-tuning: every backbone weight and the task head train (the cost ceiling).

Under the LM objective the head is the backbone's own LM head, so every weight of the model trains
(tied input and output embeddings train as the one matrix they are)."""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.method_api import MethodConfig, MethodSpec
from petlprof.vocabulary import OBJECTIVES


@dataclass
class FullConfig(MethodConfig):
    """Full fine-tuning has no method-specific knobs."""


def apply(classifier, config: FullConfig):
    for param in classifier.parameters():
        param.requires_grad_(True)
    return classifier


SPEC = MethodSpec(
    name="full",
    description="all backbone weights + task head",
    config_cls=FullConfig,
    apply="petlprof.methods.full:apply",
    default_lr=5e-5,
    lr_source="BERT fine-tuning range 2e-5..5e-5 (Devlin et al. 2019); upper end for short budgets",
    lm_lr=5e-5,
    lm_lr_source="chosen by --tune lr on smollm2/arith (reports/smollm2-arith-tuned; 64 validation examples, 1 seed): "
    "the classification default kept, among 5e-6..5e-4 (exact match 0.33 against 0.25 for 1.58e-4 after 8 steps)",
    objectives=OBJECTIVES,
)
