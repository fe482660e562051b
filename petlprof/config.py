"""Run options from the command line and from a TOML/YAML file, validated and expanded into runs.

Precedence: built-in defaults < ``--config FILE`` < options given on the command line.  Every
check that can fail on user input runs here, before any process starts or any file is written,
and fails with one :class:`~petlprof.errors.UsageError` line naming the bad value.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError, unknown_choice
from petlprof.runner import RunSpec

DEVICES = ("auto", "cpu", "cuda")
CACHE_DTYPES = ("float16", "bfloat16", "float32")  # petlprof.cache.DTYPES, named without importing torch


@dataclass
class RunOptions:
    methods: list[str] = field(default_factory=list)
    backbone: list[str] = field(default_factory=lambda: ["minilm"])
    task: list[str] = field(default_factory=lambda: ["tweets"])
    seeds: list[int] = field(default_factory=lambda: [0])
    epochs: int = 1
    max_steps: int | None = None
    train_size: int | None = 2000
    eval_size: int | None = 1000
    batch_size: int = 32
    lr: float | None = None
    max_length: int = 64
    warmup_steps: int = 2
    num_layers: int | None = None
    data_dir: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    device: str = "auto"
    energy_meter: str = "auto"
    output: str | None = None
    in_process: bool = False
    timeout: float | None = None  # seconds per run; not part of a run's identity
    max_memory: str | int | None = None  # per run, e.g. "2GiB"; not part of a run's identity
    # where runs execute (petlprof.executors), not part of a run's identity: this machine or a Ray
    # cluster (its address, retries of a lost task, CPUs each run's task asks for)
    executor: str = "local"
    address: str | None = None
    retries: int = 0
    cpus_per_run: float = 1.0
    nproc_per_run: int = 1  # data-parallel ranks of each run (petlprof.distributed); part of the identity
    # measurement (petlprof.meters), not part of a run's identity: extra meters beside the energy and
    # memory meters, codecarbon's country, CUDA memory snapshots, the inference phase's window
    meters: list[str] = field(default_factory=list)
    country_code: str | None = None
    memory_snapshot: bool = False
    inference_window_s: float | None = None
    cache_hidden_states: bool = False  # side-tuning methods only (petlprof.cache)
    cache_budget: str | int = "1GiB"  # in memory; the rest spills to a file in the output folder
    cache_dtype: str = "float16"
    method_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    # sweeps: each method's default grid of its Pareto knob, and/or explicit grids (field -> values,
    # crossed with each other) per method; a grid point is laid over that method's method_config
    grid: bool = False
    method_grid: dict[str, dict[str, list]] = field(default_factory=dict)
    # budget (petlprof.budget): stop a run at a target metric value (time-to-accuracy) or a time limit
    target_value: float | None = None
    target_metric: str | None = None  # default: the task's primary metric
    eval_every: int = 10  # optimiser steps between target checks
    target_eval_size: int | None = 200  # first N eval examples scored per check (None: all)
    max_train_time: float | None = None  # seconds of training per run

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def _as_list(value: Any) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def load_config_file(path: str) -> dict[str, Any]:
    """Options from a ``.toml``, ``.yaml`` or ``.yml`` file (same names as the CLI, with underscores)."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"config file '{path}' does not exist")
    suffix = file.suffix.lower()
    try:
        if suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover
                import tomli as tomllib
            data = tomllib.loads(file.read_text())
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(file.read_text()) or {}
        else:
            raise UsageError(f"config file '{path}' must end in .toml, .yaml or .yml, not '{suffix}'")
    except UsageError:
        raise
    except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError
        detail = " ".join(str(exc).split())
        raise UsageError(f"config file '{path}' is malformed: {detail}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file '{path}' must hold a table of options, not {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise UsageError(
                f"config file '{path}': option name {key!r} is not text; options are named, e.g. "
                "methods, seeds, train_size"
            )
    data = {k.replace("-", "_"): v for k, v in data.items()}
    for key in data:
        if key not in RunOptions.field_names():
            raise unknown_choice(f"option in '{path}'", key, RunOptions.field_names())
    return data


def parse_method_overrides(
    items: list[str], option: str = "--method-config", example: str = "METHOD.FIELD=VALUE, e.g. lora.r=16"
) -> dict[str, dict[str, Any]]:
    """``["lora.r=4", "read.cell=lstm"]`` -> ``{"lora": {"r": 4}, "read": {"cell": "lstm"}}``."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        method, dot, name = key.partition(".")
        if not (sep and dot and method and name):
            raise UsageError(f"{option} '{item}' must look like {example}")
        if option == "--method-grid" and not text.strip().startswith("["):
            text = f"[{text}]"  # 2,8,32 is the list [2, 8, 32]
        try:
            out.setdefault(method, {})[name] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{option} '{item}': the value is not valid: {' '.join(str(exc).split())}") from None
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


ALL_SIZES = ("train_size", "eval_size", "target_eval_size")  # options that take 'all'


def build_options(file_values: dict[str, Any], cli_values: dict[str, Any]) -> RunOptions:
    values = {**file_values, **{k: v for k, v in cli_values.items() if v is not None}}
    for key in ("methods", "backbone", "task", "seeds", "meters"):
        if key in values:
            values[key] = _as_list(values[key])
    if "seeds" in values:
        values["seeds"] = [int(s) if isinstance(s, str) and s.isdigit() else s for s in values["seeds"]]
    for key in ("methods", "backbone", "task"):
        for item in values.get(key, []):
            if not isinstance(item, str):
                raise UsageError(f"option '{key}' must name strings, got {item!r}")
    if "methods" in values:
        values["methods"] = list(dict.fromkeys(values["methods"]))  # a method named twice runs once
    for key in ALL_SIZES:  # 'all' (TOML has no null): every example of the split
        if isinstance(values.get(key), str) and values[key].lower() == "all":
            values[key] = None
    if cli_values.get("method_grid"):
        grids = {m: dict(v) for m, v in (file_values.get("method_grid") or {}).items()}
        for method, fields in cli_values["method_grid"].items():
            grids.setdefault(method, {}).update(fields)
        values["method_grid"] = grids
    if cli_values.get("method_config"):
        merged = {m: dict(v) for m, v in (file_values.get("method_config") or {}).items()}
        for method, fields in cli_values["method_config"].items():
            merged.setdefault(method, {}).update(fields)
        values["method_config"] = merged
    try:
        options = RunOptions(**values)
    except TypeError as exc:
        raise UsageError(str(exc)) from None
    validate(options)
    return options


def _is_number(value: Any) -> bool:
    """A real, finite number: not a bool, not inf, not nan."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _is_positive_number(value: Any, allow_zero: bool = False) -> bool:
    return _is_number(value) and (value >= 0 if allow_zero else value > 0)


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"--{name.replace('_', '-')} must be an integer >= {minimum}, got {value!r}")


_TYPES = {
    "methods": list,
    "backbone": list,
    "task": list,
    "seeds": list,
    "device": str,
    "energy_meter": str,
    "in_process": bool,
    "method_config": dict,
    "output": (str, type(None)),
    "data_dir": (str, type(None)),
    "text_column": (str, type(None)),
    "text_pair_column": (str, type(None)),
    "label_column": (str, type(None)),
    "grid": bool,
    "method_grid": dict,
    "target_metric": (str, type(None)),
    "executor": str,
    "address": (str, type(None)),
}


def validate(options: RunOptions) -> None:
    from petlprof.backbones import check_backbone
    from petlprof.meters import check_energy_meter
    from petlprof.registry import get_method, method_names, methods_by_name
    from petlprof.tasks import check_task

    for name, kind in _TYPES.items():
        value = getattr(options, name)
        if not isinstance(value, kind):
            expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise UsageError(f"option '{name}' must be {expected.replace('NoneType', 'unset')}, got {value!r}")
    for name, fields in options.method_config.items():
        if not isinstance(fields, dict):
            raise UsageError(f"method_config.{name} must be a table of fields, got {fields!r}")
    if not options.methods:
        raise UsageError("no method given: use --methods, e.g. --methods read,lora (see `petlprof list`)")
    for name, example in (("seeds", "--seeds 0,1"), ("backbone", "--backbone minilm"), ("task", "--task tweets")):
        if not getattr(options, name):
            raise UsageError(f"no {name.rstrip('s')} given (an empty --{name}): give at least one, e.g. {example}")
    for name in options.methods:
        get_method(name)
    named = methods_by_name(options.methods)  # a plug-in given as module:ATTR is addressed by its spec's name
    for name, fields in options.method_config.items():
        if name not in named:
            raise unknown_choice("method in method_config", name, named)
        get_method(named[name]).make_config(fields)
    for name, fields in options.method_grid.items():
        if name not in named:
            raise unknown_choice("method in method_grid", name, named)
        if not isinstance(fields, dict) or not fields:
            raise UsageError(f"method_grid.{name} must be a table of FIELD = [values], got {fields!r}")
        for key, values in fields.items():
            if not isinstance(values, list) or not values:
                raise UsageError(f"method_grid.{name}.{key} must be a non-empty list of values, got {values!r}")
    for method in options.methods:
        for point in grid_points(options, method):
            get_method(method).make_config(point)
    _validate_budget(options)
    for spec in options.backbone:
        check_backbone(str(spec))
    for spec in options.task:
        check_task(str(spec))
    for seed in options.seeds:
        _check_int("seeds", seed, 0)
    for name in ("epochs", "batch_size", "max_length"):
        _check_int(name, getattr(options, name), 1)
    for name in ("max_steps", "train_size", "eval_size", "num_layers"):
        _check_int(name, getattr(options, name), 1, allow_none=True)
    _check_int("warmup_steps", options.warmup_steps, 0)
    if options.timeout is not None and not _is_positive_number(options.timeout):
        raise UsageError(f"--timeout must be a positive number of seconds, got {options.timeout!r}")
    parse_bytes(options.max_memory)
    if not isinstance(options.cache_hidden_states, bool):
        raise UsageError(f"option 'cache_hidden_states' must be true or false, got {options.cache_hidden_states!r}")
    parse_bytes(options.cache_budget, option="--cache-budget")
    if options.cache_dtype not in CACHE_DTYPES:
        raise unknown_choice("cache dtype", options.cache_dtype, CACHE_DTYPES)
    _only_with(options, "cache_hidden_states", ("cache_budget", "cache_dtype"))
    if options.cache_hidden_states and not any(get_method(m).side_tuning for m in options.methods):
        side = sorted(name for name in method_names() if get_method(name).side_tuning)
        raise UsageError(
            f"--cache-hidden-states serves side-tuning methods ({', '.join(side)}); none of "
            f"--methods {','.join(options.methods)} is one"
        )
    if options.in_process and (options.timeout is not None or options.max_memory is not None):
        raise UsageError("--timeout and --max-memory act on a run's own process; they cannot be used with --in-process")
    if options.lr is not None and not _is_positive_number(options.lr):
        raise UsageError(f"--lr must be a positive number, got {options.lr!r}")
    if options.device not in DEVICES and not options.device.startswith("cuda:"):
        raise unknown_choice("device", options.device, DEVICES)
    check_energy_meter(options.energy_meter, need_available=False)
    _validate_measurement(options)
    _validate_executor(options)


def _only_with(options: RunOptions, needed: str, names: tuple[str, ...]) -> None:
    """Options that act only together with ``needed``: given without it, they would do nothing."""
    given = getattr(options, needed)
    if given is not None and given is not False:  # a target of 0 is given
        return
    defaults = {f.name: f.default for f in dataclasses.fields(RunOptions)}
    for name in names:
        if getattr(options, name) != defaults[name]:
            raise UsageError(
                f"--{name.replace('_', '-')} acts only with --{needed.replace('_', '-')}, which was not given"
            )


def _validate_executor(options: RunOptions) -> None:
    from petlprof.executors import EXECUTORS

    if options.executor not in EXECUTORS:
        raise unknown_choice("executor", options.executor, EXECUTORS)
    _check_int("retries", options.retries, 0)
    _check_int("nproc_per_run", options.nproc_per_run, 1)
    cpus = options.cpus_per_run
    if not _is_positive_number(cpus):
        raise UsageError(f"--cpus-per-run must be a positive number of CPUs, got {cpus!r}")
    if options.executor != "ray":
        for name, default in (("address", None), ("retries", 0), ("cpus_per_run", 1.0)):
            if getattr(options, name) != default:
                raise UsageError(
                    f"--{name.replace('_', '-')} applies to --executor ray; the runs execute "
                    f"on this machine ('{options.executor}')"
                )
    if options.in_process and options.executor == "ray":
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


def _validate_measurement(options: RunOptions) -> None:
    from petlprof.meters import check_extra_meters

    check_extra_meters(options.meters)
    if options.country_code is not None and not re.fullmatch(r"[A-Za-z]{3}", str(options.country_code)):
        raise UsageError(
            f"--country-code must be an ISO 3166 alpha-3 code such as USA, FRA or DEU, got {options.country_code!r}"
        )
    if options.country_code is not None and "codecarbon" not in options.meters:
        raise UsageError("--country-code sets codecarbon's carbon intensity; add --meters codecarbon")
    if not isinstance(options.memory_snapshot, bool):
        raise UsageError(f"option 'memory_snapshot' must be true or false, got {options.memory_snapshot!r}")
    window = options.inference_window_s
    if window is not None and not _is_positive_number(window, allow_zero=True):
        raise UsageError(f"--inference-window-s must be a number of seconds >= 0, got {window!r}")


def _validate_budget(options: RunOptions) -> None:
    from petlprof.metrics import METRIC_FUNCTIONS

    for name in ("target_value", "max_train_time"):
        value = getattr(options, name)
        if value is not None and not _is_number(value):
            raise UsageError(f"--{name.replace('_', '-')} must be a number, got {value!r}")
    if options.max_train_time is not None and options.max_train_time <= 0:
        raise UsageError(f"--max-train-time must be a positive number of seconds, got {options.max_train_time!r}")
    _check_int("eval_every", options.eval_every, 1)
    _check_int("target_eval_size", options.target_eval_size, 1, allow_none=True)
    _only_with(options, "target_value", ("eval_every", "target_eval_size"))
    if options.target_metric is not None:
        if options.target_value is None:
            raise UsageError(f"--target-metric {options.target_metric} needs --target-value")
        if options.target_metric not in METRIC_FUNCTIONS:  # a task metric, not a cost
            raise unknown_choice("target metric", options.target_metric, METRIC_FUNCTIONS)


def grid_points(options: RunOptions, method: str) -> list[dict[str, Any]]:
    """The method-config overrides one method runs with: its explicit grid (the cartesian product of
    the listed values) or, with ``grid``, its default grid, each laid over its ``method_config``."""
    import itertools

    from petlprof.registry import get_method

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


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}


def parse_bytes(value: str | int | None, option: str = "--max-memory") -> int | None:
    """``"2GiB"``, ``"500MB"``, ``"1.5g"`` or a plain number of bytes; None stays None."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise UsageError(f"{option} '{value}' is not a positive size; use e.g. 2GiB, 500MB or a number of bytes")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise UsageError(f"{option} '{value}' is less than one byte; use e.g. 2GiB, 500MB or a number of bytes")
    return size


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
    import torch

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


def preflight(options: RunOptions, meters_here: bool = True) -> list[str]:
    """Checks that need the libraries (a named meter, a hub backbone, the data itself), run once in
    the parent before any run or executor starts, so a bad value is one error line and nothing is
    written.  ``meters_here``: the runs measure on this machine (not on a cluster's nodes), so a
    named energy meter must work here.  Returns notes for the user: sizes asked for that the data
    cannot give."""
    from petlprof.backbones import backbone_config, check_shape
    from petlprof.budget import check_target
    from petlprof.meters import check_energy_meter
    from petlprof.registry import get_method
    from petlprof.tasks import load_task

    if meters_here:
        check_energy_meter(options.energy_meter)
    notes: list[str] = []
    for spec in options.backbone:
        config = backbone_config(spec)  # the config of a folder or hub id: a bad one fails here
        check_shape(spec, config, num_layers=options.num_layers, max_length=options.max_length)
        for method in options.methods:
            for point in grid_points(options, method):  # every grid point, e.g. a LoRA rank wider than the model
                method_config = get_method(method).make_config(point)
                if hasattr(method_config, "check_width"):
                    method_config.check_width(int(config.hidden_size), spec)
    for name in options.task:
        task = load_task(
            name,
            train_size=options.train_size,
            eval_size=options.eval_size,
            data_dir=options.data_dir,
            text_column=options.text_column,
            text_pair_column=options.text_pair_column,
            label_column=options.label_column,
        )
        if options.target_value is not None:
            check_target(task, name, options.target_metric or task.primary_metric, options.target_value)
        for split, asked, option in (
            (task.train, options.train_size, "--train-size"),
            (task.eval, options.eval_size, "--eval-size"),
        ):
            if asked is not None and len(split) < asked:
                notes.append(
                    f"task '{name}' has {len(split)} {'training' if split is task.train else 'evaluation'} "
                    f"examples; {option} {asked} uses those"
                )
    return notes


def default_output_dir() -> Path:
    return Path("petlprof-out") / dt.datetime.now().strftime("run-%Y%m%d-%H%M%S")


def expand(options: RunOptions, device: str) -> list[RunSpec]:
    """One :class:`RunSpec` per (backbone, task, method, grid point, seed), in that nesting order; a
    grid point that resolves to a configuration already listed runs once."""
    shared = {
        name: getattr(options, name)
        for name in (
            "num_layers",
            "data_dir",
            "text_column",
            "text_pair_column",
            "label_column",
            "epochs",
            "max_steps",
            "train_size",
            "eval_size",
            "batch_size",
            "lr",
            "max_length",
            "warmup_steps",
            "energy_meter",
        )
    }
    from petlprof.registry import get_method

    if options.target_value is not None or options.max_train_time is not None:
        target = options.target_value is not None
        shared.update(
            target_value=options.target_value,
            target_metric=options.target_metric,
            eval_every=options.eval_every if target else None,
            target_eval_size=options.target_eval_size if target else None,
            max_train_time_s=options.max_train_time,
        )

    shared.pop("lr")
    shared.update(
        extra_meters=list(options.meters),
        country_code=options.country_code,
        inference_window_s=options.inference_window_s,
        nproc=options.nproc_per_run,
    )
    resolved = {}  # the full configs and learning rate, so an explicit default gives the same run key
    for method in options.methods:
        spec = get_method(method)
        configs = [dataclasses.asdict(spec.make_config(point)) for point in grid_points(options, method)]
        resolved[method] = (configs, options.lr if options.lr is not None else spec.default_lr)

    def cache(method: str) -> dict[str, Any]:  # the cache serves side-tuning methods; the others run as usual
        if not (options.cache_hidden_states and get_method(method).side_tuning):
            return {}
        return {
            "cache_hidden_states": True,
            "cache_dtype": options.cache_dtype,
            "cache_budget_bytes": parse_bytes(options.cache_budget, option="--cache-budget"),
        }

    specs = [
        RunSpec(
            method=method,
            backbone=str(backbone),
            task=str(task),
            seed=int(seed),
            device=device,
            method_config=config,
            lr=resolved[method][1],
            **shared,
            **cache(method),
        )
        for backbone in options.backbone
        for task in options.task
        for method in options.methods
        for config in resolved[method][0]
        for seed in options.seeds
    ]
    return list({spec.run_key: spec for spec in specs}.values())
