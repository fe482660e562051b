"""LoRA (Hu et al. 2021) through PEFT: low-rank updates on the attention projections + task head.

Target modules default to PEFT's own per-architecture table (BERT ``query``/``value``, T5
``q``/``v``, GPT-2 ``c_attn``, LLaMA ``q_proj``/``v_proj``); for a model type the table lacks
(DistilBERT, ALBERT, ...), to the query and value projections, or the fused query-key-value
projection, that the architecture description finds in every attention block.
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.method_api import MAX_WIDTH, MethodConfig, MethodSpec, integer, module_names, number
from petlprof.models.quantization import QUANTIZE_CHOICES
from petlprof.vocabulary import OBJECTIVES


@dataclass
class LoraConfig(MethodConfig):
    r: int = integer(8, "rank of the low-rank update (the Pareto knob)", maximum=MAX_WIDTH)
    alpha: float = number(
        16.0, "scaling numerator: updates are scaled by alpha / r", minimum=0, above=True, maximum=1e4
    )
    dropout: float = number(0.1, "dropout on the LoRA input", minimum=0, maximum=1, below=True)
    target_modules: list[str] | None = module_names(
        None, "module names to adapt; default: PEFT's table for the architecture"
    )

    def check_width(self, width: int, backbone: str) -> None:
        if self.r > width:
            raise UsageError(
                f"lora r {self.r} is larger than the width {width} of backbone '{backbone}'; use r <= {width}"
            )


def apply(classifier, config: LoraConfig):
    # peft and torch: the spec is listed and checked without them
    import peft

    from petlprof.methods.peft_common import default_targets, record_targets, wrap_backbone

    targets, _, source = default_targets(classifier, "lora", config.target_modules)
    peft_config = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # PEFT annotates int, but only divides it by r
        lora_dropout=config.dropout,
        target_modules=targets,
        bias="none",
    )
    wrap_backbone(classifier, peft_config, "lora")
    return record_targets(classifier, "lora", source)


SPEC = MethodSpec(
    name="lora",
    description="low-rank updates of the attention projections (PEFT) + task head",
    config_cls=LoraConfig,
    apply="petlprof.methods.lora:apply",
    default_lr=2e-3,
    lr_source="tuned on the offline default for short budgets (1e-3: 83.3%, 2e-3: 84.6%, 5e-4: 73.8% after one "
    "2000-example epoch); the LoRA paper's 4e-4..5e-4 assumes 30+ epochs",
    lm_lr=6.32e-3,
    lm_lr_source="chosen by --tune lr on smollm2/arith (reports/smollm2-arith-tuned; 64 validation examples, 1 seed): "
    "0.30 exact match after 8 steps against 0.06 for 6.32e-4; 2e-3, the classification default, scored 0.03 after 3",
    pareto_knob="r",
    default_grid=(2, 8, 32),
    merge="petlprof.methods.peft_common:merge",
    objectives=OBJECTIVES,
    quantize=QUANTIZE_CHOICES,
)
