"""Every run option, declared once: its default, help, kind (how it is read and the range it must lie in),
what it needs, and which field of a run's :class:`~petlprof.sweep.spec.RunSpec` it fills and whether that field is
part of the run's identity.

:class:`RunOptions` is the declaration (one field per option, as in HfArgumentParser's dataclasses); the
argparse parser (:func:`add_run_arguments`), the config-file keys, :func:`~petlprof.sweep.config.expand`, the
run key (:func:`~petlprof.sweep.spec.spec_identity`) and ``RunSpec``'s fields are all built from it.  Adding an
option is one ``option(...)`` line here.  Imports nothing heavy (``petlprof --help`` stays fast).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from petlprof.errors import UsageError, shown, unknown_choice
from petlprof.models.quantization import COMPUTE_DTYPES, DEFAULT_COMPUTE_DTYPE, NONE, QUANTIZE_CHOICES
from petlprof.values import (
    MAX_LR,
    Bytes,
    Choice,
    Examples,
    Flag,
    Integer,
    Kind,
    Names,
    Number,
    Table,
    Text,
    Watts,
    flag,
    parse_bytes,
)
from petlprof.vocabulary import (
    ADAMW,
    CHAT_TEMPLATES,
    EXECUTORS,
    FLOAT32,
    FP32,
    LOCAL,
    LR,
    OBJECTIVE_CHOICES,
    OPTIMIZERS,
    PRECISIONS,
    WEIGHT_DTYPES,
)

DEVICES = ("auto", "cpu", "cuda")
CACHE_DTYPES = ("float16", "bfloat16", "float32")  # petlprof.run.cache.DTYPES, named without importing torch

# the upper ends of the ranges, each what a machine or a backbone can hold, or what a run can use
MAX_SEED = 2**64 - 1  # torch.manual_seed's largest seed
MAX_STEPS = 10**9
MAX_LAYERS = 128  # deeper than any released transformer (Llama 3.1 405B has 126 layers)
MAX_LENGTH = 2**20  # tokens; a pretrained backbone's positions are checked by the preflight
MAX_BATCH = 2**20
MAX_WARMUP_STEPS = 10_000  # unmeasured steps repeated before each phase's figures
MAX_SECONDS = 366 * 24 * 3600  # a year: a longer wait overflows the timers it is given to
MAX_WINDOW_S = 3600.0  # the inference phase repeats each batch size this long at most
MAX_ACCUMULATION = 2**16  # micro-batches per optimiser step: an effective batch past any published recipe's
MAX_NEW_TOKENS = 2**16  # tokens generated per evaluation prompt: past the context window of nearly every released LM
# the lower end of --max-memory: a run's process imports Python, torch and transformers before the limit is set;
# beyond them the smallest run (tiny-bert on CPU, a few steps) fails under 256 MiB and starts under 512 MiB
MIN_RUN_MEMORY = 512 * 2**20

# when a RunSpec field enters the run key (fields added after the first release enter only when set,
# so the keys of earlier runs do not change)
ALWAYS, NEVER, WHEN_SET, WHEN_CHANGED = "always", "never", "when set", "when changed from its default"


OWN = object()  # a RunSpec field's default: the option's own


def _caching(spec: dict[str, Any]) -> bool:
    return bool(spec.get("cache_hidden_states"))


@dataclass(frozen=True)
class ToSpec:
    """The RunSpec field an option fills: its name and default there, when it is part of the run key
    (ALWAYS, NEVER, WHEN_SET, WHEN_CHANGED, or a test of the spec's dict), and how its value gets there:
    copied (``convert``-ed) when ``copy_if(options, method)`` holds, else the field's default; ``derived``
    fields are worked out by :func:`~petlprof.sweep.config.expand` (a sweep axis, a resolved default)."""

    name: str = ""  # "": the option's own name
    type: Any = None  # None: the option's
    default: Any = OWN  # dataclasses.MISSING: none, the field must be given
    identity: str | Callable[[dict[str, Any]], bool] = ALWAYS
    derived: bool = False
    copy_if: Callable[[Any, str], bool] | None = None
    convert: Callable[[Any], Any] | None = None


# the training settings of real jobs (petlprof.run.recipe), which `petlprof estimate` takes as well
TRAINING_SETTINGS = ("weights_dtype", "gradient_checkpointing", "gradient_accumulation", "optimizer")
TrainingValue = str | bool | int | None  # what those settings take: a dtype or optimiser name, a flag, a count


def option(
    default: Any,
    help: str,
    kind: Kind,
    *,
    spec: ToSpec | None = None,
    only_with: str | tuple[str, ...] | None = None,
    ray_only: bool = False,
    cli: dict[str, Any] | None = None,
) -> Any:
    """One option (a field of :class:`RunOptions`): ``help`` may show ``{default}``; ``only_with``: it acts
    only when that option (or one of those options) is given; ``ray_only``: it applies to ``--executor ray``
    only; ``cli``: argparse arguments beyond the kind's (e.g. ``action``, ``metavar``)."""
    meta = {"help": help, "kind": kind, "spec": spec, "only_with": only_with, "ray_only": ray_only, "cli": cli or {}}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _budget(options, method: str) -> bool:
    return options.target_value is not None or options.max_train_time is not None


def _checks(options, method: str = "") -> bool:
    """Whether runs decide on the validation split (a target, a learning curve, a search)."""
    return options.target_value is not None or options.eval_every is not None or bool(options.tune)


def knob_target(method) -> str | None:
    """``METHOD.KNOB``: what ``--tune`` calls ``method``'s Pareto knob, None for a method without a knob grid."""
    return f"{method.name}.{method.pareto_knob}" if method.pareto_knob and method.default_grid else None


def check_tune_target(value: str) -> None:
    """``lr``, or a method's Pareto knob as ``METHOD.KNOB`` (searched over its declared grid): one line naming the
    targets otherwise.  A ``NAME.KNOB`` whose NAME no built-in or installed method has may be a ``module:ATTR``
    plug-in of ``--methods`` addressed by its spec's name: the sweep's check (``_validate_tuned_knobs`` in
    :mod:`petlprof.sweep.config`) decides it with the methods resolved."""
    if value == LR:
        return
    from petlprof.registry import get_method, method_names  # the entry points of installed plug-ins

    names = method_names()
    knobs = [t for t in (knob_target(get_method(n)) for n in names) if t]
    name, dot, knob = value.partition(".")
    if value not in knobs and not (dot and name and knob and name not in names):
        raise UsageError(
            f"unknown --tune target {value!r}: lr, or a method's Pareto knob as METHOD.KNOB, searched over the "
            f"knob's grid ({', '.join(knobs)})"
        )


def tune_targets(values: list[str]) -> list[str]:
    """``--tune``'s targets once each, in one order (``lr`` first, then the knobs by name): ``lora.r,lr`` and
    ``lr,lora.r,lr`` are the search ``lr,lora.r`` is, with its run keys."""
    return sorted(set(values), key=lambda target: (target != LR, target))


def _tuning(options, method: str) -> bool:
    return bool(options.tune)


DEFAULT_TUNE_POINTS = 5  # learning rates in a search space
MAX_TUNE_POINTS = 81  # four rungs of successive halving at eta 3


DEFAULT_EVAL_EVERY = 10  # optimiser steps between target checks when --eval-every is not given
DEFAULT_VAL_SIZE = 200  # validation examples when a check needs a split and --val-size is not given


def resolved_eval_every(options) -> int | None:
    """The steps between a run's validation checks: the option, else the default with a target, else none."""
    if options.eval_every is not None:
        return int(options.eval_every)
    return DEFAULT_EVAL_EVERY if options.target_value is not None else None


def resolved_val_size(options) -> int | None:
    """A run's validation examples: the option, else all of ``--val-file``'s rows, else the default where checks need
    a split, else none (the run loads the data it loaded before validation splits existed)."""
    if options.val_size is not None:
        return int(options.val_size)
    if options.val_file is not None:  # the whole file
        return None
    return DEFAULT_VAL_SIZE if _checks(options) else None


def _cache(options, method: str) -> bool:  # the cache serves side-tuning methods; the others run as usual
    from petlprof.registry import get_method  # not for --help: it reads the installed plug-ins' entry points

    return options.cache_hidden_states and get_method(method).side_tuning


def _cache_bytes(value) -> int | None:
    return parse_bytes(value, option="--cache-budget")


# names checked against what petlprof knows (imported when checked, so --help stays light)
def _method(name: str) -> None:
    from petlprof.registry import get_method  # the entry points of installed plug-ins

    get_method(name)


def _backbone(backbone: str) -> None:
    from petlprof.models.backbones import check_backbone_name  # the model shapes and GGUF presets

    check_backbone_name(backbone)


def _task(task: str) -> None:
    from petlprof.tasks.labelled import check_task  # numpy (about as long as all of --help)

    check_task(task)


def _energy_meter(name: str) -> None:
    from petlprof.meters import check_energy_meter  # every meter's module, probing NVML and RAPL

    check_energy_meter(name, need_available=False)


def _extra_meter(name: str) -> None:
    from petlprof.meters import check_extra_meters  # every meter's module, probing NVML and RAPL

    check_extra_meters([name])


def _country(code: str) -> None:
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise UsageError(f"--country-code must be an ISO 3166 alpha-3 code such as USA, FRA or DEU, got {shown(code)}")


def _metric(name: str) -> None:
    from petlprof.tasks.metrics import GENERATION_METRICS, METRIC_FUNCTIONS  # decimal: --help checks no metric

    if name not in METRIC_FUNCTIONS and name not in GENERATION_METRICS:  # a task metric, not a cost
        raise unknown_choice("target metric", name, {**METRIC_FUNCTIONS, **GENERATION_METRICS})


SAME = ToSpec()
TEXT = Text(optional=True)
PATH = Text(optional=True, path=True)
WHEN_BUDGET = ToSpec(identity=WHEN_SET, copy_if=_budget)
WHEN_CACHING = ToSpec(identity=_caching, copy_if=_cache)


@dataclass
class RunOptions:
    """The options of ``petlprof run`` and of its config files, in the order ``--help`` lists them."""

    methods: list[str] = option(
        [],
        "comma list of methods, e.g. read,lora (see `petlprof list`)",
        Names(item=Text(known=_method)),
        spec=ToSpec("method", str, dataclasses.MISSING, derived=True),
    )
    backbone: list[str] = option(
        ["minilm"],
        "minilm (offline default), smollm2 (generative), tiny-bert|tiny-t5|tiny-gpt2|tiny-llama, a local model "
        "folder or a Hugging Face id, or with --random-init a bundled shape or a config.json; comma list for several",
        Names(item=Text(path=True, known=_backbone)),
        spec=ToSpec("backbone", str, "minilm", derived=True),
    )
    num_layers: int | None = option(
        None,
        "keep only the first N layers of a pretrained backbone (a tiny-* preset is built with N layers)",
        Integer(1, MAX_LAYERS, "layers", optional=True),
        spec=SAME,
    )
    random_init: bool = option(
        False,
        "build each backbone from its config with random weights seeded by the run's seed: a cost-only run "
        "(accuracy meaningless) of a bundled shape (t5-large, llama-3-8b, ...: `petlprof estimate --list-shapes`), "
        "a config.json, or a folder's or hub id's config, to compare with `petlprof estimate`",
        Flag(),
        spec=ToSpec(identity=WHEN_CHANGED),  # runs on weights keep the keys they had before the option
    )
    task: list[str] = option(
        ["tweets"],
        "tweets (offline default), a GLUE task (sst2, cola, ...), or a CSV/TSV/JSONL/Parquet file or folder of "
        "your own; comma list for several",
        Names(item=Text(path=True, known=_task)),
        spec=ToSpec("task", str, "tweets", derived=True),
    )
    data_dir: str | None = option(
        None, "local files for a GLUE task (same columns as the hub dataset)", PATH, spec=SAME
    )
    text_column: str | None = option(None, "text column of your own data (default: text/sentence)", TEXT, spec=SAME)
    text_pair_column: str | None = option(None, "second text column of a pair task", TEXT, spec=SAME)
    label_column: str | None = option(None, "label column of your own data (default: label)", TEXT, spec=SAME)
    objective: str = option(
        "auto",
        "auto (default: a labelled task trains a classification head, a prompt/target task the backbone's LM "
        "head), classification, or lm (a labelled task as text-to-text: labels verbalised, scored by exact match "
        "of the generated label)",
        Choice(choices=OBJECTIVE_CHOICES, kind="objective"),
        spec=ToSpec(identity=WHEN_CHANGED),  # the runs before the option keep their keys
    )
    prompt_column: str | None = option(
        None,
        "prompt column of your own data for the LM objective (default: recognised layouts instruction/input/"
        "output, prompt/completion, chat messages)",
        TEXT,
        spec=ToSpec(identity=WHEN_SET),
    )
    target_column: str | None = option(
        None,
        "target column of your own data for the LM objective (default: target/completion/output/response/answer)",
        TEXT,
        spec=ToSpec(identity=WHEN_SET),
        only_with="prompt_column",
    )
    chat_template: str = option(
        "auto",
        "LM objective: auto (default: format each prompt as a user turn with the tokenizer's chat template when "
        "it has one) or none (plain text)",
        Choice(choices=CHAT_TEMPLATES, kind="chat template"),
        spec=ToSpec(identity=WHEN_CHANGED),
    )
    max_new_tokens: int | None = option(
        None,
        "LM objective: tokens generated per evaluation prompt (default: the task's own, e.g. 16 for arith, 256 "
        "for gsm)",
        Integer(1, MAX_NEW_TOKENS, "tokens", optional=True),
        spec=ToSpec(identity=WHEN_SET),
    )
    seeds: list[int] = option(
        [0],
        "comma list of seeds (default {default})",
        Names(item=Integer(0, MAX_SEED, "torch.manual_seed's range")),
        spec=ToSpec("seed", int, 0, derived=True),
    )
    epochs: int = option(1, "training epochs (default {default})", Integer(1, MAX_STEPS), spec=SAME)
    max_steps: int | None = option(
        None,
        "train exactly N optimiser steps (overrides --epochs)",
        Integer(1, MAX_STEPS, optional=True),
        spec=SAME,
    )
    train_size: int | None = option(
        2000, "training examples (default {default}; 'all')", Examples(optional=True), spec=SAME
    )
    eval_size: int | None = option(
        1000, "evaluation examples (default {default}; 'all')", Examples(optional=True), spec=SAME
    )
    batch_size: int = option(32, "batch size (default {default})", Integer(1, MAX_BATCH), spec=SAME)
    lr: float | None = option(
        None,
        "learning rate for every method (default: each method's own)",
        Number(0.0, maximum=MAX_LR, what="a positive number", optional=True),
        spec=ToSpec(derived=True),
    )
    max_length: int = option(
        64, "truncate inputs to N tokens (default {default})", Integer(1, MAX_LENGTH, "tokens"), spec=SAME
    )
    warmup_steps: int = option(
        2,
        "steps per phase excluded from the figures (default {default})",
        Integer(0, MAX_WARMUP_STEPS, "unmeasured steps per phase"),
        spec=SAME,
    )
    precision: str = option(
        FP32,
        "fp32 (default), bf16 or fp16: every forward pass and the loss (training, evaluation, inference) under "
        "autocast to that dtype, weights and optimiser state kept in float32; fp16 with dynamic loss scaling",
        Choice(choices=PRECISIONS, kind="precision"),
        spec=ToSpec(identity=WHEN_CHANGED),  # fp32 runs keep the keys they had before the option
    )
    weights_dtype: str = option(
        FLOAT32,
        "float32 (default) or bfloat16: the dtype every weight of the task model is held in, the backbone loaded "
        "and then cast to it; pure bfloat16 training: the trained weights, their gradients and AdamW's state are "
        "in it too (no float32 master copy), and every pass computes in it. Not with --precision (autocast over "
        "float32 weights; float16's way, with a scaled loss) or --quantize",
        Choice(choices=WEIGHT_DTYPES, kind="weights dtype"),
        spec=ToSpec(identity=WHEN_CHANGED),  # float32 runs keep the keys they had before the option
    )
    gradient_checkpointing: bool = option(
        False,
        "recompute the backbone's layer activations in the backward pass instead of keeping them (transformers' "
        "gradient checkpointing, non-reentrant): less training memory for more time; refused where nothing "
        "back-propagates through the backbone (side-tuning methods, zero-shot) or the architecture has none",
        Flag(),
        spec=ToSpec(identity=WHEN_CHANGED),
    )
    gradient_accumulation: int = option(
        1,
        "micro-batches of --batch-size per optimiser step (default {default}): the effective batch is their product; "
        "--max-steps counts optimiser steps",
        Integer(1, MAX_ACCUMULATION, "micro-batches per optimiser step"),
        spec=ToSpec(identity=WHEN_CHANGED),
    )
    optimizer: str = option(
        ADAMW,
        "adamw (default: torch's), adamw8bit or paged_adamw8bit (bitsandbytes' 8-bit AdamW: each state a byte per "
        "element with a float32 scale per block of 256, tensors under 4096 elements kept in float32; pip install "
        "'petlprof[quantize]'); weight decay, schedule and clipping as for adamw",
        Choice(choices=OPTIMIZERS, kind="optimizer"),
        spec=ToSpec(identity=WHEN_CHANGED),
    )
    quantize: list[str] = option(
        [NONE],
        "none (default), int8 (LLM.int8()), nf4 or fp4 (4-bit; nf4 as QLoRA): the frozen backbone's linear layers "
        "loaded quantised by bitsandbytes (pip install 'petlprof[quantize]'), the LM head kept in float; methods "
        "that train backbone weights are refused. Comma list for several",
        Names(item=Choice(choices=QUANTIZE_CHOICES, kind="quantization")),
        spec=ToSpec("quantize", str, NONE, identity=WHEN_CHANGED, derived=True),  # unquantised runs keep their keys
    )
    quantize_compute_dtype: str = option(
        DEFAULT_COMPUTE_DTYPE,
        "4-bit --quantize: the dtype its dequantised weights multiply in: float32 (default), bfloat16 (QLoRA's) "
        "or float16",
        Choice(choices=COMPUTE_DTYPES, kind="compute dtype"),
        spec=ToSpec(identity=WHEN_CHANGED, derived=True),  # set per run: only 4-bit runs carry it
    )
    quantize_double: bool = option(
        False,
        "4-bit --quantize: quantise the per-block scales too (QLoRA's double quantisation)",
        Flag(),
        spec=ToSpec(identity=WHEN_CHANGED, derived=True),
    )
    method_config: dict[str, dict[str, Any]] = option(
        {},
        "a method hyper-parameter, e.g. lora.r=16 (repeatable)",
        Table(),
        spec=ToSpec(type=dict[str, Any], derived=True),
        cli={"action": "append", "metavar": "METHOD.FIELD=VALUE"},
    )
    method_config_file: list[str] = option(
        [],
        "PEFT's adapter_config.json (or the folder save_pretrained wrote it to), comma list for several: each "
        "runs its peft_type as method peft:TYPE with the file's fields as its config (added to --methods unless "
        "named there; --method-config peft:TYPE.FIELD=... sets a field over the file's)",
        Names(item=Text(path=True)),
    )
    device: str = option(
        "auto",
        "auto (default), cpu, cuda or cuda:N",
        Choice(choices=DEVICES, kind="device", prefix="cuda:"),
        spec=ToSpec(default="cpu", derived=True),
    )
    energy_meter: str = option(
        "auto",
        "auto (default: best measured source, else estimate), nvml, rapl, estimate, zeus (the zeus package's "
        "monitor: pip install 'petlprof[zeus]')",
        Text(known=_energy_meter),
        spec=SAME,
    )
    power_limit: list[str] = option(
        [],
        "NVIDIA GPUs: comma list of power limits to sweep, e.g. 300W,450W: each run's GPUs are set to its limit "
        "before it starts and put back after it (also after a failure or kill; a sweep killed itself restores them "
        "when resumed); needs the right to set it (root or CAP_SYS_ADMIN), refused up front without",
        Names(item=Watts()),
        spec=ToSpec("power_limit_w", float | None, None, identity=WHEN_SET, derived=True),
    )
    settle: bool = option(
        False,
        "NVIDIA GPUs: before its measured phases each run loads the GPU until its temperature holds (within 1 C "
        "over 10 s, at most 120 s), so every method runs on an equally warm chip; the train phase records it",
        Flag(),
        spec=ToSpec(identity=NEVER),
    )
    output: str | None = option(
        None,
        "output folder (default petlprof-out/run-<time>); re-running into it skips runs already recorded",
        PATH,
        spec=ToSpec("cache_dir", identity=NEVER, derived=True),  # where the cache spills: not what runs
    )
    in_process: bool = option(
        False, "run everything in this process (debugging; memory figures then depend on run order)", Flag()
    )
    timeout: float | None = option(
        None,
        "seconds a run may take before it is killed and recorded 'timeout'",
        Number(0.0, maximum=MAX_SECONDS, what="a positive number of seconds", optional=True),
    )
    max_memory: str | int | None = option(
        None,
        "memory a run may allocate beyond the runtime, e.g. 2GiB (CUDA: per-process fraction; CPU: address-space "
        "limit of the run's process); past it the run is 'oom'",
        Bytes(optional=True, minimum=MIN_RUN_MEMORY, why="the least a run can start in beyond the imported runtime"),
    )
    executor: str = option(
        LOCAL,
        "where runs execute: local (default: one after the other on this machine, a fresh process each) or ray "
        "(each run a Ray task on a cluster; pip install 'petlprof[ray]')",
        Choice(choices=EXECUTORS, kind="executor"),
    )
    address: str | None = option(
        None,
        "--executor ray: the cluster to join, e.g. auto or ray://head:10001 (default: RAY_ADDRESS, or a cluster "
        "`ray start` began on this machine, else a new local instance)",
        TEXT,
        ray_only=True,
    )
    retries: int = option(
        0,
        "--executor ray: times a run whose worker or node was lost is retried before it is recorded 'failed' "
        "(default {default})",
        Integer(0, 100),
        ray_only=True,
    )
    cpus_per_run: float = option(
        1.0,
        "--executor ray: CPUs each run's task asks for, per rank (default {default}; each rank's OMP_NUM_THREADS "
        "is set to it)",
        Number(0.0, maximum=2**20, what="a positive number of CPUs"),
        ray_only=True,
    )
    nproc_per_run: int = option(
        1,
        "data-parallel ranks of each run (torchrun semantics: one process per rank, one GPU each on CUDA; "
        "--batch-size stays the global batch). Default {default}",
        Integer(1, 2**16),
        spec=ToSpec("nproc", identity=WHEN_CHANGED),
    )
    cache_hidden_states: bool = option(
        False,
        "side-tuning methods (read, lst): keep the frozen backbone's hidden states after epoch 1, so later "
        "epochs run only the side network",
        Flag(),
        spec=WHEN_CACHING,
    )
    cache_budget: str | int = option(
        "1GiB",
        "memory for that cache, e.g. 2GiB (default {default}); past it the cache spills to a memory-mapped file "
        "in the output folder",
        Bytes(),
        spec=ToSpec("cache_budget_bytes", int | None, None, NEVER, copy_if=_cache, convert=_cache_bytes),
        only_with="cache_hidden_states",
    )
    cache_dtype: str = option(
        "float16",
        "precision of the cached states: float16 (default), bfloat16, float32",
        Choice(choices=CACHE_DTYPES, kind="cache dtype"),
        spec=WHEN_CACHING,
        only_with="cache_hidden_states",
    )
    skip_memory_check: bool = option(
        False,
        "run a configuration whose float32 weights, gradients and AdamW state alone (counted before the sweep on the "
        "model built without weights) exceed the memory this machine can give a run (CPU: MemAvailable; CUDA: the "
        "device's total) or --max-memory; without it such a sweep stops before any run, naming the figure",
        Flag(),
    )
    grid: bool = option(False, "sweep each method's default grid of its Pareto knob (see `petlprof list`)", Flag())
    skip_unsupported: bool = option(
        False,
        "run the rest of the sweep when a method cannot apply to a backbone (e.g. prefix tuning on a model "
        "without a key/value cache), naming the pairs left out; without it such a pair stops the sweep before any run",
        Flag(),
    )
    method_grid: dict[str, dict[str, list]] = option(
        {},
        "values of a method hyper-parameter to sweep, e.g. lora.r=4,16,64 (repeatable; several fields of one "
        "method are crossed)",
        Table(),
        cli={"action": "append", "metavar": "METHOD.FIELD=V1,V2,..."},
    )
    train_only: bool = option(
        False,
        "train and record the validation checks (--eval-every) alone: no evaluation, inference or generation phase "
        "and no scores on the evaluation split (what a search's trials run)",
        Flag(),
        spec=ToSpec(identity=WHEN_CHANGED),  # runs that evaluate keep their keys
    )
    tune: list[str] = option(
        [],
        "search each configuration's learning rate (lr) and/or its method's Pareto knob (METHOD.KNOB, e.g. "
        "lora.r, over the knob's grid) before its runs: successive halving over short pilots, each scored on the "
        "validation split (--val-size), then the chosen values trained at the full budget on every seed; every "
        "pilot is a real run recorded in the output folder's trials.jsonl, and its energy and time are charged to "
        "the configuration (`petlprof list` states each method's space)",
        Names(item=Text(non_empty=True, known=check_tune_target)),
        spec=ToSpec(identity=WHEN_CHANGED, convert=tune_targets),  # untuned runs keep their keys
    )
    tune_points: int | None = option(
        DEFAULT_TUNE_POINTS,
        "learning rates in each method's search space, log-spaced over its default x 10^[-1, 1] (default {default})",
        Integer(2, MAX_TUNE_POINTS, "points in a search space"),
        spec=ToSpec(default=None, identity=WHEN_SET, copy_if=_tuning),
        only_with="tune",
    )
    target_value: float | None = option(
        None,
        "stop each run's training once the target metric reaches this value (time-to-accuracy), checked every "
        "--eval-every steps",
        Number(optional=True),
        spec=WHEN_BUDGET,
    )
    target_metric: str | None = option(
        None,
        "metric of --target-value (default: the task's primary metric)",
        Text(optional=True, known=_metric),
        spec=WHEN_BUDGET,
    )
    eval_every: int | None = option(
        None,
        f"optimiser steps between validation checks: each check scores the validation split (--val-size) and "
        f"adds a point (step, training time and energy so far, metric) to the run's learning curve; with "
        f"--target-value it is also the target check (default: {DEFAULT_EVAL_EVERY} with --target-value, "
        "else no checks)",
        Integer(1, MAX_STEPS, optional=True),
        spec=ToSpec(default=None, identity=WHEN_SET, derived=True),  # resolved_eval_every
    )
    target_eval_size: int | None = option(
        None,
        "first N validation examples scored at each check (default: all of them)",
        Examples(optional=True),
        spec=ToSpec(default=None, identity=WHEN_SET, copy_if=_checks),
        only_with=("target_value", "eval_every"),
    )
    val_size: int | None = option(
        None,
        "validation examples carved from the training pool with the split seed, disjoint from the training and "
        "evaluation examples: the split every decision reads (target checks, learning curves); the evaluation "
        f"split is scored once, for the record (default: none; {DEFAULT_VAL_SIZE} when --target-value or "
        "--eval-every checks)",
        Integer(1, 10**9, "examples", optional=True),
        spec=ToSpec(identity=WHEN_SET, derived=True),  # resolved_val_size
    )
    val_file: str | None = option(
        None,
        "your own validation file (CSV/TSV/JSON Lines/Parquet, the columns of your training file) as the validation "
        "split, instead of examples carved from the training pool: all its rows, or --val-size of them drawn with "
        "the split seed (only for a task read from your files)",
        PATH,
        spec=ToSpec(identity=WHEN_SET),  # runs without one keep their keys
    )
    max_train_time: float | None = option(
        None,
        "stop each run's training after this many seconds",
        Number(0.0, maximum=MAX_SECONDS, what="a positive number of seconds", finite="a number", optional=True),
        spec=ToSpec("max_train_time_s", identity=WHEN_SET, copy_if=_budget),
    )
    meters: list[str] = option(
        [],
        "extra meters beside energy and memory, comma list: codecarbon (g CO2-eq), cpu-tensors (peak live CPU "
        "tensor bytes; slows the run). Off by default",
        Names(item=Text(known=_extra_meter)),
        spec=ToSpec("extra_meters", identity=NEVER, convert=list),
    )
    country_code: str | None = option(
        None,
        "ISO alpha-3 country for codecarbon's carbon intensity (default USA)",
        Text(optional=True, known=_country),
        spec=ToSpec(identity=NEVER),
    )
    memory_snapshot: bool = option(
        False,
        "CUDA: dump a memory snapshot of each phase into <output>/memory-snapshots (open it at "
        "https://pytorch.org/memory_viz)",
        Flag(),
        spec=ToSpec("memory_snapshot_dir", str | None, None, NEVER, derived=True),
    )
    inference_window_s: float | None = option(
        None,
        "seconds the inference phase repeats each batch size for (default 5 with a measured energy meter, 0.5 "
        "with the estimate)",
        Number(0.0, inclusive=True, maximum=MAX_WINDOW_S, what="a number of seconds >= 0", optional=True),
        spec=ToSpec(identity=NEVER),
    )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


OPTIONS = {f.name: f for f in dataclasses.fields(RunOptions)}


def kind_of(name: str) -> Kind:
    return OPTIONS[name].metadata["kind"]


def default_of(name: str) -> Any:
    f = OPTIONS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _shown_default(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per option, named ``--the-option``, with its help (its default shown from the
    declaration); every default is None, so an option not given does not override a config file."""
    for name, f in OPTIONS.items():
        meta = f.metadata
        kind: Kind = meta["kind"]
        help_text = meta["help"].format(default=_shown_default(default_of(name)))
        if isinstance(kind, Flag):
            parser.add_argument(flag(name), action="store_true", default=None, help=help_text)
        elif meta["cli"]:
            parser.add_argument(flag(name), help=help_text, **meta["cli"])
        else:
            parser.add_argument(flag(name), type=_argtype(name, kind), help=help_text)


def _argtype(name: str, kind: Kind) -> Callable[[str], Any]:
    """How argparse reads the option's text: as the kind reads it (numeric text becomes the number), text
    that is not one kept as it is, so the kind's check refuses it in one line (argparse's own type error
    prints the whole usage)."""
    if isinstance(kind, Examples):
        return _size_or_all
    return kind.read


def _size_or_all(text: str):
    """A number of examples, or ``all`` (kept as the word, so that it is not mistaken for "not given")."""
    return "all" if text.lower() in ("all", "none") else Examples().read(text)


def help_of(name: str) -> str:
    """The option's help as ``--help`` shows it, its default filled in from the declaration."""
    return OPTIONS[name].metadata["help"].format(default=_shown_default(default_of(name)))
