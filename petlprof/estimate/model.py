"""The model a run of a backbone would train, built from its config alone with no weight allocated.

A backbone for an estimate is a bundled shape (``petlprof/models/shapes/NAME.json``, the published config's
numbers), a tiny preset or ``minilm``, a local ``config.json`` or model folder, or a hub id.  The
model is built by the functions a run builds it with, under ``torch.device("meta")``, so every parameter
is a shape without storage: the depth cut (:func:`petlprof.models.backbones.check_shape`,
:func:`petlprof.models.backbones.set_depth`), the transformers model of the config
(:func:`petlprof.models.families.model_from_config`: with the LM objective its own LM head), the pooler dropped
and the pad id set (:func:`petlprof.models.backbones.prepare_backbone_model`), and the objective's task model
with the method applied (:func:`petlprof.models.classifier.trainable_model`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from petlprof.estimate.attention import DEFAULT_ATTENTION, attn_implementation
from petlprof.meters.memory import static_breakdown
from petlprof.models.backbones import (
    BACKBONES,
    Backbone,
    backbone_config,
    check_backbone_name,
    check_shape,
    family_of,
    is_tiny_preset,
    minilm_path,
    prepare_backbone_model,
    pretrained_config,
    set_depth,
    shared_tokenizer,
    tokenizer_stand_in,
)
from petlprof.models.families import model_from_config
from petlprof.models.shapes import config_from_file, shape_config, shape_names
from petlprof.results.figures import BREAKDOWN_OPTIMIZER_STATE, BREAKDOWN_TOTAL
from petlprof.values import check_file
from petlprof.vocabulary import CLASSIFICATION, LM

if TYPE_CHECKING:
    from petlprof.models.quantization import QuantizationInfo


@dataclass
class ResolvedBackbone:
    """A backbone's config and what a run would take from its tokenizer."""

    name: str
    config: Any  # transformers PretrainedConfig
    tokenizer: Any  # the preset's tokenizer, or a stand-in with pad_token_id and name_or_path
    source: str
    config_dtype: str | None = None  # the dtype the config asks for (``torch_dtype``/``dtype``); never applied


def resolve_backbone(backbone: str, num_layers: int | None = None) -> ResolvedBackbone:
    """A bundled shape, preset, config.json, model folder or hub id -> its config (depth cut to ``num_layers``)."""
    path = Path(backbone)
    if backbone not in BACKBONES:
        check_file(path, "--backbone", folder=True)
    if backbone in shape_names():
        config = shape_config(backbone)
        resolved = ResolvedBackbone(
            backbone, config, tokenizer_stand_in(config), f"bundled shape {backbone} ({config.source_url})"
        )
    elif backbone in BACKBONES:
        resolved = _preset(backbone)
    elif path.is_file():
        resolved = ResolvedBackbone(backbone, config_from_file(path), None, f"config file {path}")
    elif path.is_dir() or "/" in backbone:
        check_backbone_name(backbone)
        resolved = ResolvedBackbone(backbone, pretrained_config(backbone), None, f"config of {backbone}")
    else:
        raise BACKBONES.unknown(
            backbone, also=shape_names(), extra="Or give a config.json, a model folder or a hub id."
        )
    if resolved.tokenizer is None:
        resolved.tokenizer = tokenizer_stand_in(resolved.config)
    resolved.config_dtype = _asked_dtype(resolved.config)
    if num_layers is not None:
        _cut_depth(resolved, num_layers)
    return resolved


def _preset(name: str) -> ResolvedBackbone:
    config = backbone_config(name)
    if name != "minilm" and not is_tiny_preset(name):  # smollm2: its config (the pad id) is all an estimate reads
        return ResolvedBackbone(name, config, tokenizer_stand_in(config), f"pretrained {name} config")
    tokenizer = shared_tokenizer(str(minilm_path()))
    source = "pretrained all-MiniLM-L6-v2 config" if name == "minilm" else f"{name} preset config"
    return ResolvedBackbone(name, config, tokenizer, source)


def _asked_dtype(config) -> str | None:
    """The dtype a config names (a downloaded ``config.json``'s ``torch_dtype: bfloat16``), as text; None if none."""
    dtype = getattr(config, "dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _cut_depth(resolved: ResolvedBackbone, num_layers: int) -> None:
    """The run's depth cut: within a pretrained shape's layers (a tiny preset is built with any number)."""
    check_shape(resolved.name, resolved.config, num_layers=num_layers)
    set_depth(resolved.config, num_layers)


def family(resolved: ResolvedBackbone) -> str:
    return family_of(resolved.config)


@dataclass
class BuiltModel:
    """A task model as a run trains it, and how its backbone was quantised (the record's ``quantization``,
    the run record's ``training.quantization``; None unquantised)."""

    model: Any
    quantization: QuantizationInfo | None = None


def build(
    resolved: ResolvedBackbone,
    method,
    method_config,
    num_labels: int,
    device: str = "meta",
    objective: str = CLASSIFICATION,
    attention: str = DEFAULT_ATTENTION,
    quantization=None,
) -> BuiltModel:
    """The model a run trains: backbone from the config (``attention``'s implementation; quantised as
    ``quantization``, a :class:`petlprof.models.quantization.Quantization`, says, by
    :func:`petlprof.estimate.quantized.quantize_backbone`), the objective's task model (a classifier head, or
    the backbone's own LM head), method applied; on ``device``."""
    # torch, petlprof.models.classifier (torch): slow to import, loaded only when used
    import torch

    from petlprof.models.classifier import trainable_model

    model = build_backbone_model(resolved, device, lm_head=objective == LM, attention=attention)
    info = None
    if quantization is not None:
        # petlprof.estimate.quantized (torch): slow to import, loaded only when used
        from petlprof.estimate.quantized import quantize_backbone

        info = quantize_backbone(model, quantization, device)
    with torch.device(device), _fast_meta(device):
        backbone = Backbone(
            resolved.name, model, resolved.tokenizer, family(resolved), resolved.source, quantization=info
        )
        return BuiltModel(trainable_model(backbone, objective, num_labels, method, method_config), info)


def build_backbone_model(
    resolved: ResolvedBackbone, device: str = "meta", lm_head: bool = False, attention: str = DEFAULT_ATTENTION
) -> Any:
    """The backbone as a run builds it from a config (:func:`petlprof.models.families.model_from_config`, float32
    whatever dtype the config names: ``--precision`` decides the step's; then
    :func:`petlprof.models.backbones.prepare_backbone_model`: the pooler dropped, the pad id set), on ``device``, with
    ``attention``'s implementation (:func:`petlprof.estimate.attention.attn_implementation`); ``lm_head``: with
    its language-modelling head (a causal or a sequence-to-sequence LM)."""
    # torch: slow to import, loaded only when used
    import torch

    with torch.device(device), _fast_meta(device):
        model = model_from_config(resolved.config, lm_head, resolved.name, **attn_implementation(attention))
    prepare_backbone_model(model, resolved.tokenizer.pad_token_id)
    return model


def _fast_meta(device: str):
    """On meta, the weight initialisation runs under the tracer's shortcuts (in-place fills are no-ops there)."""

    # petlprof.estimate.trace (torch): slow to import, loaded only when used
    from petlprof.estimate.trace import MetaTrace

    return MetaTrace() if device == "meta" else contextlib.nullcontext()


def weight_breakdown(model, eight_bit_optimizer: bool = False) -> dict[str, int]:
    """Weights, buffers, gradients and AdamW state in bytes: :func:`petlprof.meters.memory.static_breakdown`,
    the rule the runs' records use, with the optimiser's figure under this module's name."""
    figures = static_breakdown(model, eight_bit_optimizer)
    figures["optimizer_bytes"] = figures.pop(BREAKDOWN_OPTIMIZER_STATE)
    figures.pop(BREAKDOWN_TOTAL)
    return figures
