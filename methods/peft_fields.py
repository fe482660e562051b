"""PEFT's config dataclasses as petlprof method configs: every field of a tuner's config, checked by its own type.

:func:`config_class` turns one PEFT config class (``peft.VeraConfig``, ...) into a
:class:`~petlprof.method_api.MethodConfig` dataclass with the same field names and defaults, each declared with
a check built from the field's annotation out of :mod:`petlprof.method_api`'s checks: ``int`` and ``float`` are
finite numbers in a range (``Number``), ``bool`` and ``Literal``/``Enum`` values a ``Choice``, ``str`` a ``Text``,
lists and tables ``Items`` and ``Mapping``, unions ``AnyOf``.  Ranges come from the field's meaning where its
name says it (a dropout is in ``[0, 1)``, a rank ``r`` at least 1) and are otherwise non-negative (PEFT's
numbers are ranks, counts, sizes, scales, weights and seeds); a negative default (LoKr's ``decompose_factor=-1``)
is allowed down to itself.

Some fields are not the method's to set: :data:`BASE_FIELDS` (PEFT's own bookkeeping, or what petlprof's run
decides), :data:`DERIVED` (a prompt's shape: from the backbone's architecture description) and fields whose
values are nested configs of initialisation schemes that need data or a quantised model (LoftQ, EVA, CorDA,
...), which a run cannot drive; they stay at PEFT's defaults.  :func:`excluded_fields` says why for each, and
an ``adapter_config.json`` that sets one to anything else is refused with that reason
(:mod:`petlprof.methods.peft_tuners`).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import re
import types
import typing
from typing import Any, Literal

from petlprof.method_api import (
    MAX_WIDTH,
    AnyOf,
    Choice,
    Items,
    Mapping,
    MethodConfig,
    ModuleNames,
    Number,
    Text,
)

MAX_INTEGER = 10**12  # PEFT's integers are counts, sizes, steps and seeds: none near a trillion
MAX_REAL = 1e6  # PEFT's real-valued fields are scales, weights, bounds and rates: none near a million
RANK = re.compile(r"(.*_)?r")  # r, init_r, target_r, mini_r: a rank, at least 1 where its default is
DROPOUT = re.compile(r".*dropout.*")  # lora_dropout, rank_dropout, xlora_dropout_p: a probability below 1

# PeftConfig's own fields: what petlprof does with each instead of taking it from a method config
BASE_FIELDS = {
    "peft_type": "it picks the tuner (peft:TYPE)",
    "task_type": "petlprof picks PEFT's wrapper for its own task model",
    "base_model_name_or_path": "--backbone picks the model",
    "revision": "--backbone picks the model (and its revision)",
    "auto_mapping": "it names the class of the model the adapter was saved from; --backbone picks the model",
    "inference_mode": "petlprof trains the adapter",
    "peft_version": "the PEFT release that wrote it; this run uses the installed one",
}
# a prompt's shape and where its text initialisation is tokenised: read from the backbone, as the built-ins do
DERIVED = {
    "token_dim": "the backbone's architecture description gives it",
    "num_layers": "the backbone's architecture description gives it",
    "num_attention_heads": "the backbone's architecture description gives it",
    "num_transformer_submodules": "PEFT derives it from the backbone",
    "tokenizer_name_or_path": "the backbone's own tokenizer is used",
}
OTHER_EXCLUDED = {
    "megatron_config": "Megatron-LM's parallel layers are not transformers models petlprof loads",
    "megatron_core": "Megatron-LM's parallel layers are not transformers models petlprof loads",
}
NESTED = (
    "a nested configuration of an initialisation or training scheme that needs calibration data, a quantised "
    "model or a layer layout the run does not provide"
)


def _non_none(args: tuple) -> list:
    return [a for a in args if a is not type(None)]


def _choice_values(members: list) -> list:
    """The values of Literal and Enum members, and True/False for ``bool``.  A Literal value that is a template
    (LoRA's ``pissa_niter_[number of iters]``) is no value itself."""
    values: list = []
    for member in members:
        if member is bool:
            values += [True, False]
        elif _is_enum(member):
            values += [m.value for m in member]
        else:
            values += [v for v in typing.get_args(member) if not (isinstance(v, str) and "[" in v)]
    return values


def _is_enum(member: Any) -> bool:
    return isinstance(member, type) and issubclass(member, enum.Enum)


def _number(name: str, kind: type, default: Any, optional: bool) -> Number:
    """A number field's range, from its name and default (see the module's docstring)."""
    if DROPOUT.fullmatch(name):
        return Number(minimum=0, maximum=1, inclusive=True, below=True, optional=optional)
    low = min(default, 0) if isinstance(default, (int, float)) and not isinstance(default, bool) else 0
    if kind is int:
        if RANK.fullmatch(name) and (default is None or default >= 1):
            return Number(minimum=1, maximum=MAX_WIDTH, inclusive=True, integer=True, optional=optional)
        return Number(minimum=low, maximum=MAX_INTEGER, inclusive=True, integer=True, optional=optional)
    return Number(minimum=low, maximum=MAX_REAL, inclusive=True, optional=optional)


# any finite number, string or boolean: the values of an untyped table (``rank_pattern``: module -> rank)
SCALAR = AnyOf((Number(minimum=-MAX_REAL, maximum=MAX_REAL, inclusive=True), Text(), Choice((True, False))))


def field_check_of(name: str, hint: Any, default: Any) -> Any:
    """The check of a PEFT config field from its annotation, or None for a type no check describes."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    union = origin is typing.Union or origin is types.UnionType
    members = _non_none(args) if union else [hint]
    optional = (union and len(members) < len(args)) or default is None  # PEFT fills in what it leaves unset
    chosen = [m for m in members if m is bool or _is_enum(m) or typing.get_origin(m) is Literal]
    if chosen:
        rest = [m for m in members if m not in chosen]
        if rest == [str] and chosen == [bool]:  # a flag or free text (a tuner's init_weights)
            return AnyOf((Choice((True, False)), Text(optional=optional)))
        if any(m is not str for m in rest):
            return None
        return Choice(tuple(_choice_values(chosen)) + ((None,) if optional else ()))  # str beside values: one of them
    if set(members) == {str, list[str]}:
        return ModuleNames(pattern=True)
    if len(members) == 1:
        return _single(name, members[0], default, optional)
    checks = [_single(name, m, default, False) for m in members]
    if set(members) == {int, float}:
        return _number(name, float, default, optional)
    if any(c is None for c in checks):
        return None
    return AnyOf(tuple(checks), optional=optional)


def _single(name: str, hint: Any, default: Any, optional: bool) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (int, float):
        return _number(name, hint, default, optional)
    if hint is str:
        return Text(optional=optional)
    if hint is dict or (origin is dict and args and args[0] is str):
        value = SCALAR if not args else field_check_of(name, args[1], None)
        return None if value is None else Mapping(value, optional=optional)
    if origin is list and args:
        if args[0] is str:
            return ModuleNames() if optional else Items(Text(non_empty=True))
        item = _single(name, args[0], None, False)
        return None if item is None or typing.get_origin(args[0]) is tuple else Items(item, optional=optional)
    return None  # a nested dataclass (LoftQConfig, ...), a tuple, an untyped list


def plain(value: Any) -> Any:
    """A default as a method config holds it (and JSON writes it): enum members as their values, sets as
    sorted lists, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def peft_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return plain(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return plain(f.default_factory())
    return None


def _help(f: dataclasses.Field) -> str:
    """The first sentence of PEFT's own help for the field, on one line."""
    text = " ".join(str(f.metadata.get("help", "")).split())
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return first.rstrip(".") or f"PEFT's {f.name}"


def excluded_fields(peft_cls: type) -> dict[str, str]:
    """Fields of ``peft_cls`` a method config does not carry, each with why."""
    hints = typing.get_type_hints(peft_cls)
    out = {}
    for f in dataclasses.fields(peft_cls):
        reason = BASE_FIELDS.get(f.name) or DERIVED.get(f.name) or OTHER_EXCLUDED.get(f.name)
        if reason is None and field_check_of(f.name, hints[f.name], peft_default(f)) is None:
            reason = NESTED
        if reason is not None:
            out[f.name] = reason
    return out


def config_class(peft_cls: type, name: str, defaults: dict[str, Any]) -> type:
    """A MethodConfig dataclass named ``name`` with the fields of ``peft_cls`` a method config carries, each
    checked by its annotation; ``defaults`` replaces PEFT's where a tuner needs a value PEFT leaves unset."""
    hints = typing.get_type_hints(peft_cls)
    excluded = excluded_fields(peft_cls)
    fields = []
    for f in dataclasses.fields(peft_cls):
        if f.name in excluded:
            continue
        default = defaults.get(f.name, peft_default(f))
        check = field_check_of(f.name, hints[f.name], default)
        meta = {"help": _help(f), "check": check}
        if isinstance(default, (list, dict)):
            spec = dataclasses.field(default_factory=_copier(default), metadata=meta)
        else:
            spec = dataclasses.field(default=default, metadata=meta)
        fields.append((f.name, Any, spec))
    return dataclasses.make_dataclass(name, fields, bases=(MethodConfig,))


def _copier(value: Any):
    return lambda: copy.deepcopy(value)
