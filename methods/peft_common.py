"""What the PEFT-backed methods share: wrapping the backbone, and folding trained weights back in.

Every PEFT method here freezes the whole backbone, lets PEFT add its trainable pieces, and keeps
the task head trainable.  PEFT's prompt-learning methods need a task-specific wrapper; the
headless backbones petlprof classifies with are served by PEFT's feature-extraction wrapper.

LoRA and IA3 take PEFT's per-architecture table of target modules where it has an entry for the
model type, and otherwise the projections of the architecture description
(:mod:`petlprof.models.architecture`); where PEFT's IA3 entry would also rescale attention output
projections (its ``output.dense`` suffix in BERT-like encoders), the description's keys, values
and feed-forward output layers are used, as the paper places them.  Which source was used, and the
modules PEFT adapted (layer indices as ``*``), go in the record's ``backbone_info.placement``.

Under the LM objective (:class:`petlprof.models.language_model.LanguageModel`) the head is the backbone's own LM
head and stays frozen with the rest: only PEFT's pieces train.  The task model runs PEFT's prompt and
prefix themselves (PEFT's forward re-injects them at every call, which a hand-written KV-cache decoding
loop cannot use); LoRA and IA3 layers sit inside the model and need nothing.

The generic tuners (``peft:TYPE``, :mod:`petlprof.methods.peft_tuners`) wrap the backbone, pick targets,
shape prompts and record placement with these same functions.
"""

from __future__ import annotations

import peft

from petlprof.errors import UsageError
from petlprof.models.architecture import Architecture, ia3_targets, lora_targets, name_patterns, peft_table, require
from petlprof.models.families import ENCODER_DECODER
from petlprof.vocabulary import LM

# what PEFT raises when a tuner cannot adapt a model: a shape it refuses (ValueError), a layer type it has
# no implementation for (TypeError, NotImplementedError), a model it cannot find its pieces in (AttributeError,
# KeyError)
PEFT_REFUSALS = (ValueError, TypeError, NotImplementedError, AttributeError, KeyError)


def wrap_backbone(classifier, peft_config, method: str):
    """Freeze the backbone, wrap it with ``peft_config`` (PEFT decides what trains) and free the head."""
    classifier.freeze_backbone()
    try:
        classifier.backbone = peft.get_peft_model(classifier.backbone, peft_config)
    except PEFT_REFUSALS as exc:
        lines = str(exc).strip().splitlines()
        why = lines[0] if lines else type(exc).__name__
        raise UsageError(f"{method} cannot adapt this backbone: {why}") from None
    return classifier


def merge(model):
    """Fold a LoRA/IA3 backbone's trained weights into its base weights (in place) and drop PEFT's layers.

    The merged model computes the same function without the adapter's extra matrix products, so
    inference latency can be compared merged and unmerged.
    """
    model.backbone = model.backbone.merge_and_unload()
    return model


def default_targets(classifier, method: str, targets, feedforward=None):
    """(target_modules, feedforward_modules, source) for ``lora`` or ``ia3``: the method config's
    own, PEFT's table (None, None: PEFT picks them) or the architecture description's."""
    return targets_for(classifier.architecture, method, targets, feedforward)


def targets_for(arch: Architecture, method: str, targets, feedforward=None):
    """:func:`default_targets` for a backbone's architecture description."""
    if targets is not None:
        return targets, feedforward, "method config"
    table, table_feedforward = peft_table(method, arch.model_type)
    if table is None:
        require(method, arch)
        source = f"architecture description ({arch.path}): PEFT has no {method} entry for '{arch.model_type}'"
    elif _rescales_attention_output(table_feedforward, arch) and arch.missing_sublayers() is None:
        source = f"architecture description ({arch.path}): PEFT's entry also rescales attention outputs"
    else:
        return None, None, f"PEFT's table ({arch.model_type})"
    if method == "lora":
        return lora_targets(arch), None, source
    return (*ia3_targets(arch), source)


def _rescales_attention_output(feedforward: list[str] | None, arch: Architecture) -> bool:
    outputs = arch.projections("output")
    return any(name == t or name.endswith("." + t) for name in outputs for t in feedforward or ())


def record_targets(classifier, method: str, source: str):
    """Note in the record where PEFT put the method's layers (layer indices as ``*``) and why there."""
    names = getattr(classifier.backbone.base_model, "targeted_module_names", None) or []
    classifier.placement.update(
        method=method,
        targets_from=source,
        target_modules=name_patterns(names),
    )
    return classifier


def prompt_shape(classifier, method: str) -> dict[str, int]:
    """Width, depth and heads for PEFT's prompt-learning configs, read from the architecture
    description (PEFT reads a fixed list of config keys, which misses e.g. DistilBERT's ``dim``).
    A prompt has the input embeddings' width (ALBERT's are narrower than its layers); a prefix
    has the keys' width and heads (fewer with grouped-query or multi-query attention: Falcon)."""
    arch = classifier.architecture
    shape = shape_of(arch, "prompt" if method == "prompt_tuning" else "prefix")
    classifier.placement.update(method=method, shape_from=f"architecture description ({arch.path})", **shape)
    return shape


def shape_of(arch: Architecture, kind: str) -> dict[str, int]:
    """:func:`prompt_shape`'s numbers for a ``prompt`` (before the input) or a ``prefix`` (keys and values)."""
    if kind == "prompt":
        if arch.embedding_dim is None:  # the method's requirements refuse such a model before it gets here
            raise ValueError(f"the {arch.model_type} model has no input embeddings to put a prompt before")
        return {"token_dim": arch.embedding_dim, "num_layers": arch.layers, "num_attention_heads": arch.heads}
    heads = max(1, arch.kv_width // arch.head_dim)
    return {"token_dim": arch.kv_width, "num_layers": arch.layers, "num_attention_heads": heads}


def prefix_task_type(task_model) -> str:
    """PEFT's task type for a key/value prefix: its sequence-to-sequence wrapper for an encoder-decoder (the one
    that extends the decoder's mask by the prefix; PEFT puts the prefix on the decoder's self-attention), its
    feature-extraction wrapper otherwise.  The seq2seq wrapper records the model's generation hooks when it is
    built; a headless T5 classifier has none and never generates, so they are set to None first."""
    if task_model.family != ENCODER_DECODER:
        return "FEATURE_EXTRACTION"
    if task_model.objective != LM:
        task_model.backbone.prepare_inputs_for_generation = None
        task_model.backbone._prepare_encoder_decoder_kwargs_for_generation = None
    return "SEQ_2_SEQ_LM"
