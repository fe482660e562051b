"""Prompt tuning (Lester et al. 2021) through PEFT: trained embeddings of virtual tokens are put in
front of every input; the backbone is frozen and the task head trains as well.

The prompt goes in front of the encoder's input (T5: the encoder; the decoder still reads the
input shifted right) or of a decoder-only model's input.  The backbone's states for the virtual
tokens are not pooled (see :mod:`petlprof.models.classifier`).  Initialisation: ``text`` repeats the
embeddings of ``init_text``'s tokens (the paper's best choice after class labels), ``vocab``
samples embeddings of random vocabulary tokens, ``random`` draws them from N(0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError, shown
from petlprof.method_api import MethodConfig, MethodSpec, choice, integer, text
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES

INITS = {"text": "TEXT", "vocab": "SAMPLE_VOCAB", "random": "RANDOM"}


@dataclass
class PromptTuningConfig(MethodConfig):
    num_virtual_tokens: int = integer(20, "number of trained prompt tokens (the Pareto knob)")
    init: str = choice("text", "prompt initialisation", INITS)
    init_text: str = text(
        "Classify the sentiment of this text as positive or negative:",
        "text whose token embeddings initialise the prompt (init=text), cycled to length; "
        "the default suits sentiment tasks: give your task's instruction otherwise",
    )

    def validate(self):
        if self.init == "text" and not self.init_text.strip():
            raise UsageError(f"init_text must be a non-empty string with init=text, got {shown(self.init_text)}")


def apply(classifier, config: PromptTuningConfig):
    # peft and torch: the spec is listed and checked without them
    import peft

    from petlprof.methods.peft_common import prompt_shape, wrap_backbone
    from petlprof.models.architecture import require

    require("prompt_tuning", classifier.architecture)
    extra = {}
    if config.init == "text":
        extra = {"prompt_tuning_init_text": config.init_text, "tokenizer_name_or_path": classifier.tokenizer_path}
    peft_config = peft.PromptTuningConfig(
        task_type="FEATURE_EXTRACTION",
        num_virtual_tokens=config.num_virtual_tokens,
        prompt_tuning_init=INITS[config.init],
        **prompt_shape(classifier, "prompt_tuning"),
        **extra,
    )
    wrap_backbone(classifier, peft_config, "prompt_tuning")
    classifier.virtual_tokens = config.num_virtual_tokens
    return classifier


SPEC = MethodSpec(
    name="prompt_tuning",
    description="trained virtual-token embeddings before the input (PEFT) + task head",
    config_cls=PromptTuningConfig,
    apply="petlprof.methods.prompt_tuning:apply",
    default_lr=3e-2,
    lr_source="PEFT's prompt-tuning example: 3e-2 (the paper's 0.3 is for Adafactor); 84.0% on the offline default "
    "after one 2000-example epoch (300 eval examples)",
    pareto_knob="num_virtual_tokens",
    default_grid=(5, 20, 50),
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
