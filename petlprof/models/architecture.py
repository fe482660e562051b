"""What a method may assume about a backbone, discovered from the model itself.

:func:`describe` walks a transformers model (a real one, or one built on the ``meta`` device from
a config, which costs no memory) and returns an :class:`Architecture`: the stack(s) of transformer
blocks, and in each block its attention sub-module(s) with their query/key/value projections
(separate or fused) and output projection, and the feed-forward block's output projection; width,
heads and depth come from the config through transformers' attribute maps (``hidden_size`` reads
``dim``, ``d_model`` or ``n_embd`` where a model names it so).

Blocks are the elements of a ``ModuleList`` whose class transformers lists in the model's
``_no_split_modules``, or, where that list is empty, whose elements hold an attention-named
sub-module with linear layers (the innermost such list: ALBERT's one shared layer, not its group).
Inside a block, projections are told apart by name tokens (``q``/``query``, ``k``/``key``,
``v``/``value``; ``qkv``, ``query_key_value``, ``c_attn`` fused) and by shape (the output
projection and the feed-forward output map back to the model width).  The four families of the
tiny presets (bert, t5, gpt2, llama) keep explicit entries for where their sub-layers end;
``Architecture.path`` says which path a backbone took.

:func:`unsupported_reason` says in one line why a built-in method cannot apply to a backbone (or
``None``), from its config alone, so a sweep can refuse such pairs before any run starts.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch
from torch import nn

from petlprof.errors import UsageError, shown
from petlprof.models.families import model_from_config

# model_type -> (attention block's output projection, feed-forward block's output projection), full names
EXPLICIT_SUBLAYERS: dict[str, tuple[str, str]] = {
    "bert": (r"(.*\.)?layer\.\d+\.attention\.output\.dense", r"(.*\.)?layer\.\d+\.output\.dense"),
    "t5": (
        r"(encoder|decoder)\.block\.\d+\.layer\.0\.SelfAttention\.o",
        r"(encoder|decoder)\.block\.\d+\.layer\.\d+\.DenseReluDense\.wo",
    ),
    "gpt2": (r"(.*\.)?h\.\d+\.attn\.c_proj", r"(.*\.)?h\.\d+\.mlp\.c_proj"),
    "llama": (r"(.*\.)?layers\.\d+\.self_attn\.o_proj", r"(.*\.)?layers\.\d+\.mlp\.down_proj"),
}
_ATTENTION_NAME = re.compile(r"att(entio)?n", re.IGNORECASE)
_QUERY, _KEY, _VALUE = {"q", "query", "wq"}, {"k", "key", "wk"}, {"v", "value", "wv"}
_FUSED_TOKENS, _FUSED_NAMES = {"qkv", "wqkv"}, {"c_attn", "in_proj"}  # qkv_proj, Wqkv; GPT-2's, torch's in_proj


@dataclass(frozen=True)
class Attention:
    """One attention sub-module of a block; projection fields are full module names ('' if absent)."""

    name: str
    query: str = ""
    key: str = ""
    value: str = ""
    fused_qkv: str = ""
    output: str = ""


@dataclass(frozen=True)
class Block:
    name: str
    attentions: tuple[Attention, ...]  # self-attention first, then cross-attention
    ffn_output: str = ""  # the feed-forward block's last projection back to the model width


@dataclass(frozen=True)
class Stack:
    name: str  # the ModuleList, e.g. 'encoder.layer'
    blocks: tuple[Block, ...]
    found_by: str  # '_no_split_modules' or 'structure'


class StackInfo(TypedDict):
    blocks: int
    found_by: str  # '_no_split_modules' or 'structure'


class ArchitectureInfo(TypedDict):
    """The record's summary of an :class:`Architecture` (``backbone_info.architecture``)."""

    path: str  # 'explicit (bert)' or 'generic'
    stacks: dict[str, StackInfo]  # by the stack's module name
    width: int
    heads: int
    kv_width: int
    layers: int
    kv_cache: bool


@dataclass(frozen=True)
class Architecture:
    model_type: str
    path: str  # 'explicit (bert)' or 'generic'
    stacks: tuple[Stack, ...]
    width: int
    heads: int
    head_dim: int
    kv_width: int  # width of each key (and value) projection: heads x head_dim, less with grouped or multi-query
    layers: int  # depth per stack as the config states it (ALBERT runs one shared block that often)
    kv_cache: bool  # the base model's forward takes a key/value cache (what prefix tuning fills)
    embedding_dim: int | None  # width of the input embeddings (ALBERT's are narrower); None: the model has none
    bias_terms: bool  # any bias parameter (BitFit's trainable set); T5, LLaMA, Mistral, Gemma have none
    module_names: tuple[str, ...] = field(default=(), repr=False)
    output_width: int | None = None  # width of the base model's last state when it differs from ``width``

    @property
    def final_width(self) -> int:
        """Width of the state the task head reads (OPT-350m projects its last state 1024 -> 512)."""
        return self.output_width or self.width

    @property
    def blocks(self) -> list[Block]:
        return [block for stack in self.stacks for block in stack.blocks]

    def projections(self, *roles: str) -> list[str]:
        """Full names of the attention projections of the given roles (query, key, value, fused_qkv, output)."""
        names = []
        for block in self.blocks:
            for attention in block.attentions:
                names += [getattr(attention, role) for role in roles if getattr(attention, role)]
        return names

    def sublayer_outputs(self, attention: bool = True) -> list[str]:
        """Where each block's sub-layers end, in model order: the self-attention output projection
        (if ``attention``) and the feed-forward output projection; the explicit entry where one exists."""
        if self.model_type in EXPLICIT_SUBLAYERS:
            attn, ffn = EXPLICIT_SUBLAYERS[self.model_type]
            return [n for n in self.module_names if re.fullmatch(f"{attn}|{ffn}" if attention else ffn, n)]
        names = []
        for block in self.blocks:
            if attention and block.attentions and block.attentions[0].output:
                names.append(block.attentions[0].output)
            if block.ffn_output:
                names.append(block.ffn_output)
        return names

    def missing_sublayers(self) -> str | None:
        """Why :meth:`sublayer_outputs` is incomplete (a block without an attention or feed-forward output)."""
        if not self.stacks:
            return f"no stack of transformer blocks found in this {self.model_type} model"
        for block in self.blocks:
            if not (block.attentions and block.attentions[0].output):
                return f"no attention output projection found in block '{block.name}' of the {self.model_type} model"
            if not block.ffn_output:
                return f"no feed-forward output projection found in block '{block.name}' of the {self.model_type} model"
        return None

    def info(self) -> ArchitectureInfo:
        """The record's summary: which path, which stacks (and how found), the shape read from the config."""
        return {
            "path": self.path,
            "stacks": {stack.name: {"blocks": len(stack.blocks), "found_by": stack.found_by} for stack in self.stacks},
            "width": self.width,
            "heads": self.heads,
            "kv_width": self.kv_width,
            "layers": self.layers,
            "kv_cache": self.kv_cache,
        }


def name_patterns(names: list[str]) -> list[str]:
    """Module names with layer indices as ``*`` (``layers.*.self_attn.q_proj``), sorted and unique: a record's
    short form of where a method put its pieces."""
    return sorted({re.sub(r"\.\d+(?=\.|$)", ".*", name) for name in names})


def _linear_shape(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a linear layer: torch's Linear (and subclasses) or transformers' Conv1D."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight: Any = getattr(module, "weight", None)  # Any: nn.Module types a sub-module's attribute as either
    if type(module).__name__ == "Conv1D" and weight is not None:
        return int(weight.shape[0]), int(weight.shape[1])  # Conv1D stores (in, out)
    return None


def _out_width(module: nn.Module) -> int:
    """Output width of a projection that :func:`_linears` found (so a linear layer)."""
    shape = _linear_shape(module)
    if shape is None:
        raise AssertionError(f"{type(module).__name__} is not a linear layer")
    return shape[1]


def _linears(module: nn.Module, prefix: str) -> list[tuple[str, int, int]]:
    return [
        (f"{prefix}.{name}", *shape)
        for name, sub in module.named_modules()
        if name and (shape := _linear_shape(sub)) is not None
    ]


def _attention_modules(block: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """The outermost attention-named sub-modules that hold at least two linear layers."""
    found: list[tuple[str, nn.Module]] = []
    for name, sub in block.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if not name or not _ATTENTION_NAME.search(leaf) or _linear_shape(sub) is not None:
            continue
        if any(name.startswith(outer + ".") for outer, _ in found) or len(_linears(sub, "")) < 2:
            continue
        found.append((name, sub))
    return [(f"{prefix}.{name}", sub) for name, sub in found]


def _role(leaf: str) -> str | None:
    tokens = set(re.split(r"[_\W]+", leaf.lower())) - {""}
    hits = [role for role, names in (("query", _QUERY), ("key", _KEY), ("value", _VALUE)) if tokens & names]
    if len(hits) > 1 or tokens & _FUSED_TOKENS or leaf.lower() in _FUSED_NAMES:
        return "fused_qkv"
    return hits[0] if hits else None


def _attention(name: str, module: nn.Module, width: int) -> Attention:
    roles: dict[str, str] = {}
    rest = []
    for full, _, out in _linears(module, name):
        role = _role(full.rsplit(".", 1)[-1])
        if role and role not in roles:
            roles[role] = full
        elif out == width:
            rest.append(full)
    return Attention(name=name, output=rest[-1] if rest else "", **roles)


def _block(name: str, module: nn.Module, width: int) -> Block:
    attentions = _attention_modules(module, name)
    inside = tuple(attn + "." for attn, _ in attentions)
    outside = [full for full, _, out in _linears(module, name) if out == width and not full.startswith(inside)]
    return Block(
        name=name,
        attentions=tuple(_attention(attn, sub, width) for attn, sub in attentions),
        ffn_output=outside[-1] if outside else "",
    )


def _stacks(model: nn.Module, width: int) -> list[Stack]:
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    candidates = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        if any(type(block) is not type(module[0]) for block in module):
            continue
        if type(module[0]).__name__ in no_split:
            candidates.append((name, module, "_no_split_modules"))
        elif _attention_modules(module[0], ""):
            candidates.append((name, module, "structure"))
    if any(found_by == "_no_split_modules" for _, _, found_by in candidates):  # transformers' word first
        candidates = [c for c in candidates if c[2] == "_no_split_modules"]
    inner = [c for c in candidates if not any(o[0].startswith(c[0] + ".") for o in candidates)]
    return [
        Stack(name, tuple(_block(f"{name}.{i}", block, width) for i, block in enumerate(module)), found_by)
        for name, module, found_by in inner
    ]


def _takes_cache(model: nn.Module) -> bool:
    parameters = inspect.signature(type(model).forward).parameters
    return "cache" in parameters or "past_key_values" in parameters


def _kv_width(model: nn.Module, stacks: list[Stack], query_width: int) -> int:
    """Output width of the first key projection (or the key's share of a fused query-key-value one)."""
    attentions = [a for stack in stacks for block in stack.blocks for a in block.attentions]
    if not attentions:
        return query_width
    modules = dict(model.named_modules())
    if attentions[0].key:
        return _out_width(modules[attentions[0].key])
    if attentions[0].fused_qkv:
        return (_out_width(modules[attentions[0].fused_qkv]) - query_width) // 2
    return query_width


def describe(model: nn.Module) -> Architecture:
    """The :class:`Architecture` of a transformers base model (no task head) or of one with its LM head (its
    stacks are found inside the wrapper: ``model.layers``, ``transformer.h``, ``encoder.block``), real or on the
    meta device."""
    config: Any = model.config  # a transformers model's; nn.Module types any attribute as a tensor or a module
    embeddings: Any = model.get_input_embeddings  # as config
    text = config.get_text_config(decoder=True)  # the config itself, or a composite model's text part
    width, heads = int(text.hidden_size), int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or width // heads)
    stacks = _stacks(model, width)
    return Architecture(
        model_type=config.model_type,
        path=f"explicit ({config.model_type})" if config.model_type in EXPLICIT_SUBLAYERS else "generic",
        stacks=tuple(stacks),
        width=width,
        heads=heads,
        head_dim=head_dim,
        kv_width=_kv_width(model, stacks, heads * head_dim),
        layers=int(text.num_hidden_layers),
        kv_cache=_takes_cache(model),
        embedding_dim=getattr(embeddings(), "embedding_dim", None),
        bias_terms=any(name.endswith(".bias") or name == "bias" for name, _ in model.named_parameters()),
        module_names=tuple(name for name, _ in model.named_modules()),
        output_width=_projected_output(text, width),
    )


def _projected_output(config, width: int) -> int | None:
    """The width OPT's decoder projects its last state to (``project_out``, ``word_embed_proj_dim``), where it
    is not the model width; None otherwise."""
    projected = getattr(config, "word_embed_proj_dim", None)
    return int(projected) if projected and int(projected) != width else None


def describe_config(config, lm_head: bool = False, spec: str = "this backbone") -> Architecture:
    """:func:`describe` of the model a config builds, built on the meta device (no weights, no memory);
    ``lm_head``: the model with its language-modelling head, as the LM objective loads it (module names
    then carry the wrapper's prefix, e.g. ``model.layers.0...``)."""
    from transformers.utils import logging as hf_logging  # transformers: describe() of a given model needs none

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            model = model_from_config(config, lm_head, spec)
    finally:
        hf_logging.set_verbosity(verbosity)
    return describe(model)


def _pair_or_fused(attention: Attention, roles: tuple[str, str]) -> list[str]:
    """The attention's projections of both ``roles`` where it has them apart, else its fused projection."""
    names = [getattr(attention, role) for role in roles]
    if all(names):
        return names
    return [attention.fused_qkv] if attention.fused_qkv else []


def lora_targets(arch: Architecture) -> list[str]:
    """LoRA's generic placement: each attention's query and value projections, or its fused projection."""
    return [
        name
        for block in arch.blocks
        for attention in block.attentions
        for name in _pair_or_fused(attention, ("query", "value"))
    ]


def ia3_targets(arch: Architecture) -> tuple[list[str], list[str]]:
    """(IA3's target modules, its feed-forward subset): each attention's keys and values (or fused
    projection) and each block's feed-forward output layer, whose input is rescaled (Liu et al. 2022)."""
    targets, feedforward = [], []
    for block in arch.blocks:
        for attention in block.attentions:
            targets += _pair_or_fused(attention, ("key", "value"))
        if block.ffn_output:
            targets.append(block.ffn_output)
            feedforward.append(block.ffn_output)
    return targets, feedforward


def peft_table(method: str, model_type: str) -> tuple[list[str] | None, list[str] | None]:
    """PEFT's own (target_modules, feedforward_modules) for ``model_type``, (None, None) where it has none."""
    # peft: slow to import, loaded only when used
    from peft.utils import constants

    if method == "lora":
        return _listed(constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)), None
    targets = constants.TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING.get(model_type)
    return _listed(targets), _listed(constants.TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING.get(model_type))


def _listed(names: Sequence[str] | None) -> list[str] | None:
    return None if names is None else list(names)


def _missing_projections(method: str, arch: Architecture) -> str | None:
    table, _ = peft_table(method, arch.model_type)
    if table is not None:
        return None
    if not arch.stacks:
        return f"PEFT has no {method} targets for '{arch.model_type}' and no stack of transformer blocks was found"
    for block in arch.blocks:
        attention = block.attentions[0] if block.attentions else None
        wanted = ("query", "value") if method == "lora" else ("key", "value")
        if attention is None or not _pair_or_fused(attention, wanted):
            return (
                f"PEFT has no {method} targets for '{arch.model_type}' and block '{block.name}' has no "
                f"recognisable {' and '.join(wanted)} projections; give target_modules"
            )
        if method == "ia3" and not block.ffn_output:
            return (
                f"PEFT has no ia3 targets for '{arch.model_type}' and block '{block.name}' has no feed-forward "
                "output projection; give target_modules and feedforward_modules"
            )
    return None


def _no_cache(arch: Architecture) -> str | None:
    if arch.kv_cache:
        return None
    return (
        f"prefix tuning puts trained keys and values in every attention layer's key/value cache, "
        f"and the {arch.model_type} model takes no cache"
    )


def _no_embeddings(arch: Architecture) -> str | None:
    return None if arch.embedding_dim else f"the {arch.model_type} model has no input embeddings to put a prompt before"


def _projected_last_state(arch: Architecture) -> str | None:
    if arch.output_width is None:
        return None
    return (
        f"the {arch.model_type} model projects its last layer's states from width {arch.width} to "
        f"{arch.output_width}, so its per-layer states differ in width and one side network cannot read them all"
    )


REQUIREMENTS = {
    "adapter": Architecture.missing_sublayers,
    "read": _projected_last_state,
    "lst": _projected_last_state,
    "ia3": lambda arch: _missing_projections("ia3", arch),
    "lora": lambda arch: _missing_projections("lora", arch),
    "prefix_tuning": _no_cache,
    "prompt_tuning": _no_embeddings,
}


def unsupported_reason(method: str, backbone, method_config: dict[str, Any] | None = None) -> str | None:
    """One line on why built-in ``method`` cannot apply to ``backbone`` (an :class:`Architecture`, a
    model or a transformers config), or None.  LoRA's and IA3's explicit ``target_modules`` replace their need
    for discovered projections by :func:`unmatched_targets`.  Methods without requirements here (plug-ins too)
    give None, and so does a config that cannot be built without weights: the run's ``apply`` then checks the
    loaded model."""
    check = REQUIREMENTS.get(method)
    if check is None:
        return None
    arch = describe_any(backbone)
    if arch is None:
        return None
    fields = method_config or {}
    if method in ("lora", "ia3") and fields.get("target_modules"):
        return unmatched_targets(arch, fields["target_modules"], fields.get("feedforward_modules"))
    return check(arch)


def unmatched_targets(arch: Architecture, targets: list[str], feedforward: list[str] | None = None) -> str | None:
    """Why PEFT would adapt fewer modules than ``targets`` name: a name that matches no module of ``arch`` (PEFT's
    rule: a module's full name is the name or ends with ``.`` and the name), or (IA3) a feed-forward module that
    is not one of the targets (PEFT refuses those); None when every name matches."""
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in arch.module_names)]
    if missing:
        return (
            f"target_modules {_listed_names(missing)}: no module of the {arch.model_type} model has "
            f"{'that name' if len(missing) == 1 else 'these names'} (as its name or its last parts); its modules "
            f"include {', '.join(_module_examples(arch))}"
        )
    outside = [name for name in feedforward or () if name not in targets]
    if outside:
        return (
            f"feedforward_modules {_listed_names(outside)} are not among target_modules {_listed_names(targets)}; "
            "each feed-forward module must also be a target (IA3 rescales its input instead of its output)"
        )
    return None


def _listed_names(names: list[str]) -> str:
    return ", ".join(shown(name) for name in names)


def _module_examples(arch: Architecture) -> list[str]:
    """A few names a user may target: the last part of the first block's projections (attention, then
    feed-forward output), or the first modules of the model where no block was found."""
    if not arch.blocks:
        return [name for name in arch.module_names if name][:5]
    block = arch.blocks[0]
    roles = ("query", "key", "value", "fused_qkv", "output")
    names = [getattr(a, role) for a in block.attentions[:1] for role in roles] + [block.ffn_output]
    return list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names if name))


def describe_any(backbone, spec: str = "this backbone", lm_head: bool = False) -> Architecture | None:
    """An :class:`Architecture` as is, a model's, or a config's (built on the meta device, with its LM head if
    ``lm_head``: :func:`describe_config`); None for a config transformers cannot build without weights (its run's
    ``apply`` then checks the loaded model)."""
    if isinstance(backbone, Architecture):
        return backbone
    if isinstance(backbone, nn.Module):
        return describe(backbone)
    try:
        return describe_config(backbone, lm_head, spec=spec)
    except UsageError:  # a config the model refuses (model_from_config): the user's to fix, not a blind spot
        raise
    except Exception:  # noqa: BLE001 - any failure to build the meta model: the preflight cannot tell
        return None


def require(method: str, arch: Architecture) -> None:
    """Raise the one-line UsageError of :func:`unsupported_reason` (apply's guard when no preflight ran)."""
    reason = REQUIREMENTS[method](arch)
    if reason is not None:
        raise UsageError(f"{method} cannot apply to this backbone: {reason}")
