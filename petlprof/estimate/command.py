"""``petlprof estimate``: its options, the printed table, ``estimates.jsonl`` and the memory-vs-size plot."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from petlprof.errors import UsageError, printable, say
from petlprof.estimate import gpus
from petlprof.estimate.attention import ATTENTIONS, DEFAULT_ATTENTION, FLASH, check_attention, check_flash_support
from petlprof.estimate.lm import DEFAULT_TARGET_LENGTH, check_family
from petlprof.method_api import check_objective
from petlprof.models.families import ENCODER
from petlprof.models.quantization import NONE, Quantization
from petlprof.results.figures import (
    BREAKDOWN_GRADIENTS,
    BREAKDOWN_QUANTIZATION_STATE,
    ENERGY,
    ENERGY_PER_TOKEN,
    TIME,
    TOKENS_PER_S,
)
from petlprof.sweep.options import OPTIONS, TRAINING_SETTINGS, default_of, help_of, kind_of
from petlprof.values import J_PER_KWH, Flag, Integer, flag, parse_bytes
from petlprof.vocabulary import ADAMW, CLASSIFICATION, FLOAT32, FP32, LM, ZERO_SHOT

if TYPE_CHECKING:  # both import torch: not for --help
    from petlprof.estimate.core import Estimate, EstimateRecord, Settings
    from petlprof.estimate.model import ResolvedBackbone

GIB = 1024**3


def add_estimate_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``estimate`` on the ``petlprof`` sub-command parsers."""
    parser = sub.add_parser(
        "estimate",
        help="every method's parameters, memory and FLOPs at any model size from the config alone (no weights, no GPU)",
    )
    add_estimate_options(parser, "estimate")
    parser.add_argument("--list-shapes", action="store_true", help="print the bundled shapes and exit")
    return parser


def add_estimate_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The estimate's options on ``parser`` (``petlprof estimate``'s or ``plan``'s).  The options it shares with
    ``petlprof run`` come from their one declaration (:mod:`petlprof.sweep.options`: the same default, kind and
    check); where one means something else without a task, a dataset or a device, its help says how, and the comment
    why."""
    # an estimate reads only the config: a bundled shape or config.json needs no --random-init, as the run help says
    _add_run_option(
        parser,
        "backbone",
        "a bundled shape (t5-large, llama-3-8b, ...; `petlprof estimate --list-shapes`), a preset (minilm, "
        "smollm2, tiny-*), a config.json, a model folder or a hub id; comma list for several (default {default})",
    )
    # a run needs its methods named; an estimate is cheap enough to price every one
    _add_run_option(
        parser,
        "methods",
        "comma list of methods (default: every registered method that trains on --objective and runs on each "
        "--quantize value)",
    )
    _add_run_option(parser, "method_config")
    _add_run_option(parser, "grid")
    _add_run_option(parser, "batch_size", "{run}; the training and the inference batch")
    # a run truncates to --max-length; an estimate has no text and prices the longest batch that allows
    _add_run_option(parser, "max_length", "{run}; an estimate prices every row full; with --objective lm the prompt's")
    _add_run_option(parser, "num_layers")
    # a run always has a task (tweets by default); an estimate has none unless given one, and then prices its rows
    parser.add_argument(
        "--task",
        help="price each step at the lengths this task's longest training batch pads to, as a run tokenises them "
        "(--train-size examples of it; the LM objective: its prompt and target, so --target-length is the data's; "
        "a classifier: its texts, within --max-length), instead of every row --max-length tokens; a backbone "
        "needs its tokenizer here (a preset, a model folder or a hub id: not a bundled shape)",
    )
    # a run reads its examples from its task; an estimate has none: the training length its predicted totals price
    _add_run_option(
        parser,
        "train_size",
        "{run}; an estimate has no data: the examples whose predicted training time and energy it totals, as a run "
        "with --epochs or --max-steps would train them ('all': no totals)",
    )
    _add_run_option(parser, "epochs")
    _add_run_option(parser, "max_steps")
    parser.add_argument(
        "--num-labels", type=_INTEGER.read, default=2, help="classes of the task head (default 2; classification)"
    )  # a run reads it from its task
    # an estimate has no task for auto to read: auto prices what a backbone of its family is tuned for
    _add_run_option(
        parser,
        "objective",
        "{run}. An estimate has no task: auto is lm for a decoder or encoder-decoder backbone and classification "
        "for an encoder (the output names the one it took); classification prices a pooled state and a linear "
        "head, lm the backbone's own LM head: logits over the vocabulary at the target's positions, a prompt of "
        "--max-length and a target of --target-length tokens, and the KV cache per generated token",
    )
    parser.add_argument(
        "--target-length",
        type=_INTEGER.read,
        help=f"the LM objective's target tokens per example (default {DEFAULT_TARGET_LENGTH}); a decoder reads "
        "prompt + target, an encoder-decoder's decoder only the target",
    )  # a run reads its targets from its task
    _add_run_option(parser, "precision", "{run}; bf16/fp16 follow --device's autocast rules")
    for name in QUANTIZE_OPTIONS:
        _add_run_option(parser, name)
    for name in TRAINING_SETTINGS:
        _add_run_option(parser, name)
    parser.add_argument(
        "--attention",
        default=DEFAULT_ATTENTION,
        help=f"{'|'.join(ATTENTIONS)}: the attention implementation the step runs: eager (transformers' own code: "
        "the batch x heads x length x length scores, probabilities and dropout mask kept for backward), sdpa "
        "(default, as a run builds the model: scaled_dot_product_attention, its kernel the --device's choice; "
        "eager where an architecture has no sdpa) or flash (the flash-attention kernel forced: fp16/bf16 on cuda)",
    )
    # an estimate runs on no device: auto cannot pick the one present, so it prices a GPU's kernels, what runs use
    _add_run_option(
        parser,
        "device",
        "{run}. An estimate runs nowhere: the device whose kernel choices (attention, recurrent layers, AdamW) and "
        "autocast rules the step follows: cuda (an sm80+ GPU such as A100/H100/H200; auto means it) or cpu (what "
        "`cpu-tensors` measures)",
    )
    parser.add_argument(
        "--device-memory",
        help="say whether each peak fits this size, e.g. 24GiB (less the CUDA context and the allocator's slack, "
        "as every fit verdict)",
    )
    parser.add_argument(
        "--gpu",
        default=gpus.DEFAULT_GPU,
        help=f"GPU for the step-time lower bound: {', '.join(gpus.GPUS)} (default {gpus.DEFAULT_GPU})",
    )
    # an estimate writes estimates.jsonl afresh (nothing to resume), to a folder of its own name
    _add_run_option(parser, "output", f"output folder (default petlprof-out/{command}-<time>)")


_INTEGER = Integer()  # reads integer text as the number, keeps other text for the check to refuse in one line
QUANTIZE_OPTIONS = ("quantize", "quantize_compute_dtype", "quantize_double")
BUDGET_OPTIONS = ("train_size", "epochs", "max_steps")  # the training length the predicted totals price
CHECKED_OPTIONS = (  # the run options' checks
    "batch_size",
    "max_length",
    "num_layers",
    "objective",
    "precision",
    "device",
    "train_size",
    "epochs",
    "max_steps",
)
AUTO = "auto"  # the run options' --objective and --device that a run resolves from its task and its machine


def _add_run_option(parser: argparse.ArgumentParser, name: str, help: str = "{run}") -> None:
    """A run option on the estimate's parser from its one declaration: its default, how it is read, argparse's
    extras (``--method-config``'s ``append``) and its help, or ``help`` where the estimate says more (``{run}``:
    the declaration's help) or means it otherwise (the reason in a comment where it is added)."""
    kind, default = kind_of(name), default_of(name)
    help_text = help.format(run=help_of(name), default=",".join(default) if isinstance(default, list) else default)
    cli = OPTIONS[name].metadata["cli"]
    if isinstance(kind, Flag):
        parser.add_argument(flag(name), action="store_true", help=help_text)
    elif cli:  # an entry given repeatedly: none given is None, as on the run's parser
        parser.add_argument(flag(name), help=help_text, **cli)
    else:
        parser.add_argument(flag(name), type=kind.read, default=default, help=help_text)


def _quantizations(args: argparse.Namespace, methods: list[str]) -> list:
    """One :class:`~petlprof.models.quantization.Quantization` (None for ``none``) per ``--quantize`` value, checked as
    ``petlprof run`` checks them (:func:`petlprof.sweep.config.validate_quantize`): every method must declare
    that it runs on such a backbone."""

    # kept out of petlprof --help's imports
    from petlprof.sweep.config import validate_quantize, validate_training_settings

    for name in QUANTIZE_OPTIONS:
        kind_of(name).check(name, getattr(args, name))
    for name in TRAINING_SETTINGS:
        kind_of(name).check(name, getattr(args, name))
    given = SimpleNamespace(**{n: getattr(args, n) for n in (*QUANTIZE_OPTIONS, *TRAINING_SETTINGS)}, methods=methods)
    validate_quantize(given)
    validate_training_settings(SimpleNamespace(**vars(given), precision=args.precision))
    return [
        None if q == NONE else Quantization(q, args.quantize_compute_dtype, args.quantize_double)
        for q in dict.fromkeys(args.quantize)
    ]


MAX_TOKENS = 2**27  # the traced batch is real (ids and mask, 16 bytes a token): 2 GiB at most


def _batch_tokens(batch_size: int, max_length: int, target_length: int | None = None) -> None:
    tokens = batch_size * (max_length + (target_length or 0))
    if tokens > MAX_TOKENS:
        target = f" + --target-length {target_length}" if target_length else ""
        raise UsageError(
            f"--batch-size {batch_size} x --max-length {max_length}{target} = {tokens} tokens is more than "
            f"{MAX_TOKENS}, the largest batch an estimate builds (its token ids are real tensors)"
        )


def _check_target_length(args: argparse.Namespace) -> None:
    """``--target-length`` in its range, and not beside ``--objective classification``, in one line."""
    if args.target_length is None:
        return
    if args.objective == CLASSIFICATION:
        raise UsageError(
            "--target-length is the language-modelling objective's; --objective classification prices a classifier "
            "head: use --objective lm"
        )
    Integer(minimum=1, maximum=MAX_TOKENS, why="tokens an estimate builds").check("target_length", args.target_length)


def _objective_of(args: argparse.Namespace, backbone_family: str) -> str:
    """The objective an estimate prices a backbone of ``backbone_family`` on: ``--objective``, or for ``auto``
    (an estimate has no task to read) the one such a backbone is tuned for: the LM objective for a decoder or an
    encoder-decoder, a classifier head for an encoder (which has no LM head)."""
    if args.objective != AUTO:
        return args.objective
    return CLASSIFICATION if backbone_family == ENCODER else LM


def _with_objective(settings: Settings, objective: str, args: argparse.Namespace) -> Settings:
    """``settings`` on ``objective``: the LM objective with its target length (``--target-length`` or its default)."""
    if objective != LM:
        return dataclasses.replace(settings, objective=objective, target_length=None)
    target = DEFAULT_TARGET_LENGTH if args.target_length is None else args.target_length
    _batch_tokens(settings.batch_size, settings.max_length, target)
    return dataclasses.replace(settings, objective=LM, target_length=target)


def _by_objective(args: argparse.Namespace, resolved: list[ResolvedBackbone]) -> dict[str, list[ResolvedBackbone]]:
    """The backbones by the objective each is priced on (:func:`_objective_of`), in the order first named; with
    ``auto``, a ``--target-length`` that no backbone's objective reads is refused in one line."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.model import family

    groups: dict[str, list[ResolvedBackbone]] = {}
    for backbone in resolved:
        groups.setdefault(_objective_of(args, family(backbone)), []).append(backbone)
    if args.target_length is not None and LM not in groups:
        names = ", ".join(f"'{backbone.name}'" for backbone in resolved)
        what = "backbone {} is an encoder" if len(resolved) == 1 else "backbones {} are encoders"
        raise UsageError(
            f"--target-length is the language-modelling objective's; {what.format(names)}, priced with a "
            "classification head (--objective auto), as an encoder has no LM head"
        )
    return groups


def _objective_line(args: argparse.Namespace, settings: Settings, backbones: list[ResolvedBackbone]) -> str | None:
    """What ``--objective auto`` took for ``backbones`` and why (None where ``--objective`` was given)."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.model import family

    if args.objective != AUTO:
        return None
    families = list(dict.fromkeys(family(backbone) for backbone in backbones))
    if settings.objective == CLASSIFICATION:
        return "objective: classification (the default for an encoder backbone, which has no LM head)"
    kinds = " or ".join(families)
    article = "an" if kinds.startswith("e") else "a"
    target = " (its default)" if args.target_length is None else ""
    return (
        f"objective: lm (the default for {article} {kinds} backbone; --objective classification for a classifier "
        f"head), a target of --target-length {settings.target_length} tokens{target} after a prompt of --max-length "
        f"{settings.max_length}"
    )


def _configurations(methods: list[str], overrides: dict[str, dict], grid: bool) -> list[tuple[str, dict]]:
    """(method as --methods names it, its option overrides) for every configuration to estimate; as for
    ``petlprof run``, --method-config addresses a plug-in given as ``module:ATTR`` by its MethodSpec's name."""
    # kept out of petlprof --help's imports
    from petlprof.registry import get_method, methods_by_name

    named = methods_by_name(methods)
    unknown = set(overrides) - set(named)
    if unknown:
        raise UsageError(f"--method-config names method(s) not in --methods: {', '.join(sorted(unknown))}")
    out = []
    for name, given in named.items():
        method_spec = get_method(given)
        method_spec.make_config(overrides.get(name))  # a bad option is refused before anything is traced
        for values in method_spec.grid_configs() if grid else [{}]:
            out.append((given, {**values, **overrides.get(name, {})}))
    return out


def _check_applies(
    resolved,
    configurations: list[tuple[str, dict]],
    objective: str = CLASSIFICATION,
    attention: str = DEFAULT_ATTENTION,
) -> None:
    # kept out of petlprof --help's imports
    from petlprof.estimate.model import build_backbone_model, family
    from petlprof.models.architecture import describe, unsupported_reason
    from petlprof.registry import get_method

    if objective == LM:
        check_family(family(resolved), resolved.name)
        for name, _ in configurations:
            check_objective(get_method(name), LM)
    model = build_backbone_model(resolved, lm_head=objective == LM, attention=attention)  # once, on the meta device
    if attention == FLASH:
        check_flash_support(model, resolved.name)
    architecture = describe(model)
    for name, overrides in configurations:
        reason = unsupported_reason(name, architecture, overrides)
        if reason is not None:
            raise UsageError(f"method '{name}' cannot apply to backbone '{resolved.name}': {reason}")


def _default_methods(objective: str, quantize: list[str]) -> tuple[list[str], list[str]]:
    """(every built-in method that trains on ``objective`` and runs on each ``--quantize`` value, those left out
    because a quantised backbone stores the weights they train packed): the zero-shot row trains nothing, so
    it has no step to price."""
    # kept out of petlprof --help's imports
    from petlprof.registry import get_method, method_names

    trains = [m for m in method_names() if m != ZERO_SHOT and objective in get_method(m).objectives]
    runs = [m for m in trains if all(q in get_method(m).quantize for q in quantize)]
    return runs, [m for m in trains if m not in runs]


def _settings(args: argparse.Namespace, needs_prediction: str = ""):
    """The settings every estimate of the command shares, its options checked (one line, exit 2); ``needs_prediction``:
    :func:`price`'s."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.core import Settings

    for name in CHECKED_OPTIONS:  # the run options' checks: one line, exit 2
        kind_of(name).check(name, getattr(args, name))
    Integer(minimum=1).check("num_labels", args.num_labels)
    device = "cuda" if args.device == AUTO else args.device  # see --device: an estimate prices a GPU by default
    check_attention(args.attention, args.precision, device)
    _check_target_length(args)
    objective = CLASSIFICATION if args.objective == AUTO else args.objective  # auto: decided per backbone
    settings = Settings(
        batch_size=args.batch_size,
        max_length=args.max_length,
        num_labels=args.num_labels,
        device_memory_bytes=parse_bytes(args.device_memory, "--device-memory"),
        gpu=gpus.get_gpu(args.gpu).name,
        precision=args.precision,
        device=device,
        objective=objective,
        attention=args.attention,
        device_model=_device_model(device, gpus.get_gpu(args.gpu), needs_prediction),
        **{name: getattr(args, name) for name in (*TRAINING_SETTINGS, *BUDGET_OPTIONS)},
    )
    _batch_tokens(settings.batch_size, settings.max_length)
    return _with_objective(settings, objective, args)


def _device_model(device: str, gpu, needs_prediction: str = ""):
    """What time and energy are predicted on: this machine's calibrated profile of ``device`` where there is one,
    else, on cuda, the GPU table's ``--gpu`` with default efficiencies; None on a CPU without a profile (the output
    says why), where ``needs_prediction`` names the options that need one: then a UsageError saying why."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.profiles import load_profile
    from petlprof.estimate.roofline import table_model

    model, why = load_profile(device) if device == "cpu" else (None, "")
    if model is None and device.startswith("cuda"):
        return table_model(gpu)
    if model is None and needs_prediction:
        raise UsageError(f"{needs_prediction}: a time or energy budget needs them predicted, and none is: {why}")
    if model is None:
        say(f"petlprof: no time or energy prediction: {why}")
    return model


@dataclasses.dataclass
class Priced:
    """The estimates of one objective: what they were priced under (``plan``) and their records."""

    plan: _Plan
    records: list[EstimateRecord]


def price(args: argparse.Namespace, command: str, needs_prediction: str = "") -> tuple[Path, list[Priced]]:
    """Check ``args`` (the estimate's options), then estimate every configuration they name into ``estimates.jsonl`` of
    the output folder (``petlprof-out/<command>-<time>`` unless given); return the folder and the estimates per
    objective.  ``needs_prediction``: the options that need time and energy predicted, refused in one line (before
    anything is traced or written) on a device without a model of them."""
    # kept out of petlprof --help's imports
    from petlprof.meters.memory import live_objects_unscanned
    from petlprof.run.libraries import import_runtime_libraries

    settings = _settings(args, needs_prediction)
    # what the estimate builds and traces rests on the run's libraries: those not imported yet imported as a run's
    # process imports them (bitsandbytes' compilation deferred), and all of them out of the garbage collector's scans
    # while the estimate runs, which walked them again and again while models were built and traced (`petlprof
    # estimate --backbone t5-3b` 11.3-11.4 s against 12.8 s, tiny-bert 4.2-4.3 s against 4.7-4.8 s, two alternating
    # runs each, measured here)
    with live_objects_unscanned(functools.partial(import_runtime_libraries, freeze=True)):
        return _priced(args, command, settings)


def _priced(args: argparse.Namespace, command: str, settings: Settings) -> tuple[Path, list[Priced]]:
    """:func:`price`, once its options are checked."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.core import estimate
    from petlprof.estimate.model import resolve_backbone
    from petlprof.results.store import check_writable
    from petlprof.sweep.config import parse_method_overrides

    resolved = [resolve_backbone(backbone, args.num_layers) for backbone in args.backbone]
    overrides = parse_method_overrides(args.method_config or [])
    plans = [
        _plan(args, settings, objective, backbones, overrides)
        for objective, backbones in _by_objective(args, resolved).items()
    ]
    # a task's lengths are read (and a backbone without a tokenizer refused) before anything is written
    lengths = {
        (i, b.name): _task_lengths(args, plan.settings, b.name) for i, plan in enumerate(plans) for b in plan.backbones
    }
    out = Path(args.output or f"petlprof-out/{command}-{time.strftime('%Y%m%d-%H%M%S')}")
    check_writable(out)  # the check `petlprof run --output` makes, before any estimate is traced
    priced: list[Priced] = []
    with open(out / "estimates.jsonl", "w") as fh:
        for index, plan in enumerate(plans):
            records: list[EstimateRecord] = []
            for backbone in plan.backbones:
                task_lengths = lengths[index, backbone.name]
                at = dataclasses.replace(
                    plan.settings,
                    max_length=task_lengths.get("max_length", plan.settings.max_length),
                    target_length=task_lengths.get("target_length", plan.settings.target_length),
                )
                for quantization in plan.quantizations:
                    swept = dataclasses.replace(at, quantization=quantization)
                    for name, method_overrides in plan.configurations:
                        record = estimate(backbone, name, method_overrides, swept)
                        fh.write(json.dumps(record) + "\n")
                        fh.flush()
                        records.append(record)
            priced.append(Priced(plan, records))
    return out, priced


def _task_lengths(args: argparse.Namespace, settings: Settings, backbone: str) -> dict[str, int]:
    """With ``--task``: the settings' lengths for ``backbone`` (``max_length``, and the LM objective's
    ``target_length``) at the task's longest training batch, as a run of it tokenises it; none without one."""
    if not args.task:
        return {}
    # the task's data and the run's tokenisation: kept out of petlprof --help's imports
    from petlprof.estimate.runs import training_row_lengths
    from petlprof.sweep.config import sweep_task
    from petlprof.sweep.lengths import longest_rows
    from petlprof.sweep.options import RunOptions

    options = RunOptions(
        task=[args.task], objective=settings.objective, max_length=settings.max_length, train_size=args.train_size
    )
    task = sweep_task(options, args.task)
    try:
        if settings.objective == LM:
            prompt, target = longest_rows(options, args.task, task, backbone)
            return {"max_length": prompt, "target_length": target}
        lengths = training_row_lengths(task.train, backbone, settings.max_length)
    except (OSError, ValueError) as error:  # a bundled shape: a config without its tokenizer
        raise UsageError(
            f"--task {args.task} needs backbone '{backbone}'s tokenizer to read its lengths, and it has none here "
            f"({type(error).__name__}): give --max-length (and --target-length) instead"
        ) from None
    return {"max_length": max(lengths, default=1)}


def _lengths_line(args: argparse.Namespace, records: Sequence[EstimateRecord]) -> str | None:
    """With ``--task``: the lengths each backbone was priced at (they replace the header's)."""
    if not args.task:
        return None
    at = {
        r["backbone"]: f"{r['max_length']}"
        + (f" prompt + {r['target_length']} target" if r.get("target_length") else "")
        for r in records
    }
    each = ", ".join(f"{backbone} {tokens} tokens" for backbone, tokens in at.items())
    task = f"task '{args.task}' ({args.train_size} examples)"
    return f"lengths: the longest training batch of {task}, as a run tokenises it: {each}"


def cmd_estimate(args: argparse.Namespace) -> int:
    # kept out of petlprof --help's imports
    from petlprof.models.shapes import shape_names

    if args.list_shapes:
        print("\n".join(shape_names()))
        return 0
    out, priced = price(args, "estimate")
    tables = []
    for each in priced:
        line = _objective_line(args, each.plan.settings, each.plan.backbones)
        table = format_table(each.records, each.plan.settings, each.plan.left_out)
        lengths = _lengths_line(args, each.records)
        tables.append("\n".join([*([line] if line else []), *([lengths] if lengths else []), table]))
    print("\n\n".join(tables))
    print()
    print(printable(f"wrote {out / 'estimates.jsonl'}"))
    if len(args.backbone) > 1:
        records = [record for each in priced for record in each.records]
        print(printable(f"wrote {plot_memory_vs_size(records, out / 'peak_train_memory.png')}"))
    return 0


@dataclasses.dataclass
class _Plan:
    """What an estimate prices on one objective: its settings, backbones, quantisations and method configurations
    (``left_out``: the default methods a quantised backbone refuses)."""

    settings: Settings
    backbones: list[ResolvedBackbone]
    quantizations: list
    configurations: list[tuple[str, dict]]
    left_out: list[str]


def _plan(args, settings: Settings, objective: str, backbones: list[ResolvedBackbone], overrides: dict) -> _Plan:
    """The :class:`_Plan` of ``backbones`` on ``objective``, every configuration checked to apply to each."""
    settings = _with_objective(settings, objective, args)
    left_out: list[str] = []
    methods: list[str] = args.methods
    if not methods:
        methods, left_out = _default_methods(objective, list(args.quantize))
    quantizations = _quantizations(args, methods)
    configurations = _configurations(methods, overrides, args.grid)
    for backbone in backbones:
        _check_applies(backbone, configurations, objective, settings.attention)
        _check_length(backbone, settings)
    return _Plan(settings, backbones, quantizations, configurations, left_out)


def _check_length(backbone: ResolvedBackbone, settings: Settings) -> None:
    """The positions a step reads fit the backbone's: ``--max-length`` as a run checks it, and a decoder's LM
    sequence is prompt + target."""
    # kept out of petlprof --help's imports
    from petlprof.models.backbones import check_shape

    check_shape(backbone.name, backbone.config, max_length=settings.max_length)
    positions = getattr(backbone.config, "max_position_embeddings", None)
    if positions is None:
        return
    target = settings.target_length or 0
    encoder_decoder = getattr(backbone.config, "is_encoder_decoder", False)
    read = target if encoder_decoder else settings.max_length + target
    if target and read > positions:
        what = "" if encoder_decoder else f" (a decoder reads --max-length {settings.max_length} + it)"
        raise UsageError(
            f"--target-length {target}{what} exceeds the {positions} positions of backbone '{backbone.name}'"
        )


def _scaled(value: float, units: tuple[str, ...], step: float) -> str:
    """``value`` in the largest unit it reaches, with three significant figures: '1.23 GiB'."""
    index = 0
    while index < len(units) - 1 and abs(value) >= step:
        value, index = value / step, index + 1
    return f"{value:.3g} {units[index]}"


def size(value: int) -> str:
    return _scaled(value, ("B", "KiB", "MiB", "GiB", "TiB"), 1024)


def flops(value: int) -> str:
    return _scaled(value, ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"), 1000)


def seconds(value: float) -> str:
    return f"{value * 1e6:.3g} us" if value < 1e-3 else f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _smallest_fit(fits: dict[str, bool | None]) -> str:
    sizes = sorted(gpus.GPUS[name].memory_gib for name, ok in fits.items() if name in gpus.GPUS and ok)
    return f"{sizes[0]:g} GiB" if sizes else "none"


def config_label(record: Mapping[str, Any]) -> str:
    """A record's configuration by its Pareto knob (``r=8``), empty for a method without one."""
    knob = record["pareto_knob"]
    return f"{knob}={record['method_config'][knob]}" if knob else ""


def table_rows(records: Sequence[EstimateRecord], settings) -> list[dict[str, Any]]:
    """One row of strings per record, every number with its unit."""
    # kept out of petlprof --help's imports
    from petlprof.estimate.core import META_TRACE

    rows = []
    quantized = any(record.get("quantize", "none") != "none" for record in records)
    for record in records:
        row = {"backbone": record["backbone"], "method": record["method"], "config": config_label(record)}
        if quantized:
            row["quantize"] = _quantize_label(record)
        if record["status"] != "ok":
            rows.append({**row, "note": record["error"]})
            continue
        memory, counts, bound = record["memory"], record["flops"], record["step_time_lower_bound"]
        row.update(
            {
                "dtype": _dtype_label(record),
                "attention": _attention_label(record),
                "trainable_params": f"{record['trainable_params']:,}",
                "total_params": f"{record['total_params']:,}",
                "weights": size(memory["weights_bytes"]),
                **({"quant_state": _state_label(memory)} if quantized else {}),
                "gradients": size(memory[BREAKDOWN_GRADIENTS]),
                "adamw_state": size(memory["optimizer_bytes"]),
                "peak_train": size(memory["peak_train_bytes"]),
                "peak_inference": size(memory["peak_inference_bytes"]),
                "train_step": flops(counts["train_step"]),
                "inference_batch": flops(counts["inference_batch"]),
                f"step_time>= ({settings.gpu})": seconds(bound["train_step_s"]),
                **_predicted_cells(record),
                "train_fits_from": _smallest_fit(record["fits_train"]),
            }
        )
        if "lm" in record:
            lm = record["lm"]
            row["logits"] = size(lm["logits_bytes"])
            row["kv_cache/token"] = size(lm["kv_cache"]["bytes_per_generated_token"])
            row["kv_cache_at_end"] = size(lm["kv_cache"]["bytes_at_end"])
        if settings.device_memory_bytes is not None:
            row[f"fits {size(settings.device_memory_bytes)}"] = "yes" if record["fits_train"]["device_memory"] else "no"
        notes = [record["estimate_source"]] if record["estimate_source"] != META_TRACE else []
        if record.get("config_dtype") not in (None, record["dtype"]):
            notes.append(f"the config asks for {record['config_dtype']}; built {record['dtype']} (--precision decides)")
        if notes:
            row["note"] = "; ".join(notes)
        rows.append(row)
    return rows


def _predicted_cells(record: EstimateRecord) -> dict[str, str]:
    """The predicted train step time and energy, and the training's totals where a length was given (none where
    nothing was predicted)."""
    predicted: Any = record.get("predicted")
    if not predicted:
        return {}
    cells = {
        "train_step_predicted": seconds(predicted["train_step_s"]),
        "energy/step_predicted": joules(predicted["train_step_energy_j"]),
    }
    if total := predicted.get("train_total"):
        cells["train_time_predicted"] = duration(total[TIME.name])
        cells["train_energy_predicted"] = joules(total[ENERGY.name])
    if generated := predicted.get("generation"):
        cells["generation_predicted"] = f"{generated[TOKENS_PER_S.name]:,.3g} tokens/s"
        cells["energy/token_predicted"] = joules(generated[ENERGY_PER_TOKEN.name])
    return cells


def duration(value: float) -> str:
    """Seconds as the largest unit that keeps them readable: ``12.9 ms``, ``41.3 s``, ``7.2 min``, ``3.05 h``."""
    if value >= 3600:
        return f"{value / 3600:.3g} h"
    if value >= 60:
        return f"{value / 60:.3g} min"
    return seconds(value)


def joules(value: float) -> str:
    """Joules, and kWh from a tenth of one on (``4.12 J``, ``9.1e+04 J``, ``2.5 kWh``)."""
    return f"{value / J_PER_KWH:.3g} kWh" if value >= J_PER_KWH / 10 else f"{value:,.3g} J"


def totals_line(records: Sequence[EstimateRecord]) -> str | None:
    """What the totals price, from the first record that has them: examples, epochs or steps, and the steps counted."""
    for record in records:
        predicted: Any = record.get("predicted") or {}
        if total := predicted.get("train_total"):
            length = (
                f"--max-steps {total['max_steps']}"
                if total["max_steps"] is not None
                else f"{total['epochs']} epoch(s) of {total['train_size']:,} examples"
            )
            return (
                f"train_time/train_energy_predicted: {length} = {total['optimiser_steps']:,} optimiser steps "
                f"({total['batches']:,} batches; the warm-up steps among them), each batch priced full (--train-size, "
                "--epochs, --max-steps; the run's defaults unless given)"
            )
    return None


def _state_label(memory: dict[str, int]) -> str:
    """The quantisation state's bytes, ``-`` for an unquantised row."""
    state = memory.get(BREAKDOWN_QUANTIZATION_STATE)
    return "-" if state is None else size(state)


def _quantize_label(record: EstimateRecord) -> str:
    """``none``, ``int8``, or ``nf4`` with its compute dtype and ``+dq`` for double quantisation."""
    method = record.get("quantize", "none")
    if method in ("none", "int8"):
        return method
    return f"{method} {record['quantize_compute_dtype']}{'+dq' if record['quantize_double'] else ''}"


def _dtype_label(record: Estimate) -> str:
    """The weights' dtype, and the autocast dtype the step computes in where it differs."""
    if record["precision"] == FP32:
        return record["dtype"]
    return f"{record['dtype']}+{record['precision']} autocast"


def _attention_label(record: Estimate) -> str:
    """The implementation built and, for sdpa, the kernels the training step ran: ``sdpa/flash``."""
    attention = record["attention"]
    kernels = "+".join(attention["train_kernels"])
    return f"{attention['implementation']}/{kernels}" if kernels else attention["implementation"]


def format_table(records: Sequence[EstimateRecord], settings: Settings, left_out: Sequence[str] = ()) -> str:
    rows = table_rows(records, settings)
    lines = [
        f"batch {settings.batch_size} x {_tokens(settings)}, {_training(settings)}, {_precision(settings)}; "
        "step_time>= is a lower bound: FLOPs / the GPU's peak (see the GPU table in docs/estimating.md)",
        f"attention: the implementation built / the kernels its training step ran (--attention {settings.attention})",
        f"fits: peak <= (GPU memory - {size(gpus.CUDA_CONTEXT_BYTES)} CUDA context) x {1 - gpus.ALLOCATOR_SLACK:g} "
        f"(the allocator's {gpus.ALLOCATOR_SLACK:.0%} slack): {size(gpus.usable_bytes(24 * GIB))} of a 24 GiB card; "
        "sources in docs/estimating.md",
    ]
    if budget := totals_line(records):
        lines.append(budget)
    if left_out:
        lines.append(
            f"left out: {', '.join(left_out)} (they train weights a --quantize {','.join(_quantized(records))} "
            "backbone stores packed and frozen)"
        )
    if settings.objective == LM:
        lines.append(
            f"lm: the loss counts the {settings.target_length} target positions of each row; logits: the LM head's "
            "output (batch x positions x vocabulary) the step creates; kv_cache/token: bytes the generation cache "
            "grows per generated token at this batch (2 x layers x kv_heads x head_dim x dtype bytes x batch); "
            "kv_cache_at_end: after the prompt and the target"
        )
    return "\n".join([*lines, *aligned(rows)])


def aligned(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``rows`` (column -> cell) as left-aligned text lines under a header of every column any row has; a row's
    ``note`` goes on a line of its own below it."""
    columns = list(dict.fromkeys(key for row in rows for key in row if key != "note"))
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    for row in rows:
        lines.append("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))
        if row.get("note"):
            lines.append(f"    note: {row['note']}")
    return lines


def _quantized(records: Sequence[EstimateRecord]) -> list[str]:
    return list(dict.fromkeys(r["quantize"] for r in records if r.get("quantize", "none") != "none"))


def _tokens(settings) -> str:
    if settings.objective != LM:
        return f"{settings.max_length} tokens"
    return f"({settings.max_length} prompt + {settings.target_length} target tokens), language modelling"


def _training(settings) -> str:
    """The optimiser and the training settings changed from their defaults, in words."""
    parts = ["AdamW" if settings.optimizer == ADAMW else f"{settings.optimizer} (bitsandbytes, 8-bit state)"]
    if settings.gradient_accumulation > 1:
        parts.append(f"{settings.gradient_accumulation} micro-batches a step (the FLOPs are the step's)")
    if settings.gradient_checkpointing:
        parts.append("gradient checkpointing")
    return ", ".join(parts)


def _precision(settings) -> str:
    from petlprof.estimate.autocast import policy_device  # imports torch: not at the top, for a fast --help

    kernels = f"{policy_device(settings.device)} kernels"
    if settings.weights_dtype != FLOAT32:
        return f"{settings.weights_dtype} weights, gradients and AdamW state (pure), {kernels}"
    if settings.precision == FP32:
        return f"float32 (every backbone, whatever dtype its config names), {kernels}"
    return f"{settings.precision} autocast ({policy_device(settings.device)} rules), float32 weights, {kernels}"


def plot_memory_vs_size(records: Sequence[EstimateRecord], path: Path) -> Path:
    """Peak training memory (GiB) against total parameters, one line per method configuration."""
    # matplotlib: slow to import, loaded only when used
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib: slow to import, loaded only when used
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lines: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record["status"] == "ok":
            quantize = record.get("quantize", "none")
            label = " ".join(
                filter(None, (record["method"], config_label(record), "" if quantize == "none" else quantize))
            )
            lines.setdefault(label, []).append((record["total_params"], record["memory"]["peak_train_bytes"] / GIB))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p for p, _ in points], [m for _, m in points], marker="o", label=label)
    for gib in sorted({gpu.memory_gib for gpu in gpus.GPUS.values()}):
        ax.axhline(gib, color="grey", linewidth=0.5, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("total parameters")
    ax.set_ylabel("peak training memory (GiB, estimated)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
