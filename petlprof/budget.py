"""A run's training budget: stop at a target metric value (time-to-accuracy) or at a maximum time.

:class:`Budget` is the ``stop`` hook the training loop calls after every optimiser step.  Every
``eval_every`` steps it scores the model on a small held-out slice (the first ``eval_size``
examples of the evaluation split, or all of it), and tells the loop to stop once the target is
reached (at or past it, in the metric's better direction from :mod:`petlprof.metrics`) or once
``max_time_s`` of training have passed.  The checks' own time is measured and reported, because
it falls inside the train phase's window: when a run stops at its target, the train phase's time,
energy and steps *are* the cost of reaching it, checks included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from petlprof.metrics import HIGHER, direction

TARGET = "target"
MAX_TIME = "max_time"


class Budget:
    """Stops training at ``target_value`` of ``metric`` and/or after ``max_time_s`` seconds.

    ``score`` maps the model to the metric's value on the held-out slice; it is called every
    ``eval_every`` steps when a target is set.
    """

    def __init__(
        self,
        *,
        metric: str | None,
        target_value: float | None,
        eval_every: int,
        score: Callable[[Any], float] | None,
        model: Any,
        max_time_s: float | None,
        eval_size: int | None,
    ):
        self.metric, self.target_value, self.eval_every = metric, target_value, eval_every
        self.score, self.model, self.max_time_s, self.eval_size = score, model, max_time_s, eval_size
        self.higher = direction(metric) == HIGHER if metric else True
        self.checks: list[dict[str, float]] = []
        self.check_time_s = 0.0
        self.stop_reason: str | None = None
        self.reached_at_step: int | None = None
        self._t0 = time.perf_counter()

    def start(self) -> None:
        """Start the clock of ``max_time_s`` (call right before training)."""
        self._t0 = time.perf_counter()

    def _reached(self, value: float) -> bool:
        return value >= self.target_value if self.higher else value <= self.target_value

    def __call__(self, step: int) -> str | None:
        """After optimiser step ``step`` (1-based): why to stop now, or None to go on."""
        if self.target_value is not None and step % self.eval_every == 0:
            t0 = time.perf_counter()
            value = float(self.score(self.model))
            self.check_time_s += time.perf_counter() - t0
            self.checks.append({"step": step, "value": value, "elapsed_s": time.perf_counter() - self._t0})
            if self._reached(value):
                self.stop_reason, self.reached_at_step = TARGET, step
                return TARGET
        if self.max_time_s is not None and time.perf_counter() - self._t0 >= self.max_time_s:
            self.stop_reason = MAX_TIME
            return MAX_TIME
        return None

    def summary(self, train_phase: dict[str, Any]) -> dict[str, Any]:
        """The ``budget`` entry of the train phase; ``*_to_target`` figures are the phase's own
        (window) figures when the target was reached, None otherwise."""
        reached = self.stop_reason == TARGET
        return {
            "target_metric": self.metric,
            "target_value": self.target_value,
            "eval_every_steps": self.eval_every,
            "check_eval_size": self.eval_size,
            "max_time_s": self.max_time_s,
            "stop_reason": self.stop_reason,
            "reached": reached if self.target_value is not None else None,
            "reached_at_step": self.reached_at_step,
            "time_to_target_s": train_phase.get("time_s") if reached else None,
            "energy_to_target_j": train_phase.get("energy_j") if reached else None,
            "check_time_s": self.check_time_s,
            "checks": self.checks,
        }


def slice_scorer(task, batches, metric: str, device: str) -> Callable[[Any], float]:
    """A function scoring a model's predictions on ``batches`` (a held-out slice) with ``metric``;
    the model is put back in training mode afterwards.  Unlike the evaluation phase it opens no
    meter window and shows no progress bar: its time is the budget's ``check_time_s``."""
    import torch

    from petlprof.train import predict

    def score(model) -> float:
        model.eval()
        preds, golds = [], []
        with torch.no_grad():
            for inputs, labels in batches.iterate(device):
                preds.append(predict(model(**inputs)))
                golds.append(labels)
        model.train()
        scores = task.compute_metrics(torch.cat(preds).float().cpu().numpy(), torch.cat(golds).float().cpu().numpy())
        return scores[metric]

    return score


def check_target(task, name: str, metric: str, value: float) -> None:
    """A target is a metric the task scores, within that metric's range."""
    from petlprof.errors import UsageError
    from petlprof.metrics import METRIC_RANGES

    if metric not in task.metric_names:
        raise UsageError(
            f"target metric '{metric}' is not scored on task '{name}'; it scores {', '.join(task.metric_names)}"
        )
    low, high = METRIC_RANGES[metric]
    if not low <= value <= high:
        raise UsageError(
            f"--target-value {value:g} is outside the range of {metric} on task '{name}', [{low:g}, {high:g}]"
        )


def make_budget(spec, task, model, make_batches) -> Budget | None:
    """The budget a :class:`~petlprof.runner.RunSpec` asks for (None without one); ``make_batches``
    turns a task split into batches the way the run does."""
    from petlprof.tasks import Split

    if spec.target_value is None and spec.max_train_time_s is None:
        return None
    metric, score, size = spec.target_metric or task.primary_metric, None, spec.target_eval_size
    if spec.target_value is not None:
        check_target(task, spec.task, metric, spec.target_value)
        held_out = task.eval
        if size is not None and size < len(held_out):
            held_out = Split(
                held_out.texts[:size], held_out.pairs[:size] if held_out.pairs else None, held_out.labels[:size]
            )
        size = len(held_out)
        score = slice_scorer(task, make_batches(held_out), metric, spec.device)
    return Budget(
        metric=metric if spec.target_value is not None else None,
        target_value=spec.target_value,
        eval_every=spec.eval_every or 1,
        score=score,
        model=model,
        max_time_s=spec.max_train_time_s,
        eval_size=size if spec.target_value is not None else None,
    )
