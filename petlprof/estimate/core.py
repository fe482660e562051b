"""One estimate: a method on a backbone at a batch size and length -> parameters, bytes and FLOPs.

The model is built on the meta device (:mod:`petlprof.estimate.model`) and one training step and
one inference batch are traced on it (:mod:`petlprof.estimate.trace`).  Where an operation has no
meta kernel the estimate falls back to real tensors at one and two layers, extrapolated in depth
(:mod:`petlprof.estimate.fallback`), and the record's ``estimate_source`` says so.

Peak bytes are the weights and buffers plus the peak of what the traced step creates and keeps
alive at once: activations saved for backward, gradients, AdamW's state (created by the first of
two traced steps and alive through the second), temporaries; the same quantity the ``cpu-tensors``
meter measures.  FLOPs are those ``torch.utils.flop_counter`` counts (matrix products, convolutions,
attention; element-wise work is not counted).  At ``--precision`` bf16 or fp16 the step runs under
autocast by a device's rules (:mod:`petlprof.estimate.autocast`; a GPU's by default), so saved
activations and the low-precision copies of weights count at their real dtype; weights, gradients and
AdamW's state stay float32, as in a run.

``--attention`` picks the attention implementation the model is built with (eager, or sdpa with the
device's kernel; flash forces that kernel: :mod:`petlprof.estimate.attention`); ``--quantize`` quantises
the frozen backbone as a run does (:mod:`petlprof.estimate.quantized`).  The model is float32 whatever
dtype its config names (the record's ``config_dtype`` says what it asked for).  A fit verdict counts the
CUDA context and the allocator's slack (:func:`petlprof.estimate.gpus.usable_bytes`).

The objective (``--objective``) decides the task model: ``classification`` (the default) a pooled
state and a linear head on a batch of ``max_length`` tokens; ``lm`` the backbone's own LM head on a
prompt of ``max_length`` and a target of ``target_length`` tokens (:mod:`petlprof.estimate.lm`), its
record with an ``lm`` section (logits, loss positions, the KV cache per generated token).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch

from petlprof.errors import UsageError
from petlprof.estimate import gpus
from petlprof.estimate.attention import DEFAULT_ATTENTION, FLASH, implementation_of
from petlprof.estimate.autocast import policy_device
from petlprof.estimate.fallback import extrapolated_figures
from petlprof.estimate.gpus import Headroom
from petlprof.estimate.lm import LmFigures, decode_step, lm_figures
from petlprof.estimate.model import ResolvedBackbone, build, family, resolve_backbone, weight_breakdown
from petlprof.estimate.quantized import check_traceable
from petlprof.estimate.roofline import (
    Budget,
    DecodeStep,
    DeviceModel,
    Predicted,
    generation,
    prediction,
    train_total,
)
from petlprof.estimate.trace import (
    StepTrace,
    UntraceableError,
    example_batch,
    inference_batch,
    lm_batch,
    train_steps,
)
from petlprof.models.language_model import lm_loss
from petlprof.models.quantization import (
    DEFAULT_COMPUTE_DTYPE,
    NONE,
    Quantization,
    QuantizationInfo,
    QuantizeFields,
    parameter_count,
    run_fields,
)
from petlprof.registry import get_method
from petlprof.results.figures import (
    BREAKDOWN_BUFFERS,
    BREAKDOWN_FROZEN_WEIGHTS,
    BREAKDOWN_GRADIENTS,
    BREAKDOWN_QUANTIZATION_STATE,
    BREAKDOWN_TRAINABLE_WEIGHTS,
)
from petlprof.run.recipe import AUTOCAST_DTYPES, prepare_model
from petlprof.sweep.options import TRAINING_SETTINGS, TrainingValue, default_of
from petlprof.vocabulary import ADAMW, CLASSIFICATION, FP32, LM

META_TRACE = "meta-device trace of the step (no weights allocated)"


class AttentionUse(TypedDict):
    """The record's ``attention``: the implementation asked for and built, and the kernels each traced pass ran."""

    asked: str
    implementation: str
    train_kernels: list[str]
    inference_kernels: list[str]


class Flops(TypedDict):
    train_step: int
    inference_batch: int


class _Traced(TypedDict):
    dtype: str  # the parameters' (float32)
    compute_dtype: str  # the dtype the products run in
    trainable_params: int
    total_params: int
    attention: AttentionUse
    # bytes by name: the static breakdown's parts under their declarations (petlprof.results.figures, whose keys no
    # other module spells), beside weights_bytes, optimizer_bytes, peak_train_bytes and peak_inference_bytes
    memory: dict[str, int]
    flops: Flops
    estimate_source: str  # META_TRACE, or the fallback's rule and why (petlprof.estimate.fallback)


class _Quantized(TypedDict, total=False):
    quantization: QuantizationInfo  # --quantize: how the backbone's linear layers were quantised


class _LanguageModelling(TypedDict, total=False):
    lm: LmFigures  # --objective lm


class _Predictions(TypedDict, total=False):
    predicted: Predicted  # where the settings name a device model (a profile, or --device on the GPU table)


class TraceFigures(_Traced, _Quantized, _LanguageModelling, _Predictions):
    """What one traced step gives (:func:`trace_figures`): parameters, bytes and FLOPs, and their predicted times
    where the settings name a device model."""


class StepTimeBound(TypedDict):
    gpu: str
    peak_flops_per_s: float
    train_step_s: float
    inference_batch_s: float
    kind: str  # what the bound is, in words


class Verdicts(TypedDict):
    """Whether the step fits each table GPU (and ``--device-memory``) and its time's lower bound (:func:`_verdicts`)."""

    fits_train: dict[str, bool | None]  # GPU name (or device_memory) -> fits
    fits_inference: dict[str, bool | None]
    headroom: Headroom
    step_time_lower_bound: StepTimeBound


class _ObjectiveFields(TypedDict, total=False):
    num_labels: int  # classification
    target_length: int | None  # lm


class _EstimateOf(QuantizeFields, _ObjectiveFields):
    """What every estimate record says it priced: the method configuration, the backbone and the settings."""

    method: str
    method_config: dict[str, Any]  # the method's config dataclass, field by field
    pareto_knob: str | None
    backbone: str
    backbone_source: str
    batch_size: int
    max_length: int
    objective: str
    precision: str
    autocast_rules: str | None  # whose autocast rules (None at fp32)
    kernels: str  # whose kernels
    config_dtype: str | None  # what the config asked for; the model is built float32


class Estimate(_EstimateOf, TraceFigures, Verdicts):
    """An ``estimates.jsonl`` record of status ``ok``: the settings, the traced figures and the verdicts."""

    status: Literal["ok"]
    error: None


class FailedEstimate(_EstimateOf):
    """An ``estimates.jsonl`` record of a model that could not be built or traced: the settings and the error."""

    status: Literal["failed"]
    error: str


EstimateRecord = Estimate | FailedEstimate  # one line of estimates.jsonl


@dataclass(frozen=True)
class Settings:
    """What every estimate of one command shares."""

    batch_size: int = default_of("batch_size")  # a run's defaults, so an estimate prices what a run measures
    max_length: int = default_of("max_length")
    # a classification training batch's (length it is padded to, real tokens), the rest padding (None: every row
    # max_length tokens); the evaluation batch stays max_length tokens a row, an upper bound on the evaluation split's
    train_rows: tuple[int, int] | None = None
    num_labels: int = 2
    device_memory_bytes: int | None = None
    gpu: str = gpus.DEFAULT_GPU
    precision: str = FP32  # the forward pass and loss under autocast to bf16/fp16, weights float32
    device: str = "cuda"  # whose kernels and autocast rules the step follows (cuda: a GPU's; cpu)
    objective: str = CLASSIFICATION  # or LM: the backbone's own LM head, a prompt of max_length tokens and a target
    target_length: int | None = None  # LM: target tokens per row (the decoder of an encoder-decoder reads only them)
    attention: str = DEFAULT_ATTENTION  # eager, sdpa or flash (petlprof.estimate.attention)
    quantization: Quantization | None = None  # the frozen backbone's linear layers quantised by bitsandbytes
    device_model: DeviceModel | None = None  # whose time and energy are predicted (a profile or the GPU table)
    # the training settings of real jobs (petlprof.run.recipe), priced as a run executes them
    weights_dtype: str = default_of("weights_dtype")
    gradient_checkpointing: bool = default_of("gradient_checkpointing")
    gradient_accumulation: int = default_of("gradient_accumulation")
    optimizer: str = default_of("optimizer")
    # the training run's length, whose predicted time and energy are totalled (none: every example of a task, which
    # an estimate does not have: no totals)
    train_size: int | None = default_of("train_size")
    epochs: int = default_of("epochs")
    max_steps: int | None = default_of("max_steps")

    def budget(self) -> Budget | None:
        """The run length the totals price (None: ``--train-size all`` without ``--max-steps``, which only a task's
        data could count)."""
        if self.train_size is None and self.max_steps is None:
            return None
        return Budget(self.train_size, self.epochs, self.max_steps, self.batch_size, self.gradient_accumulation)

    def training_fields(self) -> dict[str, TrainingValue]:
        """The training settings a run's spec would carry, those changed from their defaults only (as in run keys)."""
        return {name: getattr(self, name) for name in TRAINING_SETTINGS if getattr(self, name) != default_of(name)}

    @property
    def quantize(self) -> str:
        """The ``--quantize`` value (``none`` without quantisation)."""
        return NONE if self.quantization is None else self.quantization.method


def estimate(resolved: ResolvedBackbone, method_name: str, overrides: dict, settings: Settings) -> EstimateRecord:
    """The ``estimates.jsonl`` record of one method configuration (status ``failed`` with its error
    when the model cannot be built or traced; a bad option is a UsageError before that)."""

    method = get_method(method_name)
    config = method.make_config(overrides)
    objective: _ObjectiveFields = {}
    if settings.objective == CLASSIFICATION:
        objective = {"num_labels": settings.num_labels}
    elif settings.objective == LM:
        objective = {"target_length": settings.target_length}
    priced: _EstimateOf = {
        "method": method.name,
        "method_config": dataclasses.asdict(config),
        "pareto_knob": method.pareto_knob,
        "backbone": resolved.name,
        "backbone_source": resolved.source,
        "batch_size": settings.batch_size,
        "max_length": settings.max_length,
        "objective": settings.objective,
        **objective,
        "precision": settings.precision,
        "autocast_rules": None if settings.precision == FP32 else policy_device(settings.device),
        "kernels": policy_device(settings.device),
        "config_dtype": resolved.config_dtype,
        **_quantize_fields(settings),
        **settings.training_fields(),  # type: ignore[typeddict-item]
    }
    try:
        try:
            figures = trace_figures(resolved, method, config, settings)
        except UntraceableError as exc:  # (a meta kernel's shape check too: the real step then says what is wrong)
            figures = extrapolated_figures(resolved, method, config, settings, reason=str(exc), trace=trace_figures)
    except UsageError:
        raise
    except Exception as exc:  # a method or model that cannot be built or run is a failed row, not a crash
        return {**priced, "status": "failed", "error": f"{type(exc).__name__}: {exc}".strip()}
    verdicts = _verdicts(figures["memory"]["peak_train_bytes"], figures["flops"]["train_step"], figures, settings)
    return {**priced, "status": "ok", "error": None, **figures, **verdicts}


def trace_figures(resolved: ResolvedBackbone, method, config, settings: Settings, device: str = "meta") -> TraceFigures:
    """Parameters, bytes and FLOPs of ``method`` on ``resolved`` from one traced step on ``device``."""

    if device == "meta":
        check_traceable(settings.quantization)
    built = build(
        resolved,
        method,
        config,
        settings.num_labels,
        device=device,
        objective=settings.objective,
        attention=settings.attention,
        quantization=settings.quantization,
    )
    model = built.model
    prepare_model(model, settings.weights_dtype, settings.gradient_checkpointing)
    static = weight_breakdown(model, settings.optimizer != ADAMW)
    dtype = str(next(p for p in model.parameters() if p.is_floating_point()).dtype).removeprefix("torch.")
    loss_fn = None
    if settings.objective == LM:
        loss_fn = functools.partial(lm_loss, family=family(resolved))  # the run's: mean over the target tokens
        encoder_decoder = bool(getattr(resolved.config, "is_encoder_decoder", False))
        if settings.target_length is None:
            raise ValueError("Settings(objective='lm') needs a target_length")
        lengths = (settings.max_length, settings.target_length)
        inputs, labels = lm_batch(settings.batch_size, *lengths, _token_id(resolved), encoder_decoder)
        evaluation = inputs
    else:
        length, real = settings.train_rows or (settings.max_length, None)
        inputs, labels = example_batch(settings.batch_size, length, _token_id(resolved), real)
        evaluation, _ = example_batch(settings.batch_size, settings.max_length, _token_id(resolved))
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"{method.name} trains no parameter of the {settings.objective} task model")
    state = static.get(BREAKDOWN_QUANTIZATION_STATE, 0)
    weights = static[BREAKDOWN_FROZEN_WEIGHTS] + static[BREAKDOWN_TRAINABLE_WEIGHTS]
    resident = weights + static[BREAKDOWN_BUFFERS] + state
    rules: dict[str, Any] = {
        "precision": settings.precision,
        "device": settings.device,
        "attention_kernel": _forced(settings),
        "op_costs": settings.device_model is not None,  # only a prediction reads them
    }
    train = train_steps(
        model,
        inputs,
        labels,
        loss_fn=loss_fn,
        optimizer_kind=settings.optimizer,
        accumulation=settings.gradient_accumulation,
        **rules,
    )
    infer = inference_batch(model, evaluation, **rules)
    compute_dtype = dtype if settings.precision == FP32 else AUTOCAST_DTYPES[settings.precision]
    quantized: _Quantized = {} if built.quantization is None else {"quantization": built.quantization}
    lm: _LanguageModelling = {}
    decode = None
    if settings.objective == LM:
        dtype_bytes = getattr(torch, compute_dtype).itemsize
        lm = {"lm": lm_figures(resolved.config, settings, infer.output_shape, infer.output_bytes, dtype_bytes)}
        decode = decode_step(model, resolved.config, settings, lm["lm"]["kv_cache"], len(infer.op_costs))
    return {
        "dtype": dtype,
        "compute_dtype": compute_dtype,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "total_params": parameter_count(model),
        "attention": {
            "asked": settings.attention,
            "implementation": implementation_of(model),
            "train_kernels": list(train.attention_kernels),
            "inference_kernels": list(infer.attention_kernels),
        },
        **quantized,
        "memory": {
            "weights_bytes": weights,
            BREAKDOWN_TRAINABLE_WEIGHTS: static[BREAKDOWN_TRAINABLE_WEIGHTS],
            BREAKDOWN_BUFFERS: static[BREAKDOWN_BUFFERS],
            **({BREAKDOWN_QUANTIZATION_STATE: state} if settings.quantization else {}),
            BREAKDOWN_GRADIENTS: static[BREAKDOWN_GRADIENTS],
            "optimizer_bytes": static["optimizer_bytes"],
            "peak_train_bytes": resident + train.peak_new_bytes,
            "peak_inference_bytes": resident + infer.peak_new_bytes,
        },
        "flops": {"train_step": train.flops, "inference_batch": infer.flops},
        **_predicted(train, infer, settings, compute_dtype, decode),
        "estimate_source": META_TRACE,
        **lm,
    }


def _predicted(
    train: StepTrace, infer: StepTrace, settings: Settings, dtype: str, decode: DecodeStep | None = None
) -> _Predictions:
    """The ``predicted`` block (:mod:`petlprof.estimate.roofline`) where the settings name a device model: the steps,
    the training run's totals, and (the LM objective) generation."""
    if settings.device_model is None:
        return {}
    rates = None
    if settings.device_model.measure_products and policy_device(settings.device) == "cpu":
        # petlprof.estimate.products: times products on this CPU, only where a profile asks for it
        from petlprof.estimate.products import product_rates

        rates = product_rates([*train.op_costs, *infer.op_costs], dtype)
    optimizer = (train.optimizer_kernels, train.trained_numels) if train.trained_numels else None
    predicted = prediction(train.op_costs, infer.op_costs, settings.device_model, dtype, rates, optimizer)
    if decode is not None:
        predicted["generation"] = generation(decode, settings.device_model, dtype)
    budget = settings.budget()
    return {"predicted": predicted if budget is None else {**predicted, "train_total": train_total(predicted, budget)}}


def _quantize_fields(settings: Settings) -> QuantizeFields:
    """The run's quantisation fields (``quantize``, ``quantize_compute_dtype``, ``quantize_double``), named and
    filled as a run's spec fills them (the 4-bit settings only where they act)."""
    q = settings.quantization
    return run_fields(settings.quantize, *((q.compute_dtype, q.double_quant) if q else (DEFAULT_COMPUTE_DTYPE, False)))


def _forced(settings: Settings) -> str | None:
    """The attention kernel every call runs: flash for ``--attention flash``, else the device's own choice."""
    return FLASH if settings.attention == FLASH else None


def _token_id(resolved: ResolvedBackbone) -> int:
    """A token id inside the vocabulary (the values of ids change no shape)."""
    return min(100, int(resolved.config.vocab_size) - 1)


def _verdicts(peak_train_bytes: int, train_flops: int, figures: TraceFigures, settings: Settings) -> Verdicts:
    gpu = gpus.get_gpu(settings.gpu)
    peak_flops = gpu.peak_flops(figures["compute_dtype"])
    return {
        "fits_train": gpus.fits(peak_train_bytes, settings.device_memory_bytes),
        "fits_inference": gpus.fits(figures["memory"]["peak_inference_bytes"], settings.device_memory_bytes),
        "headroom": gpus.headroom(),
        "step_time_lower_bound": {
            "gpu": gpu.name,
            "peak_flops_per_s": peak_flops,
            "train_step_s": train_flops / peak_flops,
            "inference_batch_s": figures["flops"]["inference_batch"] / peak_flops,
            "kind": "bound: FLOPs / the GPU's peak dense throughput in the dtype the products run in",
        },
    }


def lm_training_peak(
    backbone: str,
    num_layers: int | None,
    method: str,
    overrides: dict,
    batch: tuple[int, int, int],
    precision: str,
    device: str,
) -> int | None:
    """The predicted training peak in bytes of ``method`` (with ``overrides``) on ``backbone`` for the LM objective at
    a ``batch`` of (rows, prompt tokens, target tokens) every row padded to, at ``precision`` on ``device``'s kernels
    (``cpu`` or ``cuda``); None where the step cannot be traced.  The sweep's preflight asks it where the data's
    own lengths decide the size (:func:`petlprof.sweep.lengths.check_lm_lengths`)."""
    rows, prompt_length, target_length = batch
    settings = Settings(
        batch_size=rows,
        max_length=prompt_length,
        objective=LM,
        target_length=target_length,
        precision=precision,
        device=device,
    )
    record = estimate(resolve_backbone(backbone, num_layers), method, overrides, settings)
    return record["memory"]["peak_train_bytes"] if record["status"] == "ok" else None
