"""Backbone configs without weights: the bundled shapes (``petlprof/models/shapes/NAME.json``) and config files.

A bundled shape is the published ``config.json`` of a model users fine-tune (T5 small to 11B, BERT,
RoBERTa, GPT-2, LLaMA, Qwen2.5, Mistral, OPT; its ``_source`` says where it was copied from), usable by
name wherever a backbone is named: ``petlprof estimate --backbone t5-large`` traces it on the meta device,
``petlprof run --backbone t5-large --random-init`` trains it on random weights (a cost-only run).  A local
``config.json`` is read the same way.  This module is the one place both commands look them up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError, shown
from petlprof.models.families import keep_separate_head

SHAPES_DIR = Path(__file__).resolve().parent / "shapes"

# the sizes a config gives, under each architecture's own names, and the largest accepted: far past any
# released model's (widths 25,600, feed-forward 73,728, 128 layers and heads, 262,144 tokens, 10M positions)
_WIDTHS = ("hidden_size", "n_embd", "d_model", "d_kv", "head_dim", "word_embed_proj_dim")
_FFNS = ("intermediate_size", "d_ff", "ffn_dim", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers", "decoder_layers")
_HEADS: tuple[str, ...] = ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads")
_HEADS += ("encoder_attention_heads", "decoder_attention_heads")
_POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx")
SIZE_LIMITS: dict[str, int] = {
    **dict.fromkeys(_WIDTHS, 2**17),
    **dict.fromkeys(_FFNS, 2**20),
    **dict.fromkeys(_LAYERS, 1024),
    **dict.fromkeys(_HEADS, 4096),
    "vocab_size": 2**24,
    **dict.fromkeys(_POSITIONS, 2**24),
}


def shape_names() -> list[str]:
    """The bundled shapes, by name (``petlprof estimate --list-shapes``)."""
    return sorted(path.stem for path in SHAPES_DIR.glob("*.json"))


def is_shape(spec: str) -> bool:
    return spec in shape_names()


def is_config_file(spec: str) -> bool:
    """A backbone named by a file (a ``config.json``), not a model folder."""
    return Path(spec).is_file()


def shape_config(name: str):
    """The transformers config of bundled shape ``name``, with its ``source_url``."""
    return config_from_dict(json.loads((SHAPES_DIR / f"{name}.json").read_text()), name)


def config_from_file(path: Path | str):
    """The transformers config a ``config.json`` describes; a UsageError if it is not one."""
    path = Path(path)
    try:
        values = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"backbone config '{path}' is not a JSON file: {exc}") from None
    return config_from_dict(values, str(path))


def config_from_dict(values: Any, label: str):
    """A transformers config from a ``config.json``'s values (``_source``, where a shape was copied
    from, becomes the config's ``source_url``)."""
    # transformers: slow to import, loaded only when used
    from transformers import AutoConfig

    if not isinstance(values, dict):
        raise UsageError(f"backbone config '{label}' holds a JSON {json_kind(values)}, not an object of fields")
    if "model_type" not in values:
        raise UsageError(f"backbone config '{label}' is not a transformers model config (it has no 'model_type')")
    check_sizes(values, label)
    values = dict(values)
    source = values.pop("_source", None)
    try:
        config = AutoConfig.for_model(values.pop("model_type"), **values)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"backbone config '{label}' is not a model config transformers knows: {exc}") from None
    config.source_url = source
    check_heads(config, label)
    return keep_separate_head(config, values)


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (an array, a string, ...)."""
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def check_heads(config: Any, label: str) -> None:
    """Key/value heads that divide the attention heads (grouped-query attention shares each key/value head among
    a whole group of query heads); a config that breaks it builds but fails in its first forward pass."""
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise UsageError(
            f"backbone config '{label}': num_key_value_heads {kv_heads} does not divide num_attention_heads {heads} "
            "(each key/value head serves a whole group of query heads); use a divisor of it"
        )


def check_sizes(values: dict[str, Any], label: str) -> None:
    """Each size a config's values give (:data:`SIZE_LIMITS`; None: unset) is a positive integer within
    its limit, so a typo is one line naming the field, not a tensor of a negative or absurd dimension."""
    for name, limit in SIZE_LIMITS.items():
        value = values.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"backbone config '{label}': {name} must be a positive integer, got {shown(value)}")
        if value > limit:
            raise UsageError(
                f"backbone config '{label}': {name} {value} is larger than {limit}, far past any released model's"
            )


def weightless_config(spec: str):
    """The config of a bundled shape or a config file, or None for any other backbone."""
    if is_shape(spec):
        return shape_config(spec)
    if is_config_file(spec):
        return config_from_file(spec)
    return None


def config_label(spec: str) -> str:
    """What a config-only backbone is, for a record's source: ``shape t5-large``, ``config file PATH``
    or ``config of NAME`` (a model folder or hub id whose weights are not used)."""
    if is_shape(spec):
        return f"shape {spec}"
    if is_config_file(spec):
        return f"config file {spec}"
    return f"config of {spec}"
