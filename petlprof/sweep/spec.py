"""A run's specification: everything that defines one run, and the part of it that is the run's identity.

Each of ``RunSpec``'s fields comes from the option that fills it in :class:`petlprof.sweep.options.RunOptions`
(its ``spec=ToSpec(...)``: the field's name, type, default and when it is part of the run key).  The fields
are written out in ``RunSpec`` so that type checkers and editors see them, but they are not declared there:
the block between the ``BEGIN``/``END`` lines is generated from the options (``python -m petlprof.sweep.spec``
rewrites it), and tests/test_spec.py fails when the block and the options differ.  :func:`spec_identity`
decides which fields enter a run's key from the same declarations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from petlprof.sweep.options import (
    ALWAYS,
    NEVER,
    OPTIONS,
    OWN,
    TRAINING_SETTINGS,
    WHEN_CHANGED,
    WHEN_SET,
    ToSpec,
    default_of,
)
from petlprof.values import flag


def spec_fields() -> dict[str, tuple[str, ToSpec]]:
    """RunSpec field name -> (the option that fills it, how), in the options' order."""
    return {
        (f.metadata["spec"].name or name): (name, f.metadata["spec"])
        for name, f in OPTIONS.items()
        if f.metadata["spec"]
    }


def spec_default(option: str, to: ToSpec) -> Any:
    return default_of(option) if to.default is OWN else to.default


def spec_type(option: str, to: ToSpec) -> str:
    """The field's annotation, as source text: the ``ToSpec``'s type, else the option's; a field whose default
    is None (its option not copied) can hold None."""
    kind = to.type or OPTIONS[option].type  # the options' annotations are text (postponed evaluation)
    text = kind if isinstance(kind, str) else kind.__name__ if isinstance(kind, type) else str(kind)
    text = text.replace("typing.", "")
    if spec_default(option, to) is None and "None" not in text.split(" | "):
        text += " | None"
    return text


def declared_fields() -> list[tuple[str, str, Any]]:
    """RunSpec's fields as the options declare them: ``dataclasses.make_dataclass``'s (name, type, field)."""
    fields = []
    for name, (option, to) in spec_fields().items():
        default = spec_default(option, to)
        if isinstance(default, (list, dict)):
            field = dataclasses.field(default_factory=type(default))
        elif default is dataclasses.MISSING:
            field = dataclasses.field()
        else:
            field = dataclasses.field(default=default)
        fields.append((name, spec_type(option, to), field))
    return fields


BEGIN = "    # BEGIN generated from petlprof.sweep.options.RunOptions by `python -m petlprof.sweep.spec`: do not edit"
END = "    # END generated"


def spec_fields_source() -> str:
    """The lines of RunSpec's fields (between ``BEGIN`` and ``END``), one per field, from the declarations."""
    options = {name: option for name, (option, _) in spec_fields().items()}
    lines = []
    for name, kind, field in declared_fields():
        if field.default_factory is not dataclasses.MISSING:
            default = f" = dataclasses.field(default_factory={field.default_factory.__name__})"
        elif field.default is not dataclasses.MISSING:
            default = f" = {json.dumps(field.default) if isinstance(field.default, str) else repr(field.default)}"
        else:
            default = ""
        source = "" if options[name] == name else f"  # {flag(options[name])}"
        lines.append(f"    {name}: {kind}{default}{source}")
    return "\n".join([BEGIN, *lines, END])


def written_fields_source(text: str) -> str:
    """The generated block as written in spec.py's ``text``, marker lines included ("" without them)."""
    lines = text.split("\n")
    if BEGIN not in lines or END not in lines[lines.index(BEGIN) :]:
        return ""
    start = lines.index(BEGIN)
    return "\n".join(lines[start : lines.index(END, start) + 1])


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run; its JSON form is the run's identity (``run_key``).  Each field's
    meaning is its option's (petlprof.sweep.options.RunOptions; the comment names the option where the names
    differ).  Frozen: a spec changed after it was made (a rank's device) is a new one, ``dataclasses.replace``-d."""

    # BEGIN generated from petlprof.sweep.options.RunOptions by `python -m petlprof.sweep.spec`: do not edit
    method: str  # --methods
    backbone: str = "minilm"
    num_layers: int | None = None
    random_init: bool = False
    task: str = "tweets"
    data_dir: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    objective: str = "auto"
    prompt_column: str | None = None
    target_column: str | None = None
    chat_template: str = "auto"
    max_new_tokens: int | None = None
    seed: int = 0  # --seeds
    epochs: int = 1
    max_steps: int | None = None
    train_size: int | None = 2000
    eval_size: int | None = 1000
    batch_size: int = 32
    lr: float | None = None
    max_length: int = 64
    warmup_steps: int = 2
    precision: str = "fp32"
    weights_dtype: str = "float32"
    gradient_checkpointing: bool = False
    gradient_accumulation: int = 1
    optimizer: str = "adamw"
    quantize: str = "none"
    quantize_compute_dtype: str = "float32"
    quantize_double: bool = False
    method_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    device: str = "cpu"
    energy_meter: str = "auto"
    power_limit_w: float | None = None  # --power-limit
    settle: bool = False
    cache_dir: str | None = None  # --output
    nproc: int = 1  # --nproc-per-run
    cache_hidden_states: bool = False
    cache_budget_bytes: int | None = None  # --cache-budget
    cache_dtype: str = "float16"
    train_only: bool = False
    tune: list[str] = dataclasses.field(default_factory=list)
    tune_points: int | None = None
    target_value: float | None = None
    target_metric: str | None = None
    eval_every: int | None = None
    target_eval_size: int | None = None
    val_size: int | None = None
    val_file: str | None = None
    max_train_time_s: float | None = None  # --max-train-time
    extra_meters: list[str] = dataclasses.field(default_factory=list)  # --meters
    country_code: str | None = None
    memory_snapshot_dir: str | None = None  # --memory-snapshot
    inference_window_s: float | None = None
    # END generated

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self, include_seed: bool = True) -> dict[str, Any]:
        return spec_identity(self.to_dict(), include_seed)

    @property
    def run_key(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def config_key(self) -> str:
        """The run key without the seed: what the seeds of one configuration share."""
        canonical = json.dumps(self.identity(include_seed=False), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


BUDGET_FIELDS = tuple(
    name
    for name, (option, _) in spec_fields().items()
    if option
    in ("target_value", "target_metric", "eval_every", "target_eval_size", "val_size", "val_file", "max_train_time")
)
# what a run that trains nothing (the zero-shot row) leaves at its defaults: its budget and any search
# the training settings of real jobs (petlprof.run.recipe) that act on training alone
TRAINING_ONLY_FIELDS = tuple(name for name in TRAINING_SETTINGS if name != "weights_dtype")  # inference keeps it
UNTRAINED_DEFAULTS = (*BUDGET_FIELDS, "tune", "tune_points", *TRAINING_ONLY_FIELDS)


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
        elif callable(rule):
            keep = rule(spec)
        else:
            raise ValueError(f"RunSpec field {name}: unknown identity rule {rule!r}")
        if not keep:
            identity.pop(name, None)
    if not include_seed:
        identity.pop("seed", None)
    return identity


def write_fields(path: Path = Path(__file__)) -> bool:
    """Rewrite RunSpec's generated block in ``path`` from the declarations; whether it changed."""
    text = path.read_text()
    written = written_fields_source(text)
    if not written:
        raise SystemExit(f"{path}: no {BEGIN.strip()!r} ... {END.strip()!r} block in RunSpec")
    new = text.replace(f"\n{written}\n", f"\n{spec_fields_source()}\n")
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    changed = write_fields()
    print(f"{Path(__file__).name}: RunSpec's fields {'rewritten' if changed else 'already match the options'}")
    sys.exit(0)
