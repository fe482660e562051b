"""The one place a method name is resolved: built-in methods, installed plug-ins and ``module:ATTR``.

A name given to ``--methods`` (and carried in every run's spec) is one of

* a built-in method, listed in :data:`BUILTIN_METHODS` by the ``module:ATTR`` of its MethodSpec in
  ``petlprof.methods`` (imported only when that method is asked for);
* the name of an entry point in group ``petlprof.methods`` of an installed distribution, whose value
  ``module:ATTR`` names a :class:`~petlprof.method_api.MethodSpec` of the same name;
* ``package.module:ATTR`` naming a ``MethodSpec`` directly (the current folder is importable, as
  for ``python -m``);
* ``peft:TYPE``, any tuner PEFT registers (``peft:vera``, ``peft:loha``, ...; ``peft:dora``): the
  ``peft:`` prefix names these, not a module called ``peft`` (:mod:`petlprof.methods.peft_tuners`).

Each process — the sweep, a fresh worker, a torchrun rank, a Ray task — resolves the name by
itself, lazily, so a plug-in needs no registration call in the user's process.  A plug-in that
clashes with a built-in, fails to import or is malformed is one :class:`UsageError` line saying
which plug-in, which distribution and what is wrong.  Listing methods imports no torch (unless a
plug-in's own module does).

The registry stands below the methods, with the contract (:mod:`petlprof.method_api`): no method
registers itself, and nothing here imports ``petlprof.methods`` by an import statement; the tables
below name what it loads from there, the way an entry point names a plug-in.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata as metadata
import os
import re
import sys
from typing import Any

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.method_api import PEFT_PREFIX, MethodSpec, MethodSpecError, field_check, resolve_target

ENTRY_POINT_GROUP = "petlprof.methods"
REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")

BUILTIN_METHODS = {  # name -> module:ATTR of its MethodSpec (a light module: torch/peft load on apply)
    "adapter": "petlprof.methods.adapter:SPEC",
    "bitfit": "petlprof.methods.bitfit:SPEC",
    "full": "petlprof.methods.full:SPEC",
    "ia3": "petlprof.methods.ia3:SPEC",
    "linear_probe": "petlprof.methods.linear_probe:SPEC",
    "lora": "petlprof.methods.lora:SPEC",
    "lst": "petlprof.methods.lst:SPEC",
    "prefix_tuning": "petlprof.methods.prefix_tuning:SPEC",
    "prompt_tuning": "petlprof.methods.prompt_tuning:SPEC",
    "read": "petlprof.methods.read:SPEC",
    "zero_shot": "petlprof.methods.zero_shot:SPEC",
}
PEFT_TUNERS = {  # what peft:TYPE and PEFT's saved adapter_config.json need, by module:ATTR (peft loads on use)
    "method_spec": "petlprof.methods.peft_tuners:tuner_spec",  # peft:TYPE -> its MethodSpec
    "unsupported": "petlprof.methods.peft_tuners:unsupported_reason",  # (peft:TYPE, backbone, fields) -> why not
    "config_file": "petlprof.methods.peft_files:read_adapter_config",  # path -> (peft:TYPE, fields, notes)
}

_PLUGINS: dict[str, MethodSpec] = {}  # plug-ins resolved in this process, by the name they were asked for


@functools.cache
def _builtin(name: str) -> MethodSpec:
    """The MethodSpec of built-in method ``name``, imported from the module :data:`BUILTIN_METHODS` names."""
    method_spec = resolve_target(BUILTIN_METHODS[name])
    if not (isinstance(method_spec, MethodSpec) and method_spec.name == name):
        raise RuntimeError(
            f"{BUILTIN_METHODS[name]} is {shown(method_spec)}, not the MethodSpec of built-in method '{name}'"
        )
    return method_spec


def peft_unsupported_reason(name: str, backbone: Any, method_config: dict[str, Any] | None = None) -> str | None:
    """One line on why PEFT tuner ``name`` (``peft:TYPE``) cannot adapt ``backbone`` with ``method_config``, or None."""
    return resolve_target(PEFT_TUNERS["unsupported"])(name, backbone, method_config)


def read_peft_config_file(path: str) -> tuple[str, dict[str, Any], list[str]]:
    """A PEFT ``adapter_config.json``: (its tuner ``peft:TYPE``, the fields petlprof takes, notes on the rest)."""
    return resolve_target(PEFT_TUNERS["config_file"])(path)


@functools.cache
def _entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Installed plug-ins by entry-point name (a name two distributions declare has two)."""
    found: dict[str, list[metadata.EntryPoint]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if all(ep.value != other.value for other in found.get(ep.name, [])):  # one dist seen twice on the path
            found.setdefault(ep.name, []).append(ep)
    return found


def builtin_method_names() -> list[str]:
    """The methods that ship with petlprof (not loaded: see :func:`get_method`)."""
    return sorted(BUILTIN_METHODS)


def method_names() -> list[str]:
    """Built-in methods and installed plug-ins (not loaded: see :func:`get_method`)."""
    return sorted(set(builtin_method_names()) | set(_entry_points()))


def get_method(name: str) -> MethodSpec:
    """The MethodSpec of a built-in method, an installed plug-in or a ``module:ATTR`` reference."""
    if not isinstance(name, str):
        raise UsageError(f"a method name must be text, got {shown(name)}")
    if name in _PLUGINS:
        return _PLUGINS[name]
    if is_peft_tuner(name):
        _PLUGINS[name] = resolve_target(PEFT_TUNERS["method_spec"])(name)
        return _PLUGINS[name]
    plugins = _entry_points().get(name, [])
    if name in BUILTIN_METHODS:
        if plugins:
            ep = plugins[0]
            raise UsageError(f"{_entry_label(ep)}: its name clashes with the built-in method '{name}'; rename it")
        return _builtin(name)
    if ":" in name:
        method_spec = _load_reference(name)
    elif len(plugins) > 1:
        raise UsageError(
            f"plug-in method '{name}' is declared by several distributions "
            f"({', '.join(sorted(_distribution(ep) for ep in plugins))}); uninstall all but one"
        )
    elif plugins:
        method_spec = _load_entry_point(plugins[0])
    else:
        raise unknown_choice(
            "method", name, method_names(), "(or package.module:ATTR naming a petlprof.MethodSpec, or peft:TYPE)"
        )
    _PLUGINS[name] = method_spec
    return method_spec


def is_peft_tuner(name: str) -> bool:
    """Whether ``name`` is ``peft:TYPE``: one of PEFT's tuners (known or not), never a plug-in's reference."""
    return isinstance(name, str) and name.startswith(PEFT_PREFIX)


def _distribution(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown distribution"


def _entry_label(ep: metadata.EntryPoint) -> str:
    return f"plug-in method '{ep.name}' (entry point '{ep.name} = {ep.value}' of distribution {_distribution(ep)})"


def _reference_label(reference: str) -> str:
    top = reference.split(":")[0].split(".")[0]
    dists = metadata.packages_distributions().get(top, [])
    where = f"distribution {', '.join(dists)}" if dists else "not from an installed distribution"
    return f"plug-in method '{reference}' ({where})"


class _Broken(Exception):
    """What is wrong with a plug-in; the caller says which plug-in (naming a module's distribution is slow)."""


def _load_entry_point(ep: metadata.EntryPoint) -> MethodSpec:
    try:
        if not REFERENCE.fullmatch(ep.value):
            raise _Broken("malformed entry point: its value must be module:ATTR naming a MethodSpec")
        method_spec = _import_method_spec(ep.value)
        if method_spec.name != ep.name:
            raise _Broken(f"malformed spec: it is named '{method_spec.name}'; the entry point must use the same name")
    except _Broken as exc:
        raise UsageError(f"{_entry_label(ep)}: {exc}") from None
    return method_spec


def _load_reference(reference: str) -> MethodSpec:
    if not REFERENCE.fullmatch(reference):
        raise UsageError(f"method '{reference}' is neither a method name nor package.module:ATTR (see `petlprof list`)")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:  # a module in the current folder, as `python -m` finds it
        sys.path.append(cwd)
    try:
        method_spec = _import_method_spec(reference)
        if is_peft_tuner(method_spec.name):
            raise _Broken(
                f"its name '{method_spec.name}' starts with '{PEFT_PREFIX}', which names PEFT's tuners; rename it"
            )
        if method_spec.name in BUILTIN_METHODS and _builtin(method_spec.name) is not method_spec:
            raise _Broken(
                f"its name '{method_spec.name}' clashes with the built-in method '{method_spec.name}'; rename it"
            )
        for ep in _entry_points().get(method_spec.name, []):
            if ep.value != reference:
                raise _Broken(f"its name '{method_spec.name}' clashes with the installed {_entry_label(ep)}")
    except _Broken as exc:
        raise UsageError(f"{_reference_label(reference)}: {exc}") from None
    return method_spec


def _import_method_spec(reference: str) -> MethodSpec:
    """The MethodSpec ``module:ATTR`` names, or :class:`_Broken` saying why not, in one line."""
    module_name, _, attr = reference.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except MethodSpecError as exc:  # the module made a malformed spec
        raise _Broken(f"malformed spec: {exc}") from None
    except Exception as exc:  # any error of a third-party import is the plug-in's, said in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise _Broken(
            f"import of '{module_name}' failed: {type(exc).__name__}: {first} "
            f"(see it in full: python -c 'import {module_name}')"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _Broken(f"malformed spec: module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not isinstance(obj, MethodSpec):
        raise _Broken(f"malformed spec: '{attr}' is a {type(obj).__name__}, not a petlprof.MethodSpec")
    return obj


def methods_by_name(methods: list[str]) -> dict[str, str]:
    """Each method's name (its MethodSpec's) -> what ``--methods`` called it (a name or ``module:ATTR``): the name
    ``--method-config``/``--method-grid`` address it by.  One method given twice under two names is refused."""
    out: dict[str, str] = {}
    for given in dict.fromkeys(methods):
        name = get_method(given).name
        if name in out:
            raise UsageError(f"--methods names method '{name}' twice ({out[name]} and {given}); give it once")
        out[name] = given
    return out


def config_field_help(config_cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help with the allowed values) for each field of a method config dataclass."""
    out = []
    for f in dataclasses.fields(config_cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        check = field_check(f)
        allowed = f"; {check.allowed()}" if check is not None else ""
        out.append((f.name, default, f.metadata.get("help", "") + allowed))
    return out


__all__ = [
    "BUILTIN_METHODS",
    "ENTRY_POINT_GROUP",
    "MethodSpec",
    "UsageError",
    "builtin_method_names",
    "config_field_help",
    "get_method",
    "is_peft_tuner",
    "method_names",
    "methods_by_name",
    "peft_unsupported_reason",
    "read_peft_config_file",
]
