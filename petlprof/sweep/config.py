"""Run options from the command line and from a TOML/YAML file, validated and expanded into runs.

The options themselves are declared in :mod:`petlprof.sweep.options`; this module reads them (precedence:
built-in defaults < ``--config FILE`` < options given on the command line), checks them all in one place
(:func:`validate`: each option's own range, then the relations between options; :func:`preflight`: what
needs the data and the backbones) before any process starts or any file is written, and expands them
into one :class:`~petlprof.sweep.spec.RunSpec` per run.  A bad value is one :class:`~petlprof.errors.UsageError`
line naming it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib.util
import itertools
import re
import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, TypedDict

import yaml

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.meters import check_energy_meter
from petlprof.meters.devices.nvml import availability as nvml_availability
from petlprof.meters.power_limit import check_power_limits
from petlprof.method_api import check_backbone, check_objective, check_quantize
from petlprof.models import quantization
from petlprof.models.backbones import (
    backbone_config,
    check_random_init,
    check_shape,
    check_weights,
    is_tiny_preset,
    model_class,
)
from petlprof.models.families import check_gradient_checkpointing
from petlprof.models.quantization import run_fields as quantize_fields
from petlprof.registry import (
    get_method,
    is_peft_tuner,
    method_names,
    methods_by_name,
    peft_unsupported_reason,
    read_peft_config_file,
)
from petlprof.sweep.lengths import PeakEstimate, check_lm_lengths
from petlprof.sweep.options import (
    OPTIONS,
    RunOptions,
    default_of,
    kind_of,
    knob_target,
    resolved_eval_every,
    resolved_val_size,
)
from petlprof.sweep.resources import check_resources, optimiser_steps
from petlprof.sweep.spec import UNTRAINED_DEFAULTS, RunSpec, spec_default, spec_fields
from petlprof.tasks.labelled import generative_possible, load_task
from petlprof.tasks.metrics import check_target
from petlprof.values import check_file, flag, parse_watts
from petlprof.vocabulary import ADAMW, AUTO, CLASSIFICATION, FLOAT32, FP32, LM, LR, RAY, ZERO_SHOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_YAML_12_FLOAT = re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


def _yaml_loader():
    """PyYAML's safe loader, with two changes: a number written ``1e-3`` (YAML 1.2; YAML 1.1 wants
    ``1.0e-3``) is a number, not text, and a key given twice in one table is an error, as in TOML."""

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {shown(key)}", key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML_12_FLOAT, list("-+0123456789"))
    return Loader


def yaml_value(text: str) -> Any:
    """One YAML value as config files read it (``1e3`` is a number; a duplicate key is an error)."""
    return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass: no Python objects


def load_config_file(path: str) -> dict[str, Any]:
    """Options from a ``.toml``, ``.yaml`` or ``.yml`` file (same names as the CLI, with underscores)."""
    file = Path(path)
    check_file(file, "config file")
    if not file.is_file():
        raise UsageError(f"config file '{shown(path, quote=False)}' does not exist")
    suffix = file.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(file.read_text(encoding="utf-8-sig"))
        elif suffix in (".yaml", ".yml"):
            data = yaml_value(file.read_text(encoding="utf-8-sig")) or {}
        else:
            raise UsageError(f"config file '{path}' must end in .toml, .yaml or .yml, not '{shown(suffix, False)}'")
    except UsageError:
        raise
    except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError
        detail = " ".join(str(exc).split())
        raise UsageError(f"config file '{path}' is malformed: {shown(detail, quote=False)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file '{path}' must hold a table of options, not {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise UsageError(
                f"config file '{path}': option name {shown(key)} is not text; options are named, e.g. "
                "methods, seeds, train_size"
            )
    data = _one_spelling(data, path)
    for key in data:
        if key not in OPTIONS:
            raise unknown_choice(f"option in '{path}'", key, OPTIONS)
    return data


def _one_spelling(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The file's options under their underscore names; an option given under two spellings
    (``train-size`` and ``train_size``) is refused, as a key given twice is."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in spelled:
            raise UsageError(
                f"config file '{path}' gives option {name} twice, as {shown(spelled[name])} and {shown(key)}; keep one"
            )
        spelled[name], out[name] = key, value
    return out


def parse_method_overrides(
    items: list[str], option: str = "--method-config", example: str = "METHOD.FIELD=VALUE, e.g. lora.r=16"
) -> dict[str, dict[str, Any]]:
    """``["lora.r=4", "read.cell=lstm"]`` -> ``{"lora": {"r": 4}, "read": {"cell": "lstm"}}``; values are
    read as YAML, so ``lora.alpha=1e3`` is the number 1000.0."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        method, dot, name = key.partition(".")
        if not (sep and dot and method and name):
            raise UsageError(f"{option} {shown(item)} must look like {example}")
        if option == "--method-grid" and not text.strip().startswith("["):
            text = f"[{text}]"  # 2,8,32 is the list [2, 8, 32]
        try:
            out.setdefault(method, {})[name] = yaml_value(text)
        except yaml.YAMLError as exc:
            detail = shown(" ".join(str(exc).split()), quote=False)
            raise UsageError(f"{option} {shown(item)}: the value is not valid: {detail}") from None
    return out


def parse_method_grids(items: list[str]) -> dict[str, dict[str, list]]:
    """``["lora.r=2,8,32", "read.cell=[gru,lstm]"]``
    -> ``{"lora": {"r": [2, 8, 32]}, "read": {"cell": ["gru", "lstm"]}}``."""
    grids: dict[str, dict[str, list]] = {}
    parsed = parse_method_overrides(items, "--method-grid", "METHOD.FIELD=V1,V2,..., e.g. lora.r=4,16,64")
    for method, fields in parsed.items():
        for name, values in fields.items():
            grids.setdefault(method, {})[name] = values if isinstance(values, list) else [values]
    return grids


def _merge_tables(file_values: dict[str, Any], cli_values: dict[str, Any], name: str) -> dict | None:
    """A table option (method_config, method_grid) of the file, with the command line's fields laid over it."""
    given = cli_values.get(name)
    if not given:
        return None
    if not isinstance(given, dict):  # a Python caller's value (run_sweep): refused by the option's own check
        return given
    file_table = file_values.get(name) or {}
    merged = dict(file_table) if isinstance(file_table, dict) else {}
    for method, fields in given.items():
        known = merged.get(method, {})
        if isinstance(known, dict) and isinstance(fields, dict):
            merged[method] = {**known, **fields}
        elif isinstance(known, dict):  # a "table" that is not one is kept, for its check to refuse (validate)
            merged[method] = fields
    return merged


def build_options(file_values: dict[str, Any], cli_values: dict[str, Any]) -> RunOptions:
    """The options of a file and a command line (given ones: not None), each read as its kind reads it
    (``"1e-3"`` is a number where a number is expected, ``all`` a size of None), then :func:`validate`-d."""
    values = {**file_values, **{k: v for k, v in cli_values.items() if v is not None}}
    for name in ("method_config", "method_grid"):
        merged = _merge_tables(file_values, cli_values, name)
        if merged is not None:
            values[name] = merged
    for name in values:
        if name not in OPTIONS:
            raise unknown_choice("option", name, OPTIONS)
        values[name] = kind_of(name).read(values[name])
    if values.get("method_config_file"):
        kind_of("method_config_file").check("method_config_file", values["method_config_file"])
        _with_method_config_files(values)
    options = RunOptions(**values)
    validate(options, given=set(values))
    options.methods = list(dict.fromkeys(options.methods))  # a method named twice runs once
    return options


def _with_method_config_files(values: dict[str, Any]) -> None:
    """Each ``--method-config-file``'s method (``peft:TYPE``, from the file's ``peft_type``) added to the methods
    unless named there, with the file's fields as its method config under any ``--method-config`` fields."""
    methods, tables = values.get("methods") or [], values.get("method_config") or {}
    seen: dict[str, str] = {}  # tuner -> the file that gave it
    if not (isinstance(methods, list) and isinstance(tables, dict)):
        return  # refused by their own checks (validate)
    methods, tables = list(methods), dict(tables)
    for path in values["method_config_file"]:
        name, fields, _ = read_peft_config_file(path)
        if name in seen:
            raise UsageError(
                f"--method-config-file gives {name} twice ({seen[name]} and {path}); give one file per tuner, and "
                f"sweep a field with --method-grid {name}.FIELD=V1,V2"
            )
        seen[name] = path
        methods += [] if name in methods else [name]
        given = tables.get(name, {})
        tables[name] = {**fields, **given} if isinstance(given, dict) else given  # a bad table: refused as usual
    values["methods"], values["method_config"] = methods, tables


def validate_quantize(options) -> None:
    """The checks of ``--quantize`` and its settings that need no model (:func:`validate`; ``petlprof estimate`` too):
    a value at all, bitsandbytes installed, the 4-bit settings only with a 4-bit value, and every method of
    the sweep declaring that it runs on such a backbone (:func:`petlprof.method_api.check_quantize`)."""
    if not options.quantize:
        raise UsageError("no quantization given (an empty --quantize): give at least one, e.g. --quantize none")
    for method in options.quantize:
        quantization.check_available(method)
    if not any(q in quantization.FOUR_BIT for q in options.quantize):
        changed = [
            flag
            for flag, is_set in (
                ("--quantize-compute-dtype", options.quantize_compute_dtype != quantization.DEFAULT_COMPUTE_DTYPE),
                ("--quantize-double", options.quantize_double),
            )
            if is_set
        ]
        if changed:
            raise UsageError(
                f"{changed[0]} acts only with a 4-bit --quantize ({' or '.join(quantization.FOUR_BIT)}); "
                f"the sweep's is {','.join(options.quantize)}"
            )
    for name in options.methods:
        for method in options.quantize:
            check_quantize(get_method(name), method)


def validate_training_settings(options) -> None:
    """The checks of the training settings (``--weights-dtype``, ``--gradient-checkpointing``, ``--optimizer``) that
    need no model (:func:`validate`; ``petlprof estimate`` too), each refusal one line: half-precision weights
    neither under ``--precision`` nor with ``--quantize``, gradient checkpointing only for methods that
    back-propagate through the backbone, an 8-bit optimiser only with bitsandbytes installed.  A backbone whose
    architecture has no gradient checkpointing is refused by the preflight's model check."""
    if options.weights_dtype != FLOAT32:
        if options.precision != FP32:
            raise UsageError(
                f"--weights-dtype {options.weights_dtype} with --precision {options.precision}: half-precision weights "
                "compute in their own dtype; --precision autocasts float32 weights. Give one of them"
            )
        quantized = [q for q in options.quantize if q != quantization.NONE]
        if quantized:
            raise UsageError(
                f"--weights-dtype {options.weights_dtype} with --quantize {quantized[0]}: a quantised backbone's "
                "weights are packed integers; its float parts follow --quantize-compute-dtype. Give one of them"
            )
    if options.optimizer != ADAMW and importlib.util.find_spec("bitsandbytes") is None:
        raise UsageError(
            f"--optimizer {options.optimizer} needs bitsandbytes, which is not installed: {quantization.INSTALL}"
        )
    if options.gradient_checkpointing:
        for name in options.methods:
            method = get_method(name)
            if method.side_tuning or method.name == ZERO_SHOT:
                why = "trains nothing" if method.name == ZERO_SHOT else "never back-propagates through the backbone"
                raise UsageError(
                    f"--gradient-checkpointing: method '{method.name}' ({method.description}) {why}, so the backbone "
                    "keeps no activations for backward to recompute; run it without the option"
                )


def validate(options: RunOptions, given: AbstractSet[str] = frozenset()) -> None:
    """Every check of the options that needs no data or model: first each option's own kind and range
    (declared with it), then the relations between options; ``given``: the options a file or the command
    line set (an option that acts only with another is refused when given, even at its default value)."""
    for name in OPTIONS:
        kind_of(name).check(name, getattr(options, name))
    _validate_methods(options)
    validate_quantize(options)
    validate_training_settings(options)
    _validate_relations(options, given)
    _validate_executor(options)


def _validate_methods(options: RunOptions) -> None:
    if not options.methods:
        raise UsageError("no method given: use --methods, e.g. --methods read,lora (see `petlprof list`)")
    for name, example in (("seeds", "--seeds 0,1"), ("backbone", "--backbone minilm"), ("task", "--task tweets")):
        if not getattr(options, name):
            raise UsageError(f"no {name.rstrip('s')} given (an empty --{name}): give at least one, e.g. {example}")
    named = methods_by_name(options.methods)  # a plug-in given as module:ATTR is addressed by its spec's name
    for name, fields in options.method_config.items():
        if not isinstance(fields, dict):
            raise UsageError(f"method_config.{shown(name, False)} must be a table of fields, got {shown(fields)}")
        if name not in named:
            raise unknown_choice("method in method_config", name, named)
        get_method(named[name]).make_config(fields)
    for name, fields in options.method_grid.items():
        if name not in named:
            raise unknown_choice("method in method_grid", name, named)
        if not isinstance(fields, dict) or not fields:
            raise UsageError(f"method_grid.{name} must be a table of FIELD = [values], got {shown(fields)}")
        for key, values in fields.items():
            if not isinstance(values, list) or not values:
                raise UsageError(f"method_grid.{name}.{key} must be a non-empty list of values, got {shown(values)}")
    for method in options.methods:
        for point in grid_points(options, method):
            get_method(method).make_config(point)
    _validate_tuned_knobs(options, named)


def _validate_tuned_knobs(options: RunOptions, named: Mapping[str, str]) -> None:
    """A ``--tune METHOD.KNOB`` names a method of the sweep whose knob nothing else sets."""
    for target in options.tune:
        if target == LR:
            continue
        name, knob = target.split(".", 1)
        if name not in named:
            knobs = [t for t in (knob_target(get_method(m)) for m in named.values()) if t]
            raise UsageError(
                f"--tune {target}: {name} is not among --methods {','.join(options.methods)} (their knobs: "
                f"{', '.join(knobs) or 'none'}; or lr)"
            )
        if (own := knob_target(get_method(named[name]))) != target:  # a module:ATTR plug-in's, checked only here
            raise UsageError(
                f"unknown --tune target {target!r}: {name}'s Pareto knob is "
                + (f"searched as {own}" if own else "not declared (the method has no pareto_knob and default_grid)")
            )
        setters = [
            what
            for what, given in (
                (f"--method-config {target}=...", knob in options.method_config.get(name, {})),
                (f"--method-grid {target}=...", knob in options.method_grid.get(name, {})),
                ("--grid", options.grid),
            )
            if given
        ]
        if setters:
            raise UsageError(f"--tune {target} searches {knob} itself; it cannot be given with {setters[0]} as well")


def _given(value: Any) -> bool:
    """Whether an option's value gives it: not None, False or an empty list (a target of 0 is given)."""
    return value is not None and value is not False and value != [] and value != {}


def _validate_relations(options: RunOptions, given: AbstractSet[str]) -> None:
    """Options that act only with another (declared ``only_with``), and the other pairs that cannot go together."""
    for name, f in OPTIONS.items():
        needed = f.metadata["only_with"]
        needed = (needed,) if isinstance(needed, str) else needed or ()
        if not needed or any(_given(getattr(options, other)) for other in needed):
            continue
        if name in given or getattr(options, name) != default_of(name):
            alternatives = " or ".join(flag(other) for other in needed)
            raise UsageError(
                f"{flag(name)} acts only with {alternatives}, which {'was' if len(needed) == 1 else 'were'} not given"
            )
    if options.train_only and options.eval_every is None:
        raise UsageError("--train-only scores nothing but the validation checks: give --eval-every N with it")
    if options.target_metric is not None and options.target_value is None:
        raise UsageError(f"--target-metric {options.target_metric} needs --target-value")
    if options.cache_hidden_states and not any(get_method(m).side_tuning for m in options.methods):
        side = sorted(name for name in method_names() if get_method(name).side_tuning)
        raise UsageError(
            f"--cache-hidden-states serves side-tuning methods ({', '.join(side)}); none of "
            f"--methods {','.join(options.methods)} is one"
        )
    if options.in_process and (options.timeout is not None or options.max_memory is not None):
        raise UsageError("--timeout and --max-memory act on a run's own process; they cannot be used with --in-process")
    if options.country_code is not None and "codecarbon" not in options.meters:
        raise UsageError("--country-code sets codecarbon's carbon intensity; add --meters codecarbon")
    for backbone in options.backbone:  # a bundled shape or a config file has no weights to load
        check_weights(backbone, options.random_init)


def _validate_executor(options: RunOptions) -> None:
    if options.executor != RAY:
        for name, f in OPTIONS.items():
            if f.metadata["ray_only"] and getattr(options, name) != default_of(name):
                raise UsageError(
                    f"{flag(name)} applies to --executor ray; the runs execute on this machine ('{options.executor}')"
                )
    if options.in_process and options.executor == RAY:
        raise UsageError(
            "--in-process runs everything in the sweep's own process; it cannot be combined with --executor ray"
        )
    if options.cache_hidden_states and options.nproc_per_run > 1:
        raise UsageError(
            f"--cache-hidden-states cannot be used with --nproc-per-run {options.nproc_per_run}: a cached "
            "step runs the side network outside DistributedDataParallel, so its gradients would not be "
            "averaged over the ranks"
        )
    if options.in_process and options.nproc_per_run > 1:
        raise UsageError(
            f"--nproc-per-run {options.nproc_per_run} starts one process per rank; it cannot be "
            "combined with --in-process"
        )


def grid_points(options: RunOptions, method: str) -> list[dict[str, Any]]:
    """The method-config overrides one method runs with: its explicit grid (the cartesian product of
    the listed values) or, with ``grid``, its default grid, each laid over its ``method_config``."""
    name = get_method(method).name  # what method_config and method_grid call it
    base = options.method_config.get(name, {})
    explicit = options.method_grid.get(name)
    if explicit:
        names = list(explicit)
        points = [dict(zip(names, values)) for values in itertools.product(*(explicit[n] for n in names))]
    elif options.grid:
        points = [p for p in get_method(method).grid_configs() if not set(p) & set(base)] or [{}]
    else:
        points = [{}]
    return [{**base, **point} for point in points]


def tried_points(options: RunOptions, method: str) -> list[dict[str, Any]]:
    """Every method config a sweep may run: its grid points (:func:`grid_points`) and, where ``--tune`` searches the
    method's knob, each with every value of the knob's grid (what its trials try; the preflight checks them all)."""
    spec = get_method(method)
    target, knob = knob_target(spec), spec.pareto_knob
    if target is None or knob is None or target not in options.tune:
        return grid_points(options, method)
    return [{**point, knob: value} for point in grid_points(options, method) for value in spec.default_grid]


def resolve_device(
    device: str, nproc: int = 1, cluster_gpus: float | None = None, memory_snapshot: bool = False
) -> str:
    """``auto``/``cuda``/``cuda:N`` checked against the GPUs torch sees here, or, for runs on a Ray
    cluster (``cluster_gpus``: the cluster's GPU count), against the cluster's; ``memory_snapshot``
    (of the CUDA allocator) needs the runs on CUDA."""
    resolved = _resolve_device(device, nproc, cluster_gpus)
    if memory_snapshot and not resolved.startswith("cuda"):
        raise UsageError(f"--memory-snapshot records the CUDA allocator; the runs are on {resolved}")
    return resolved


def _resolve_device(device: str, nproc: int, cluster_gpus: float | None) -> str:
    if nproc > 1 and device.startswith("cuda:"):
        raise UsageError(
            f"--device {device} names one GPU; a run of --nproc-per-run {nproc} ranks puts rank i on "
            "cuda:i of the GPUs it is given: use --device cuda (and CUDA_VISIBLE_DEVICES)"
        )
    if device == "cpu":
        return device
    if cluster_gpus is not None:
        if device == "auto":
            return "cuda" if cluster_gpus >= 1 else "cpu"
        if cluster_gpus < 1:
            raise UsageError(f"--device {device} was asked for but the Ray cluster has no GPU; use --device cpu")
        if device not in ("cuda", "cuda:0"):
            raise UsageError(
                f"--device {device}: a Ray task sees only the GPUs Ray gives it, as cuda:0 onwards; use --device cuda"
            )
        return "cuda"
    import torch  # seconds: loaded to find a local device, after every option has been checked

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if not torch.cuda.is_available():
        raise UsageError(f"--device {device} was asked for but torch sees no CUDA device; use --device cpu")
    index = device.partition(":")[2]
    if index and not (index.isdigit() and int(index) < torch.cuda.device_count()):
        raise UsageError(f"--device {device}: torch sees CUDA devices 0..{torch.cuda.device_count() - 1}")
    if device == "cuda" and nproc > torch.cuda.device_count():
        raise UsageError(f"--nproc-per-run {nproc} needs {nproc} GPUs; torch sees {torch.cuda.device_count()} here")
    return device


def check_backbone_shapes(options: RunOptions, presets: bool = True) -> None:
    """What each backbone's config alone answers: its depth against ``--num-layers``, its positions against
    ``--max-length`` (the config of a folder or hub id: a bad one fails here).  The first of the preflight's model
    checks, and a driver's only ones before it forks its warm worker: they compute nothing (no tensor operation,
    no data), so the fork carries no thread pool of theirs.  ``presets=False`` leaves the tiny presets out: their
    config is built with their tokenizer's vocabulary, and a fork would carry that tokenizer into every run."""
    for backbone in options.backbone:
        if presets or not is_tiny_preset(backbone):
            config = backbone_config(backbone)
            check_shape(backbone, config, num_layers=options.num_layers, max_length=options.max_length)


def preflight(options: RunOptions, meters_here: bool = True, peak: PeakEstimate | None = None) -> list[str]:
    """Checks that need the libraries (a named meter, a hub backbone, the data itself), run once in
    the parent before any run or executor starts, so a bad value is one error line and nothing is
    written.  ``meters_here``: the runs measure on this machine (not on a cluster's nodes), so a
    named energy meter must work here (and its memory bounds the runs').  ``peak``: a predicted LM training peak
    (``petlprof estimate``'s, which this layer cannot import: the front passes it in) for the sizes only the data
    decides.  Returns notes for the user: sizes asked for that the data cannot give."""
    if meters_here:
        check_energy_meter(options.energy_meter)
    if options.power_limit:
        _check_power_limit(options)
    if options.settle:
        _check_settle(options, meters_here)
    notes: list[str] = []
    if options.method_config_file:  # the fields of PEFT's files that petlprof decides itself
        notes += [note for path in options.method_config_file for note in read_peft_config_file(path)[2]]
    check_backbone_shapes(options)
    for backbone in options.backbone:
        config = backbone_config(backbone)
        _architecture(backbone)  # built on the meta device: a config the model refuses is one line here
        if options.gradient_checkpointing:
            check_gradient_checkpointing(config, backbone)
        if options.random_init:  # the weights are built on this machine unless the runs go to a cluster
            check_random_init(backbone, config, options.num_layers, memory=meters_here)
        for method in options.methods:
            for point in tried_points(options, method):  # every point, e.g. a LoRA rank wider than the model
                method_config = get_method(method).make_config(point)
                depth = options.num_layers or int(config.num_hidden_layers)
                check_backbone(get_method(method), method_config, int(config.hidden_size), depth, backbone)
    refused = unsupported_pairs(options)
    if refused and not options.skip_unsupported:
        raise UsageError(
            f"{len(refused)} method/backbone pair(s) cannot run (--skip-unsupported runs the rest): "
            + "; ".join(refused)
        )
    notes += [f"skipped (--skip-unsupported): {pair}" for pair in refused]
    for name in options.task:
        task = sweep_task(options, name)
        for method in options.methods:
            check_objective(get_method(method), LM if task.objective == LM else CLASSIFICATION)
        if task.objective == LM:
            _check_lm_options(options, name)
            points = {method: tried_points(options, method) for method in options.methods}
            for backbone in options.backbone:
                check_lm_lengths(options, name, task, backbone, peak if meters_here else None, points)
        elif options.max_new_tokens is not None:
            raise UsageError(
                f"--max-new-tokens {options.max_new_tokens} sets how long generated answers may be; task '{name}' "
                "is scored by a classification head and generates nothing (--objective lm makes it a "
                "text-to-text task)"
            )
        notes += [f"task '{name}': {warning}" for warning in task.warnings]
        if options.target_value is not None:
            check_target(task, name, options.target_metric or task.primary_metric, options.target_value)
        _check_eval_every(options, name, task)
        for split, asked, option in (
            (task.train, options.train_size, "--train-size"),
            (task.eval, options.eval_size, "--eval-size"),
        ):
            if asked is not None and len(split) < asked:
                notes.append(
                    f"task '{name}' has {len(split)} {'training' if split is task.train else 'evaluation'} "
                    f"examples; {option} {asked} uses those"
                )
    points = {method: tried_points(options, method) for method in options.methods}  # each one's points, trials too
    notes += check_resources(options, {name: sweep_task(options, name) for name in options.task}, points, meters_here)
    return notes


def _check_power_limit(options: RunOptions) -> None:
    """``--power-limit`` where this sweep can set it: its own GPUs (not a cluster's), each limit in range, with the
    right to set it."""
    if options.executor == RAY:
        raise UsageError(
            "--power-limit sets the power limit of this machine's GPUs; with --executor ray the runs go to the "
            "cluster's nodes, which it cannot set: run the power-limit sweep with --executor local on the GPU machine"
        )
    if options.device == "cpu":
        raise UsageError("--power-limit sets NVIDIA GPUs' power limit; --device cpu runs on the CPU")
    check_power_limits([watts for limit in options.power_limit if (watts := parse_watts(limit)) is not None])


def _check_settle(options: RunOptions, meters_here: bool) -> None:
    """``--settle`` where the runs have an NVIDIA GPU whose temperature NVML reads (checked here for local runs)."""
    if options.device == "cpu":
        raise UsageError("--settle warms an NVIDIA GPU to a steady temperature; --device cpu runs on the CPU")
    if meters_here:
        ok, why = nvml_availability()
        if not ok:
            raise UsageError(f"--settle needs an NVIDIA GPU whose temperature NVML reads: {why}")


def _check_eval_every(options: RunOptions, name: str, task) -> None:
    """A check every ``--eval-every`` steps must fall inside a run: past the warm-up, by its last optimiser step
    (a search's trials set their own, one check at their end)."""
    every = options.eval_every
    if every is None:
        return
    steps = optimiser_steps(
        len(task.train), options.batch_size, options.epochs, options.max_steps, options.gradient_accumulation
    )
    warmup = min(options.warmup_steps, max(steps - 1, 0))
    first = (warmup // every + 1) * every  # the first multiple of it past the warm-up
    if first > steps:
        raise UsageError(
            f"--eval-every {every}: a run on task '{name}' makes {steps} optimiser step(s), {warmup} of them warm-up, "
            f"so no validation check would run; give an --eval-every of at most {steps}"
            + (f" that has a multiple past step {warmup}" if warmup else "")
        )


def _check_lm_options(options: RunOptions, task: str) -> None:
    """Options a language-modelling run cannot honour yet, and backbones with no LM head, refused before any run."""
    for backbone in options.backbone:
        model_class(backbone_config(backbone), True, backbone)  # an encoder: one line naming it
    if options.nproc_per_run > 1:
        raise UsageError(
            f"task '{task}' is a language-modelling task, which runs in one process; "
            f"--nproc-per-run {options.nproc_per_run} is for classification runs"
        )


def sweep_task(options: RunOptions, name: str):
    """Task ``name`` as the sweep's runs load it (loaded once per process: the preflight and
    :func:`expand`, which adds the zero-shot row of a language-modelling task, both read it)."""
    try:
        return _cached_task(options, name)
    except UsageError as error:
        if options.val_size is None and str(error).startswith("--val-size "):  # the default, which nobody typed
            raise UsageError(
                f"{error} (--val-size {resolved_val_size(options)} is the default where runs check a validation "
                "split; give a smaller --val-size)"
            ) from None
        raise


def _cached_task(options: RunOptions, name: str):
    return _sweep_task(
        name,
        options.train_size,
        options.eval_size,
        options.data_dir,
        options.text_column,
        options.text_pair_column,
        options.label_column,
        options.objective,
        options.prompt_column,
        options.target_column,
        options.chat_template,
        resolved_val_size(options),
        options.val_file,
    )


@functools.cache
def _sweep_task(
    name,
    train_size,
    eval_size,
    data_dir,
    text,
    pair,
    label,
    objective,
    prompt,
    target,
    chat_template,
    val_size,
    val_file,
):
    return load_task(
        name,
        train_size=train_size,
        eval_size=eval_size,
        val_size=val_size,
        val_file=val_file,
        data_dir=data_dir,
        text_column=text,
        text_pair_column=pair,
        label_column=label,
        objective=objective,
        prompt_column=prompt,
        target_column=target,
        chat_template=chat_template,
    )


def default_output_dir() -> Path:
    return Path("petlprof-out") / dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")


@functools.cache
def _architecture(backbone: str, lm_head: bool = False):
    """The architecture description of a backbone by name (``petlprof.models.architecture``), built once per process;
    ``lm_head``: with its LM head, as the LM objective's runs build it (module names under the wrapper's prefix)."""
    from petlprof.models.architecture import describe_any  # torch (seconds): only the preflight of a backbone needs it

    return describe_any(backbone_config(backbone), spec=backbone, lm_head=lm_head)


def _unsupported(backbone: str, method: str, method_config: dict[str, Any], lm: bool) -> str | None:
    """Why ``method`` cannot apply to ``backbone`` with ``method_config`` (on the LM objective if ``lm``), or None."""
    from petlprof.models.architecture import unsupported_reason  # torch (seconds): as in _architecture

    if is_peft_tuner(method):  # PEFT's own reason, from the tuner applied to the backbone without weights
        return peft_unsupported_reason(method, backbone, method_config)
    arch = _architecture(backbone, lm)
    return None if arch is None else unsupported_reason(method, arch, method_config)


def unsupported_pairs(options: RunOptions) -> list[str]:
    """``<method> on <backbone>: <why>`` for each method that cannot apply to a backbone of the sweep on an objective
    of its tasks (:func:`petlprof.models.architecture.unsupported_reason`, from the config alone), once per pair."""
    objectives = sorted({_is_lm(options, task) for task in options.task})
    pairs = {
        f"{method} on {backbone}: {reason}": None
        for backbone in options.backbone
        for method in options.methods
        for point in tried_points(options, method)
        for lm in objectives
        if (reason := _unsupported(backbone, method, point, lm))
    }
    return list(pairs)


def expand(options: RunOptions, device: str, out_dir: Path | None = None) -> list[RunSpec]:
    """One :class:`RunSpec` per (backbone, quantization, task, method, grid point, seed), in that nesting order; a
    grid point that resolves to a configuration already listed runs once.  Each option fills its
    RunSpec field as declared (:class:`~petlprof.sweep.options.ToSpec`); the derived ones are set here: the
    sweep axes, the method's full config and learning rate, the device, and the folders in the sweep's output
    folder ``out_dir`` (none without it) where a hidden-state cache spills and memory snapshots go."""
    configs = {  # the full configs and learning rates, so an explicit default gives the same run key
        method: [dataclasses.asdict(get_method(method).make_config(point)) for point in grid_points(options, method)]
        for method in options.methods
    }
    lm = {str(task): _is_lm(options, str(task)) for task in options.task}
    lrs = {  # --lr, or each method's default on each task's objective
        (method, task): options.lr
        if options.lr is not None
        else get_method(method).lr_for(LM if is_lm else CLASSIFICATION)[0]
        for method in options.methods
        for task, is_lm in lm.items()
    }
    shared = {method: _copied(options, method) for method in options.methods}
    limits = [parse_watts(limit) for limit in options.power_limit] or [None]  # a sweep axis, outermost
    specs = [
        RunSpec(
            method=method,
            backbone=str(backbone),
            task=str(task),
            seed=int(seed),
            device=device,
            method_config=config,
            lr=lrs[method, str(task)],
            eval_every=resolved_eval_every(options),
            val_size=resolved_val_size(options),
            **quantize_fields(quantize, options.quantize_compute_dtype, options.quantize_double),
            **shared[method],
            **_folders(options, out_dir, shared[method]["cache_hidden_states"]),
            power_limit_w=limit,
        )
        for limit in limits
        for backbone in options.backbone
        for quantize in options.quantize
        for task in options.task
        for method in options.methods
        for config in configs[method]
        for seed in options.seeds
        if not (options.skip_unsupported and _unsupported(str(backbone), method, config, lm[str(task)]))
    ]
    specs = [*_zero_shot_runs(options, specs, out_dir), *specs]
    specs.sort(key=lambda spec: limits.index(spec.power_limit_w))  # each limit's runs together: set once per limit
    return list({spec.run_key: spec for spec in specs}.values())


class _Folders(TypedDict):
    cache_dir: str | None
    memory_snapshot_dir: str | None


def _folders(options: RunOptions, out_dir: Path | None, caching: bool) -> _Folders:
    """The RunSpec fields naming folders of the sweep's output: where a cache that outgrows its budget spills
    (next to the results) and where the CUDA allocator's snapshots go."""
    if out_dir is None:
        return {"cache_dir": None, "memory_snapshot_dir": None}
    return {
        "cache_dir": str(out_dir / "cache") if caching else None,
        "memory_snapshot_dir": str(out_dir / "memory-snapshots") if options.memory_snapshot else None,
    }


def _zero_shot_runs(options: RunOptions, specs: list[RunSpec], out_dir: Path | None) -> list[RunSpec]:
    """One zero-shot run per backbone (as quantised), power limit and language-modelling task of the sweep (the model
    before any tuning, at zero training energy; greedy decoding is deterministic, so the first seed alone), made
    from the sweep's first run of that combination with the method swapped."""
    method = get_method(ZERO_SHOT)
    first: dict[tuple[str, str, str, float | None], RunSpec] = {}
    for spec in specs:
        if spec.method != ZERO_SHOT and _is_lm(options, spec.task):
            first.setdefault((spec.backbone, spec.quantize, spec.task, spec.power_limit_w), spec)
    config = dataclasses.asdict(method.make_config({}))
    copied = _copied(options, ZERO_SHOT)
    untrained = {name: spec_default(*spec_fields()[name]) for name in UNTRAINED_DEFAULTS}  # no checks or search
    return [
        dataclasses.replace(
            spec,
            method=ZERO_SHOT,
            method_config=config,
            lr=method.default_lr,
            seed=int(options.seeds[0]),
            **{**copied, **untrained},
            **_folders(options, out_dir, copied["cache_hidden_states"]),
        )
        for spec in first.values()
    ]


def _is_lm(options: RunOptions, task: str) -> bool:
    """Whether ``task`` runs on the language-modelling objective (read from the task itself unless the
    objective is named or the task is a labelled built-in)."""
    if options.objective != AUTO:
        return options.objective == LM
    return generative_possible(task, options.prompt_column) and sweep_task(options, task).objective == LM


def _copied(options: RunOptions, method: str) -> dict[str, Any]:
    """The RunSpec fields of one method's runs that options fill as they are (converted where declared),
    or with the field's default where the option does not apply (e.g. the cache for a non-side-tuning method)."""
    out = {}
    for field, (name, to) in spec_fields().items():
        if to.derived:
            continue
        if to.copy_if is None or to.copy_if(options, method):
            value = getattr(options, name)
            out[field] = to.convert(value) if to.convert else value
        else:
            out[field] = spec_default(name, to)
    return out
