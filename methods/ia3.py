"""(IA)^3 (Liu et al. 2022, "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than
In-Context Learning") through PEFT: learned vectors rescale the attention keys and values and the
feed-forward block's inner activations; the task head trains as well.

Target modules default to PEFT's per-architecture table (T5 ``k``/``v``/``wo``, GPT-2's fused
``c_attn`` and ``mlp.c_proj``, LLaMA ``k_proj``/``v_proj``/``down_proj``), except where that
entry also catches attention output projections (BERT-like encoders: PEFT's suffix
``output.dense``), which the paper does not rescale, or where PEFT has no entry (DistilBERT,
ALBERT, ...): then the keys and values (or the fused query-key-value projection) and feed-forward
output layers the architecture description finds are targeted.
The vectors start at one (the backbone exactly) and can be merged into the weights for inference.
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.method_api import MethodConfig, MethodSpec, module_names
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES


@dataclass
class Ia3Config(MethodConfig):
    target_modules: list[str] | None = module_names(
        None, "modules to rescale; default: keys, values and feed-forward (PEFT's table, BERT narrowed)"
    )
    feedforward_modules: list[str] | None = module_names(
        None, "the subset of target_modules whose input (not output) is rescaled; default: the feed-forward layer"
    )

    def validate(self):
        if (self.feedforward_modules is None) != (self.target_modules is None):
            raise UsageError(
                "target_modules and feedforward_modules must be given together "
                f"(got target_modules={self.target_modules!r}, "
                f"feedforward_modules={self.feedforward_modules!r})"
            )


def apply(classifier, config: Ia3Config):
    # peft and torch: the spec is listed and checked without them
    import peft

    from petlprof.methods.peft_common import default_targets, record_targets, wrap_backbone

    targets, feedforward, source = default_targets(classifier, "ia3", config.target_modules, config.feedforward_modules)
    peft_config = peft.IA3Config(target_modules=targets, feedforward_modules=feedforward)
    wrap_backbone(classifier, peft_config, "ia3")
    return record_targets(classifier, "ia3", source)


SPEC = MethodSpec(
    name="ia3",
    description="learned rescaling vectors on keys, values and feed-forward activations (PEFT) + task head",
    config_cls=Ia3Config,
    apply="petlprof.methods.ia3:apply",
    default_lr=3e-3,
    lr_source="T-Few recipe (Liu et al. 2022): 3e-3; PEFT's IA3 seq2seq example uses 8e-3",
    lm_lr=9.49e-3,
    lm_lr_source="chosen by --tune lr on smollm2/arith (reports/smollm2-arith-tuned; 64 validation examples, 1 seed): "
    "0.25 exact match after 8 steps against 0.125 for 3e-3, the classification default",
    merge="petlprof.methods.peft_common:merge",
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
