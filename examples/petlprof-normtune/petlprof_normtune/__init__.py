"""NormTune: only the backbone's normalisation layers (LayerNorm/RMSNorm gains, biases) and the head train."""

from dataclasses import dataclass

from petlprof import MethodConfig, MethodSpec, choice, integer


@dataclass
class NormTuneConfig(MethodConfig):
    parts: str = choice("both", "which parameters of each norm layer train", ("gain", "bias", "both"))
    last: int = integer(0, "train only the last N norm layers (0: all of them)", minimum=0)


def apply(classifier, config: NormTuneConfig):
    classifier.freeze_backbone()  # every backbone weight frozen, the task head trainable
    norms = [m for m in classifier.backbone.modules() if type(m).__name__.endswith(("LayerNorm", "RMSNorm"))]
    for norm in norms[-config.last :] if config.last else norms:
        for name, param in norm.named_parameters(recurse=False):
            param.requires_grad_(config.parts in ("both", "gain" if name == "weight" else "bias"))
    return classifier


SPEC = MethodSpec(
    name="normtune",
    description="LayerNorm/RMSNorm gains and biases of the backbone + task head",
    config_cls=NormTuneConfig,
    apply=apply,
    default_lr=1e-3,
    lr_source="not tuned: BitFit's default, another method that trains a few vectors besides the head",
    pareto_knob="last",
    default_grid=(1, 4, 0),
)
