"""What a sweep's runs will take, worked out before the first run: how many optimiser steps each trains (a note
where that is too few to learn) and how much memory its weights, gradients and optimiser state need (refused
where this machine cannot give it, unless ``--skip-memory-check``).

:func:`check_resources` is the preflight's call (:func:`petlprof.sweep.config.preflight` passes in the tasks as the
sweep loads them and each method's grid points, so this module does not import that one).  The step count is
the run's own rule (:func:`optimiser_steps`, as ``petlprof.run.train.Steps`` counts over the batches of the
training split); the memory figure is :func:`petlprof.meters.memory.static_breakdown` of the model the run would
train, built on the meta device (no weight allocated) with the method applied.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from petlprof.errors import UsageError
from petlprof.meters.memory import static_breakdown
from petlprof.models.backbones import (
    Backbone,
    available_memory_bytes,
    backbone_config,
    prepare_backbone_model,
    set_depth,
    tokenizer_stand_in,
)
from petlprof.models.families import family_of, model_from_config
from petlprof.models.quantization import NONE, Quantization, kept_in_float
from petlprof.registry import get_method
from petlprof.results.figures import BREAKDOWN_TOTAL
from petlprof.values import parse_bytes
from petlprof.vocabulary import LM, ZERO_SHOT

GIB = 2**30

# A run of fewer optimiser steps than this is noted before the sweep as too short to learn.  The reference reports
# are the evidence: 4 steps left full fine-tuning at the majority rate, 8 were the fewest that learned
MIN_LEARNING_STEPS = 8
WHY_MIN_LEARNING_STEPS = (
    f"{MIN_LEARNING_STEPS} optimiser steps is the fewest the reference reports learned in: full fine-tuning's "
    "learning curve in reports/tweets3-study/curve was at the majority rate after 4 steps (accuracy 0.44, majority "
    "0.43) and above it after 8 (0.515); in reports/smollm2-arith 8 steps took READ's exact match to 0.17-0.30, "
    "against the zero-shot row's 0.09"
)
SKIP_MEMORY_CHECK = "--skip-memory-check"


def training_batches(
    batches_per_epoch: int, epochs: int, max_steps: int | None, accumulation: int = 1
) -> tuple[int, int]:
    """(optimiser steps, batches) of a training run, as the run takes them (:class:`petlprof.run.train.Steps` asks
    here): ``accumulation`` batches a step for ``max_steps`` steps when given, else ``epochs`` passes over
    ``batches_per_epoch`` batches with the last step short.  The warm-up steps are among them: they train, only
    their figures are left out."""
    batches = epochs * batches_per_epoch if max_steps is None else max_steps * accumulation
    return math.ceil(batches / accumulation), batches


def optimiser_steps(examples: int, batch_size: int, epochs: int, max_steps: int | None, accumulation: int = 1) -> int:
    """Optimiser steps of a training run over ``examples`` training examples in batches of ``batch_size`` (the last
    one short): :func:`training_batches`."""
    return training_batches(math.ceil(examples / batch_size), epochs, max_steps, accumulation)[0]


def trained_examples(examples: int, batch_size: int, epochs: int, max_steps: int | None, accumulation: int = 1) -> int:
    """Examples a training run passes through: ``examples`` x ``epochs``, or with ``max_steps`` the batches of those
    steps (:func:`training_batches`), epoch after epoch (each epoch's last batch short)."""
    if max_steps is None:
        return examples * epochs
    per_epoch = math.ceil(examples / batch_size)
    if per_epoch == 0:
        return 0
    epochs_done, batches_left = divmod(training_batches(per_epoch, epochs, max_steps, accumulation)[1], per_epoch)
    return epochs_done * examples + batches_left * batch_size


def check_resources(options, tasks: dict[str, Any], points: dict[str, list[dict[str, Any]]], here: bool) -> list[str]:
    """The preflight's checks of what the runs will take: notes for the runs too short to learn, and (``here``: the
    runs execute on this machine) a :class:`~petlprof.errors.UsageError` for a configuration whose weights, gradients
    and optimiser state alone exceed the memory a run can have here.  ``tasks``: each task of the sweep as
    loaded (name -> :class:`~petlprof.tasks.base.TaskData`); ``points``: each method's grid points."""
    notes = short_budget_notes(options, tasks)
    if here and not options.skip_memory_check:
        notes += check_memory(options, tasks, points)
    return notes


def short_budget_notes(options, tasks: dict[str, Any]) -> list[str]:
    """One note per task whose training runs make fewer than :data:`MIN_LEARNING_STEPS` optimiser steps (every
    training run of a task makes the same number: the budget options are the sweep's), then the threshold's
    reason, once."""
    trainers = [method for method in options.methods if get_method(method).name != ZERO_SHOT]
    if not trainers:
        return []
    notes = []
    for name, task in tasks.items():
        examples = len(task.train)
        steps = optimiser_steps(
            examples, options.batch_size, options.epochs, options.max_steps, options.gradient_accumulation
        )
        if steps < MIN_LEARNING_STEPS:
            notes.append(f"task '{name}': {_steps_text(options, examples, steps)}")
    return [*notes, WHY_MIN_LEARNING_STEPS] if notes else []


def _steps_text(options, examples: int, steps: int) -> str:
    """What a training run of ``steps`` optimiser steps is made of, and the way out."""
    rows = f"{examples} training example{'s' * (examples != 1)} in batches of --batch-size {options.batch_size}"
    if options.max_steps is None:
        per_epoch = math.ceil(examples / options.batch_size)
        made = f"{rows}: {per_epoch} per epoch, x --epochs {options.epochs}"
    else:
        made = f"--max-steps {options.max_steps}, over {rows}"
    if options.gradient_accumulation > 1:
        made += f", --gradient-accumulation {options.gradient_accumulation} batches a step"
    warmup = min(options.warmup_steps, max(steps - 1, 0))  # as the run's train() caps it
    among = f"; the {warmup} warm-up step{'s' * (warmup != 1)} among them train{'s' * (warmup == 1)} too" * bool(warmup)
    budget = options.target_value is not None or options.max_train_time is not None
    how_many = f"at most {steps}" if budget else str(steps)  # a target or a time limit may stop it sooner
    return (
        f"each training run makes {how_many} optimiser step{'s' * (steps != 1)} ({made}{among}), fewer than "
        f"{MIN_LEARNING_STEPS}: too few to learn; raise --epochs or --max-steps, or lower --batch-size"
    )


@dataclass(frozen=True)
class Counted:
    """What a run's model holds whatever the batch, counted on the meta device: bytes of its weights, buffers,
    gradients and AdamW state (:func:`~petlprof.meters.memory.static_breakdown`; a quantised backbone's linear
    weights at their packed size, their quantisation state not counted), its parameters and those of them trained."""

    bytes: int
    params: int
    trainable: int


def check_memory(options, tasks: dict[str, Any], points: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Refuse, in one line, the configurations whose :class:`Counted` bytes exceed what one rank of a run can have
    here (:func:`memory_limit`); returns a note for each configuration that could not be counted."""
    limit = memory_limit(options.device, options.nproc_per_run, parse_bytes(options.max_memory))
    if limit is None:
        return []
    limit_bytes, limit_text, way_out = limit
    over, notes = [], []
    for label, count in _counts(options, tasks, points):
        if isinstance(count, str):
            notes.append(f"memory check: {label} could not be built on the meta device to count ({count}); not checked")
        elif count.bytes > limit_bytes:
            trained = "all trained" if count.trainable == count.params else f"{count.trainable:,} trained"
            over.append(f"{label} needs {count.bytes / GIB:.1f} GiB ({count.params:,} parameters, {trained})")
    if over:
        packed = "; linear layers --quantize packs at their packed size" if options.quantize != [NONE] else ""
        raise UsageError(
            f"{len(over)} configuration{'s' * (len(over) > 1)} need{'s' * (len(over) == 1)} more memory than "
            f"{limit_text} for the weights, buffers, gradients and AdamW state alone (float32, counted on the model "
            f"built on the meta device with the method applied{packed}; activations come on top): {'; '.join(over)}. "
            f"Use a smaller backbone or --num-layers{way_out}, or run anyway with {SKIP_MEMORY_CHECK}"
        )
    return notes


def _counts(options, tasks: dict[str, Any], points: dict[str, list[dict[str, Any]]]):
    """(label, :class:`Counted` or why it could not be counted) per distinct configuration of the sweep (the
    tasks of one objective and number of labels share one)."""
    seen = set()
    axes = itertools.product(options.backbone, options.quantize, tasks.items(), options.methods)
    for backbone, quantize, (name, task), method in axes:
        for point in points[method]:
            key = (backbone, options.num_layers, quantize, task.objective, task.num_labels, method, _json(point))
            if key not in seen:
                seen.add(key)
                yield _label(method, point, backbone, quantize, name), _counted(*key)


def _counted(*key) -> Counted | str:
    try:
        return count_memory(*key)
    except Exception as error:  # noqa: BLE001 - a method that cannot be built on meta: noted, the run decides
        return " ".join(str(error).split()) or type(error).__name__


def _json(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, default=str)


def _label(method: str, point: dict[str, Any], backbone: str, quantize: str, task: str) -> str:
    """``lora r=8 on llama-3-8b (nf4) / arith``: a configuration as the sweep's progress line names its runs."""
    spec = get_method(method)
    knob = f" {spec.pareto_knob}={getattr(spec.make_config(point), spec.pareto_knob)}" if spec.pareto_knob else ""
    packed = f" ({quantize})" if quantize != NONE else ""
    return f"{spec.name}{knob} on {backbone}{packed} / {task}"


@functools.cache
def count_memory(
    backbone: str, num_layers: int | None, quantize: str, objective: str, num_labels: int, method: str, point: str
) -> Counted:
    """:class:`Counted` of one configuration (``point``: its method config as JSON), built once per process: the
    backbone from its config as a run builds it (depth cut, the objective's head, the pad id), quantised as
    ``quantize`` says, the task model with the method applied."""
    # torch, petlprof.models.classifier (torch; seconds): kept off the import of the sweep's driver, whose warm worker
    # imports them meanwhile
    import torch

    from petlprof.models.classifier import trainable_model

    config = copy.deepcopy(backbone_config(backbone))
    set_depth(config, num_layers)
    spec = get_method(method)
    tokenizer = tokenizer_stand_in(config)
    with torch.device("meta"):
        model = model_from_config(config, objective == LM, backbone)
        prepare_backbone_model(model, tokenizer.pad_token_id)
        saved = 0 if quantize == NONE else _packing_saves(model, Quantization(quantize))
        built = Backbone(backbone, model, tokenizer, family_of(config), "counted on the meta device")
        task_model = trainable_model(built, objective, num_labels, spec, spec.make_config(json.loads(point)))
    params = list(task_model.parameters())  # shared (tied) parameters once
    return Counted(
        static_breakdown(task_model)[BREAKDOWN_TOTAL] - saved,
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
    )


def _packing_saves(model, quantization: Quantization) -> int:
    """Bytes a run's quantisation takes off ``model``'s float32 weights: the linear layers transformers swaps for
    bitsandbytes' (``replace_with_bnb_linear`` on a copy, with the layers
    :func:`~petlprof.models.quantization.kept_in_float` names kept, as
    :func:`~petlprof.models.quantization.quantize_model` calls it) store a weight in one byte (int8) or half a
    byte (4-bit) instead of four."""
    # bitsandbytes: optional (petlprof[quantize]; validate checked it is installed); transformers: as torch above
    import bitsandbytes as bnb
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    swapped = copy.deepcopy(model)
    replace_with_bnb_linear(
        swapped, modules_to_not_convert=kept_in_float(swapped), quantization_config=quantization.bnb_config()
    )
    layers = [m for m in swapped.modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]
    packed = 0.5 if quantization.four_bit else 1.0
    return sum(4 * m.weight.numel() - math.ceil(packed * m.weight.numel()) for m in layers)


def memory_limit(device: str, nproc: int, max_memory: int | None) -> tuple[int, str, str] | None:
    """(bytes one rank of a run may hold here, the phrase that says so, a way out beyond a smaller model) for
    ``--device`` ``device``: a CUDA device's total memory (torch's figure; the smallest of the ``nproc`` GPUs a
    run's ranks take), or ``MemAvailable`` shared by a run's ``nproc`` rank processes on the CPU; ``--max-memory``
    where it is less.  None where neither can be read, or for a device torch does not see here (the device check
    that follows refuses it)."""
    # torch (seconds): as in count_memory
    import torch

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        index = device.partition(":")[2]
        gpus = [int(index)] if index.isdigit() else list(range(nproc))
        if not torch.cuda.is_available() or max(gpus) >= torch.cuda.device_count():
            return None
        gpu = min(gpus, key=lambda i: torch.cuda.get_device_properties(i).total_memory)
        props = torch.cuda.get_device_properties(gpu)
        machine = int(props.total_memory)
        text = f"cuda:{gpu} ({props.name}) has ({machine / GIB:.1f} GiB, its total memory from torch)"
        way_out = ", a larger GPU"
    else:
        available = available_memory_bytes()
        if available is None:
            return None
        machine = available // nproc
        text = f"this machine can give a run ({machine / GIB:.1f} GiB: MemAvailable in /proc/meminfo)"
        if nproc > 1:
            text = (
                f"this machine can give each of a run's {nproc} rank processes ({machine / GIB:.1f} GiB: "
                f"MemAvailable in /proc/meminfo, {available / GIB:.1f} GiB, shared by them)"
            )
        way_out = ", fewer --nproc-per-run" if nproc > 1 else ""
    if max_memory is not None and max_memory < machine:
        return max_memory, f"--max-memory gives a run ({max_memory / GIB:.1f} GiB)", ", a larger --max-memory"
    return machine, text, way_out
