"""PEFT's own ``adapter_config.json`` as a method config: ``--method-config-file FILE``.

:func:`read_adapter_config` reads what PEFT's ``save_pretrained`` wrote: its ``peft_type`` picks the tuner
(``peft:TYPE``, :mod:`petlprof.methods.peft_tuners`) and its fields become that method's config, checked as
fields given on the command line are.  The fields petlprof decides itself (PEFT's bookkeeping, the model's
name, a prompt's shape: :mod:`petlprof.methods.peft_fields`) are left to it with a note; a nested initialisation
scheme set to anything but its default, or a field the installed PEFT does not have, is refused with the reason.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.method_api import PEFT_PREFIX
from petlprof.methods.peft_fields import BASE_FIELDS, DERIVED, excluded_fields, peft_default, plain
from petlprof.methods.peft_tuners import ALIASES, Tuner, TunerSpec, first_line, peft_types, peft_version, tuner_spec
from petlprof.values import check_file

QUIET = {"peft_type", "peft_version", "inference_mode"}  # fields of every saved file, taken or left without a note


def read_adapter_config(path: str) -> tuple[str, dict[str, Any], list[str]]:
    """(method name ``peft:TYPE``, its method config, notes on the fields left to petlprof) from the
    ``adapter_config.json`` PEFT's ``save_pretrained`` wrote (the file, or the folder holding it)."""
    data, where = _load_json(path)
    peft_type = data.get("peft_type")
    names = {t: n for n, t in peft_types().items() if n.removeprefix(PEFT_PREFIX) not in ALIASES}
    if not isinstance(peft_type, str) or peft_type not in names:
        raise UsageError(f"{where}: {unknown_choice('peft_type', str(peft_type), names, f'(PEFT {peft_version()})')}")
    method_spec = tuner_spec(names[peft_type])
    fields, notes = _file_fields(method_spec, data, where)
    try:
        method_spec.make_config(fields)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return method_spec.name, fields, notes


def _load_json(path: str) -> tuple[dict[str, Any], str]:
    file = Path(path)
    check_file(file, "--method-config-file", folder=True)
    if file.is_dir():
        file = file / "adapter_config.json"
        check_file(file, "--method-config-file")
    if not file.is_file():
        raise UsageError(f"--method-config-file '{shown(str(file), quote=False)}' does not exist")
    try:
        data = json.loads(file.read_text(encoding="utf-8-sig"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError; RecursionError: deep nesting
        raise UsageError(f"--method-config-file '{file}' is not JSON: {first_line(exc)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--method-config-file '{file}' must hold PEFT's table of fields, not {type(data).__name__}")
    return data, str(file)


def _file_fields(method_spec: TunerSpec, data: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """The method config a file's fields give, and a note per field petlprof decides itself; a field set to
    what a run cannot honour (a nested initialisation scheme) is refused, naming it and why."""
    peft_cls = Tuner(method_spec.name, method_spec.peft_type).peft_cls
    excluded = excluded_fields(peft_cls)
    defaults = {f.name: peft_default(f) for f in dataclasses.fields(peft_cls)}
    names = [f.name for f in dataclasses.fields(method_spec.config_cls)]
    fields, notes = {}, []
    for key, value in data.items():
        if key in excluded:
            unset = value in (None, {}, [], defaults.get(key))
            if not unset and key not in BASE_FIELDS and key not in DERIVED:
                raise UsageError(f"{where}: {key}={shown(value)} cannot be run by petlprof: {excluded[key]}")
            if not unset and key not in QUIET:
                notes.append(f"{where}: {key}={shown(value)} left to petlprof: {excluded[key]}")
            continue
        if key not in names:
            unknown = unknown_choice(f"field of {peft_cls.__name__}", key, names, f"(PEFT {peft_version()})")
            raise UsageError(f"{where}: {unknown}")
        fields[key] = sorted(value) if key in ("target_modules", "modules_to_save") and _names(value) else plain(value)
    return fields, notes


def _names(value: Any) -> bool:
    """A list of module names (PEFT keeps them as a set, so their order in the file means nothing)."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
