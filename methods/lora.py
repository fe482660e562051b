"""LoRA (Hu et al. 2021) through PEFT: low-rank updates on the attention projections + task head.

Target modules default to PEFT's own per-architecture table (BERT ``query``/``value``, T5
``q``/``v``, GPT-2 ``c_attn``, LLaMA ``q_proj``/``v_proj``).
"""

from __future__ import annotations

from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.registry import MethodSpec, help_field, register_method


@dataclass
class LoraConfig:
    r: int = help_field(8, "rank of the low-rank update (the Pareto knob)")
    alpha: float = help_field(16.0, "scaling numerator: updates are scaled by alpha / r")
    dropout: float = help_field(0.1, "dropout on the LoRA input")
    target_modules: list[str] | None = help_field(
        None, "module names to adapt; default: PEFT's table for the architecture"
    )

    def __post_init__(self):
        if not _is_int(self.r) or self.r < 1:
            raise UsageError(f"lora r must be a positive integer, got {self.r!r}")
        if not _is_number(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"lora dropout must be a number in [0, 1), got {self.dropout!r}")
        if not _is_number(self.alpha) or self.alpha <= 0:
            raise UsageError(f"lora alpha must be a positive number, got {self.alpha!r}")
        targets = self.target_modules
        if targets is not None and not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
            raise UsageError(f"lora target_modules must be a list of module names, got {targets!r}")

    def check_width(self, width: int, backbone: str) -> None:
        if self.r > width:
            raise UsageError(
                f"lora r {self.r} is larger than the width {width} of backbone '{backbone}'; use r <= {width}"
            )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def apply(classifier, config: LoraConfig):
    import peft

    from petlprof.methods.peft_common import wrap_backbone

    peft_config = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        bias="none",
    )
    return wrap_backbone(classifier, peft_config, "lora")


register_method(
    MethodSpec(
        name="lora",
        description="low-rank updates of the attention projections (PEFT) + task head",
        config_cls=LoraConfig,
        apply="petlprof.methods.lora:apply",
        default_lr=2e-3,
        lr_source="tuned on the offline default for short budgets (1e-3: 83.3%, 2e-3: 84.6%, 5e-4: 73.8% after one "
        "2000-example epoch); the LoRA paper's 4e-4..5e-4 assumes 30+ epochs",
        pareto_knob="r",
        default_grid=(2, 8, 32),
        merge="petlprof.methods.peft_common:merge",
    )
)
