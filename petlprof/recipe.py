"""The training recipe every method shares: optimiser, weight-decay rule, schedule, clipping, precision.

One :class:`TrainRecipe` object is what the training loop (:func:`petlprof.train.train`) builds its
optimiser and schedule from and what the run's record describes (:meth:`TrainRecipe.describe`), so
the record cannot say something the loop did not do.  Only the learning rate differs between methods
(each method's default, or the user's); everything else is the same for all, so cost differences
come from the methods alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_WEIGHT_DECAY = 0.01
DEFAULT_WARMUP_FRACTION = 0.06
DEFAULT_MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class TrainRecipe:
    """AdamW with weight decay on matrices only, a linear schedule after a linear warm-up, gradient
    clipping by global norm.  ``precision`` None trains in the parameters' own dtype; a dtype name
    (``bfloat16``, ``float16``) runs the forward pass and loss under autocast to it."""

    lr: float
    weight_decay: float = DEFAULT_WEIGHT_DECAY  # on parameters of two or more dimensions; biases and norms get 0
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION  # of the run's optimiser steps, learning rate rising from 0
    max_grad_norm: float = DEFAULT_MAX_GRAD_NORM
    precision: str | None = None

    def param_groups(self, model) -> list[dict]:
        """Decay matrices only: biases and normalisation weights (1-D tensors) are not decayed."""
        params = [p for p in model.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]

    def optimizer(self, model):
        """(optimiser, the parameters it updates) for ``model``'s trainable parameters."""
        import torch

        groups = self.param_groups(model)
        return torch.optim.AdamW(groups, lr=self.lr), [p for group in groups for p in group["params"]]

    def schedule(self, optimizer, total_steps: int):
        from transformers import get_linear_schedule_with_warmup

        return get_linear_schedule_with_warmup(optimizer, int(self.warmup_fraction * total_steps), total_steps)

    def clip(self, params) -> float:
        """Clip the gradients of ``params`` to ``max_grad_norm``; returns their total norm before clipping."""
        import torch

        return float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))

    def autocast(self, device: str):
        """The context the forward pass runs in: autocast to ``precision``, or nothing."""
        import contextlib

        import torch

        if self.precision is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=getattr(torch, self.precision))

    def describe(self, model) -> dict[str, Any]:
        """The record's ``optimizer``, ``schedule`` and ``precision`` (the dtype the model trains in)."""
        dtype = self.precision or str(next(model.parameters()).dtype).removeprefix("torch.")
        return {
            "optimizer": f"AdamW(weight_decay={self.weight_decay:g} on matrices, 0 on biases/norms)",
            "schedule": f"linear, {_percent(self.warmup_fraction)} warm-up",
            "precision": dtype,
        }


def _percent(fraction: float) -> str:
    value = fraction * 100
    return f"{round(value)}%" if math.isclose(value, round(value)) else f"{value:g}%"
