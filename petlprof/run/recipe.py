"""The training recipe every method shares: optimiser, weight-decay rule, schedule, clipping, precision.

One :class:`TrainRecipe` object is what the training loop (:func:`petlprof.run.train.train`) builds its
optimiser and schedule from and what the run's record describes (:meth:`TrainRecipe.describe`), so
the record cannot say something the loop did not do.  Only the learning rate differs between methods
(each method's default, or the user's); everything else is the same for all, so cost differences
come from the methods alone.

Precision (``--precision``): ``fp32`` runs in the parameters' own dtype; ``bf16`` and ``fp16`` run
every forward pass (training, evaluation, inference, target checks: :func:`autocast`) and the loss
under ``torch.autocast`` to that dtype, the weights, gradients and AdamW state staying in float32
(mixed precision); ``fp16`` also scales the loss (:meth:`TrainRecipe.scaler`), since float16
gradients underflow without it.

The settings of real jobs (issue 39), each recorded and priced by ``petlprof estimate`` exactly as run here:

- ``--weights-dtype bfloat16``: every weight of the task model (backbone, head, adapters, side network) held in
  bfloat16, cast once the method is applied (:func:`prepare_model`); the trained weights, their gradients and
  torch AdamW's state are in it too (pure half precision, no float32 master copy: AdamW keeps its state in the
  parameter's dtype), and every pass computes in it.  float16 is not offered: pure float16 training overflowed
  the gradient norm at the first step here (tiny-bert), and torch's loss scaler cannot unscale float16
  gradients; ``--precision fp16`` (autocast over float32 master weights, a scaled loss) is float16's way.
- ``--gradient-checkpointing``: the backbone's layers recompute their activations in the backward pass
  (transformers' ``gradient_checkpointing_enable``, non-reentrant, so no input needs ``requires_grad``);
  active in training only, as transformers makes it.
- ``--gradient-accumulation N``: each optimiser step sums the gradients of N micro-batches of the batch size
  (each micro-batch's loss divided by their number), then clips, steps and schedules once.
- ``--optimizer adamw8bit|paged_adamw8bit``: bitsandbytes' AdamW with 8-bit block-wise state, under the same
  weight-decay rule, schedule and clipping.

Imports nothing heavy (the option's choices come from here).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from petlprof.errors import UsageError
from petlprof.results.records import RecipeDescription
from petlprof.vocabulary import ADAMW, ADAMW_8BIT, BF16, FLOAT32, FP16, FP32, PAGED_ADAMW_8BIT

DEFAULT_WEIGHT_DECAY = 0.01
DEFAULT_WARMUP_FRACTION = 0.06
DEFAULT_MAX_GRAD_NORM = 1.0

AUTOCAST_DTYPES = {BF16: "bfloat16", FP16: "float16"}  # the dtype each mixed precision computes in
# how torch says an operation has no kernel for a dtype ("erfcx_cpu" not implemented for 'BFloat16', ...)
_NO_KERNEL = re.compile(
    r"(?:not implemented for '|Low precision dtypes not supported\. Got |Unsupported dtype )(BFloat16|Half)"
)


class PrecisionError(RuntimeError):
    """An operation of the model has no kernel for the run's autocast dtype on its device."""


@contextlib.contextmanager
def autocast(precision: str, device: str) -> Iterator[None]:
    """The context a forward pass runs in at ``precision``: autocast to its dtype (nothing for fp32).
    An operation without a kernel for that dtype on ``device`` raises a one-line :class:`PrecisionError`."""
    # torch: slow to import, loaded only when used
    import torch

    with kernels_checked(precision, device):
        if precision == FP32:
            yield
            return
        with torch.autocast(torch_device_type(device), dtype=getattr(torch, AUTOCAST_DTYPES[precision])):
            yield


@contextlib.contextmanager
def kernels_checked(precision: str, device: str) -> Iterator[None]:
    """Turn "no kernel for this dtype" errors raised inside (a forward or a backward pass) into a
    :class:`PrecisionError` naming the precision, the device and the operation."""
    try:
        yield
    except (RuntimeError, NotImplementedError) as exc:
        if precision == FP32 or isinstance(exc, PrecisionError) or not _NO_KERNEL.search(str(exc)):
            raise
        operation = str(exc).splitlines()[0]
        raise PrecisionError(
            f"--precision {precision}: an operation of this model has no {AUTOCAST_DTYPES[precision]} kernel on "
            f"{torch_device_type(device)} ({operation}); run it with --precision fp32 or on a device that has one"
        ) from exc


def torch_device_type(device: str) -> str:
    return device.split(":")[0]


@dataclass(frozen=True)
class TrainRecipe:
    """AdamW with weight decay on matrices only, a linear schedule after a linear warm-up, gradient
    clipping by global norm.  ``precision``: one of :data:`PRECISIONS` (see the module's docstring)."""

    lr: float
    weight_decay: float = DEFAULT_WEIGHT_DECAY  # on parameters of two or more dimensions; biases and norms get 0
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION  # of the run's optimiser steps, learning rate rising from 0
    max_grad_norm: float = DEFAULT_MAX_GRAD_NORM
    precision: str = FP32
    optimizer_kind: str = ADAMW  # --optimizer
    accumulation: int = 1  # --gradient-accumulation: micro-batches per optimiser step

    def param_groups(self, model) -> list[dict]:
        """Decay matrices only: biases and normalisation weights (1-D tensors) are not decayed."""
        params = [p for p in model.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]

    def optimizer(self, model):
        """(optimiser, the parameters it updates) for ``model``'s trainable parameters."""
        # torch: slow to import, loaded only when used
        import torch

        groups = self.param_groups(model)
        params = [p for group in groups for p in group["params"]]
        if self.optimizer_kind == ADAMW:
            return torch.optim.AdamW(groups, lr=self.lr), params
        return eight_bit_adamw(self.optimizer_kind)(groups, lr=self.lr), params

    def schedule(self, optimizer, total_steps: int):
        # transformers: slow to import, loaded only when used
        from transformers import get_linear_schedule_with_warmup

        return get_linear_schedule_with_warmup(optimizer, int(self.warmup_fraction * total_steps), total_steps)

    def clip(self, params) -> float:
        """Clip the gradients of ``params`` to ``max_grad_norm``; returns their total norm before clipping."""
        # torch: slow to import, loaded only when used
        import torch

        return float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))

    def autocast(self, device: str):
        """The context the forward pass and the loss run in: :func:`autocast` to ``precision``."""
        return autocast(self.precision, device)

    def kernels_checked(self, device: str):
        """The context the backward pass runs in: :func:`kernels_checked` at ``precision``."""
        return kernels_checked(self.precision, device)

    def scaler(self, device: str):
        """fp16's dynamic loss scaler for ``device`` (``torch.amp.GradScaler``); for the other precisions
        a disabled one, which passes the loss, gradients and optimiser step through unchanged."""
        # torch: slow to import, loaded only when used
        import torch

        return torch.amp.GradScaler(torch_device_type(device), enabled=self.precision == FP16)

    def describe(self, model) -> RecipeDescription:
        """The record's ``optimizer``, ``schedule`` and ``precision`` (the parameters' dtype, e.g. ``float32``,
        and for mixed precision the autocast dtype and loss scaling)."""
        decay = f"weight_decay={self.weight_decay:g} on matrices, 0 on biases/norms"
        name = {ADAMW: "AdamW", ADAMW_8BIT: "bitsandbytes AdamW8bit", PAGED_ADAMW_8BIT: "bitsandbytes PagedAdamW8bit"}
        state = "" if self.optimizer_kind == ADAMW else "; 8-bit block-wise state, float32 under 4096 elements"
        accumulation = f"; {self.accumulation} micro-batches a step" if self.accumulation > 1 else ""
        return {
            "optimizer": f"{name[self.optimizer_kind]}({decay}{state}){accumulation}",
            "schedule": f"linear, {_percent(self.warmup_fraction)} warm-up",
            "precision": describe_precision(self.precision, model, self.optimizer_kind == ADAMW),
        }


def describe_precision(precision: str, model, state_in_weights_dtype: bool = True) -> str:
    """``float32`` (the parameters' dtype), ``bfloat16 autocast, float32 weights`` or
    ``float16 autocast + dynamic loss scaling, float32 weights``; half-precision weights (``--weights-dtype``)
    say that they are pure (and whether the optimiser's state is in their dtype: torch's AdamW)."""
    weights = str(next(model.parameters()).dtype).removeprefix("torch.")
    if precision == FP32 and weights != FLOAT32:
        held = "weights, gradients and AdamW state" if state_in_weights_dtype else "weights and gradients"
        return f"{weights} {held} (pure, no float32 master weights)"
    if precision == FP32:
        return weights
    scaling = " + dynamic loss scaling" if precision == FP16 else ""
    return f"{AUTOCAST_DTYPES[precision]} autocast{scaling}, {weights} weights"


def eight_bit_adamw(kind: str):
    """bitsandbytes' class for ``--optimizer`` ``kind`` (adamw8bit or paged_adamw8bit), or a one-line
    :class:`~petlprof.errors.UsageError` when bitsandbytes is not installed."""
    try:
        # bitsandbytes: optional (petlprof[quantize]) and slow to import, loaded only when used
        import bitsandbytes.optim as bnb_optim
    except ImportError as error:
        raise UsageError(
            f"--optimizer {kind} needs bitsandbytes ({error}); pip install 'petlprof[quantize]', or use adamw"
        ) from error
    return {ADAMW_8BIT: bnb_optim.AdamW8bit, PAGED_ADAMW_8BIT: bnb_optim.PagedAdamW8bit}[kind]


def prepare_model(model, weights_dtype: str = FLOAT32, gradient_checkpointing: bool = False) -> None:
    """Apply the model-side settings to a task model with its method applied, in place: every weight and buffer
    of a floating dtype cast to ``weights_dtype``, and transformers' gradient checkpointing (non-reentrant) on
    each backbone in it.  A backbone whose architecture has none is refused in one line."""
    # torch: slow to import, loaded only when used
    import torch

    if weights_dtype != FLOAT32:
        model.to(getattr(torch, weights_dtype))
    if gradient_checkpointing:
        backbones = checkpointable_modules(model)
        for backbone in backbones:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointable_modules(model) -> list:
    """The transformers models inside ``model`` (outermost first, nested ones left out), each checked to support
    gradient checkpointing: a :class:`~petlprof.errors.UsageError` naming the class of one that does not."""
    # transformers: slow to import, loaded only when used
    from transformers import PreTrainedModel

    found: list = []
    inside: set[int] = set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and id(module) not in inside:
            found.append(module)
            inside.update(id(sub) for sub in module.modules())
    if not found:
        raise UsageError(
            f"--gradient-checkpointing: the model ({type(model).__name__}) holds no transformers model to "
            "checkpoint; run it without the option"
        )
    for module in found:
        if not module.supports_gradient_checkpointing:
            raise UsageError(
                f"--gradient-checkpointing: {type(module).__name__} has no gradient checkpointing in transformers "
                "(supports_gradient_checkpointing is False); run it without the option"
            )
    return found


def _percent(fraction: float) -> str:
    value = fraction * 100
    return f"{round(value)}%" if math.isclose(value, round(value)) else f"{value:g}%"
