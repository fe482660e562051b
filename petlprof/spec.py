"""A run's specification: everything that defines one run, and the part of it that is the run's identity.

``RunSpec``'s fields are not written here: each comes from the option that fills it in
:class:`petlprof.options.RunOptions` (its ``spec=ToSpec(...)``: the field's name, default and when it is
part of the run key), so an option and its field cannot drift apart.  :func:`spec_identity` decides which
fields enter a run's key from the same declarations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from petlprof.options import ALWAYS, NEVER, OPTIONS, OWN, WHEN_CHANGED, WHEN_SET, ToSpec, default_of


def spec_fields() -> dict[str, tuple[str, ToSpec]]:
    """RunSpec field name -> (the option that fills it, how), in the options' order."""
    return {
        (f.metadata["spec"].name or name): (name, f.metadata["spec"])
        for name, f in OPTIONS.items()
        if f.metadata["spec"]
    }


def spec_default(option: str, to: ToSpec) -> Any:
    return default_of(option) if to.default is OWN else to.default


def _field(option: str, to: ToSpec) -> tuple[str, Any, Any]:
    default = spec_default(option, to)
    kind = to.type or OPTIONS[option].type
    if isinstance(default, (list, dict)):
        return to.name or option, kind, dataclasses.field(default_factory=type(default))
    if default is dataclasses.MISSING:
        return to.name or option, kind, dataclasses.field()
    return to.name or option, kind, dataclasses.field(default=default)


class _SpecMethods:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self, include_seed: bool = True) -> dict[str, Any]:
        return spec_identity(self.to_dict(), include_seed)

    @property
    def run_key(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


RunSpec = dataclasses.make_dataclass(
    "RunSpec", [_field(option, to) for option, to in spec_fields().values()], bases=(_SpecMethods,)
)
RunSpec.__module__ = __name__
RunSpec.__doc__ = """Everything that defines one run; its JSON form is the run's identity (``run_key``).
Fields (see petlprof.options.RunOptions for each one's meaning): """ + ", ".join(spec_fields())

BUDGET_FIELDS = tuple(
    name
    for name, (option, _) in spec_fields().items()
    if option in ("target_value", "target_metric", "eval_every", "target_eval_size", "max_train_time")
)


def spec_identity(spec: dict[str, Any], include_seed: bool = True) -> dict[str, Any]:
    """What defines a run (its ``run_key``), from a spec's dict (a record's, of any version); without
    the seed it names the configuration a report averages over seeds.  Each field enters as its option
    declares: always, never, when set, when changed from its default, or when a test of the spec holds."""
    identity = dict(spec)
    for name, (option, to) in spec_fields().items():
        rule = to.identity
        if rule == ALWAYS:
            keep = True
        elif rule == NEVER:
            keep = False
        elif rule == WHEN_SET:
            keep = spec.get(name) is not None
        elif rule == WHEN_CHANGED:
            keep = spec.get(name, spec_default(option, to)) != spec_default(option, to)
        else:
            keep = rule(spec)
        if not keep:
            identity.pop(name, None)
    if not include_seed:
        identity.pop("seed", None)
    return identity
