"""One registry of fine-tuning methods, filled by the method modules themselves.

A method registers a light :class:`MethodSpec` (name, one-line description, config dataclass,
default learning rate, Pareto knob) when its module is imported; the module's heavy code (torch,
peft) is imported only inside :meth:`MethodSpec.build`.  ``petlprof list`` therefore needs
neither torch nor NVML.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from petlprof.errors import UsageError, unknown_choice


@dataclass(frozen=True)
class MethodSpec:
    """What the harness knows about a method without importing its implementation."""

    name: str
    description: str  # one line: what it trains
    config_cls: type
    apply: str  # "module:function" that turns a SequenceClassifier into the model to train
    default_lr: float  # per-method default learning rate, from the method's paper or PEFT examples
    lr_source: str  # where the default learning rate comes from
    pareto_knob: str | None = None  # config field that trades quality for cost
    default_grid: tuple = ()  # 3-4 values of the Pareto knob that ``--grid`` sweeps
    side_tuning: bool = False  # never back-propagates through the frozen backbone
    merge: str | None = None  # "module:function" folding the trained weights into the backbone

    def __post_init__(self):
        if self.default_grid and self.pareto_knob is None:
            raise RuntimeError(f"method '{self.name}' has a default grid but no Pareto knob")

    def make_config(self, overrides: dict[str, Any] | None = None):
        """The method's config dataclass from user overrides, rejecting unknown fields by name."""
        overrides = dict(overrides or {})
        names = {f.name for f in dataclasses.fields(self.config_cls)}
        for key in overrides:
            if not names:
                raise UsageError(f"method '{self.name}' has no options (got '{key}')")
            if key not in names:
                raise unknown_choice(f"option of method '{self.name}'", key, names)
        try:
            return self.config_cls(**overrides)
        except (TypeError, ValueError) as exc:  # e.g. a string where a number belongs
            raise UsageError(f"bad option for method '{self.name}' {overrides}: {exc}") from None

    def build(self) -> Callable:
        return _resolve(self.apply)

    def build_merge(self) -> Callable | None:
        """The method's merge function (trained model -> model with weights folded in), if any."""
        return _resolve(self.merge) if self.merge else None

    def grid_configs(self) -> list[dict[str, Any]]:
        """One method-config override per value of the default grid (``[{}]`` without a grid)."""
        if not self.default_grid:
            return [{}]
        return [{self.pareto_knob: value} for value in self.default_grid]


def _resolve(target: str) -> Callable:
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


_METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    if spec.name in _METHODS and _METHODS[spec.name] != spec:
        raise RuntimeError(f"method '{spec.name}' registered twice")
    _METHODS[spec.name] = spec
    return spec


def _load_builtin_methods() -> None:
    importlib.import_module("petlprof.methods")  # its __init__ imports each method's light module


def method_names() -> list[str]:
    _load_builtin_methods()
    return sorted(_METHODS)


def get_method(name: str) -> MethodSpec:
    _load_builtin_methods()
    if name not in _METHODS:
        raise unknown_choice("method", name, _METHODS)
    return _METHODS[name]


def config_field_help(config_cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) for each field of a method config dataclass."""
    out = []
    for f in dataclasses.fields(config_cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append((f.name, default, f.metadata.get("help", "")))
    return out


def help_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text travels with it (shown by ``petlprof list``)."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


__all__ = [
    "MethodSpec",
    "UsageError",
    "config_field_help",
    "get_method",
    "help_field",
    "method_names",
    "register_method",
]
