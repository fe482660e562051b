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

The lookup is :data:`METHODS`, a :class:`petlprof.lookup.Registry` (the one class every named kind uses), with
``peft:TYPE`` answered before it.  The registry stands below the methods, with the contract
(:mod:`petlprof.method_api`): no method registers itself, and nothing here imports ``petlprof.methods`` by an
import statement; the tables below name what it loads from there, the way an entry point names a plug-in.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from petlprof.errors import UsageError
from petlprof.lookup import Registry
from petlprof.method_api import PEFT_PREFIX, MethodSpec, MethodSpecError, field_check, resolve_target

ENTRY_POINT_GROUP = "petlprof.methods"

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


def _peft_prefixed(method_spec: MethodSpec) -> str | None:
    """A ``module:ATTR`` plug-in may not take a name of PEFT's tuners (``peft:TYPE`` never reaches a plug-in)."""
    if not is_peft_tuner(method_spec.name):
        return None
    return f"its name '{method_spec.name}' starts with '{PEFT_PREFIX}', which names PEFT's tuners; rename it"


METHODS: Registry[MethodSpec] = Registry(
    "method",
    lazy=BUILTIN_METHODS,
    group=ENTRY_POINT_GROUP,
    references=True,
    instance_of=MethodSpec,
    kind_label="petlprof.MethodSpec",
    named=True,
    entry_word="spec",
    malformed_errors=(MethodSpecError,),
    check_plugin=_peft_prefixed,
    hint="(or package.module:ATTR naming a petlprof.MethodSpec, or peft:TYPE)",
)


def peft_unsupported_reason(name: str, backbone: Any, method_config: dict[str, Any] | None = None) -> str | None:
    """One line on why PEFT tuner ``name`` (``peft:TYPE``) cannot adapt ``backbone`` with ``method_config``, or None."""
    return resolve_target(PEFT_TUNERS["unsupported"])(name, backbone, method_config)


def read_peft_config_file(path: str) -> tuple[str, dict[str, Any], list[str]]:
    """A PEFT ``adapter_config.json``: (its tuner ``peft:TYPE``, the fields petlprof takes, notes on the rest)."""
    return resolve_target(PEFT_TUNERS["config_file"])(path)


def builtin_method_names() -> list[str]:
    """The methods that ship with petlprof (not loaded: see :func:`get_method`)."""
    return sorted(METHODS.builtin_names())


def method_names() -> list[str]:
    """Built-in methods and installed plug-ins (not loaded: see :func:`get_method`)."""
    return sorted(METHODS.names())


def get_method(name: str) -> MethodSpec:
    """The MethodSpec of a built-in method, an installed plug-in, a ``module:ATTR`` reference or ``peft:TYPE``."""
    if is_peft_tuner(name):
        return _peft_method(name)
    return METHODS.get(name)


@functools.cache
def _peft_method(name: str) -> MethodSpec:
    return resolve_target(PEFT_TUNERS["method_spec"])(name)


def is_peft_tuner(name: str) -> bool:
    """Whether ``name`` is ``peft:TYPE``: one of PEFT's tuners (known or not), never a plug-in's reference."""
    return isinstance(name, str) and name.startswith(PEFT_PREFIX)


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
    "METHODS",
    "builtin_method_names",
    "config_field_help",
    "get_method",
    "is_peft_tuner",
    "method_names",
    "methods_by_name",
    "peft_unsupported_reason",
    "read_peft_config_file",
]
