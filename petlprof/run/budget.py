"""A run's training budget and learning curve: validation checks, a target metric value
(time-to-accuracy), a maximum time.

:class:`Budget` is the ``stop`` hook the training loop calls after every optimiser step.  Every
``eval_every`` steps it scores the model on the validation split (the first ``eval_size`` examples of
it, or all of it: carved from the training pool, never the evaluation split the run is reported on) and
keeps the point -- the step, the training time and energy spent so far (warm-up included, the checks
left out) and the score -- as the run's learning curve.  It tells the loop to stop once the target is
reached (at or past it, in the metric's better direction from :mod:`petlprof.tasks.metrics`) or once
``max_time_s`` of training have passed.  A language-modelling run's check generates greedily for each
validation prompt and scores the texts with the task's own metric (:class:`GenerationScorer`).

The checks' own time is measured and reported, because
it falls inside the train phase's window: when a run stops at its target, the train phase's time,
energy and steps *are* the cost of reaching it, checks included.  The checks' own time and energy
(the run's energy meter, opened around each check alone) are reported too, and the cost to the
target without them, so a method whose checks are a large share of its training is not hidden by
them.  With ``--cache-hidden-states`` a side-tuning model's check slice runs its frozen backbone
once: the slice's states are kept (in the model's dtype, so the scores are exactly those of a full
forward pass) and each later check runs only the side network.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from petlprof.meters.base import synchronize
from petlprof.results.figures import ENERGY, HIGHER, TIME
from petlprof.results.records import BudgetCheck, BudgetSummary, TrainPhase
from petlprof.run.recipe import autocast
from petlprof.tasks.metrics import check_target, direction
from petlprof.vocabulary import FP32, LM

TARGET = "target"
MAX_TIME = "max_time"


class Budget:
    """Scores the validation split every ``eval_every`` steps (``None``: never), and stops training at
    ``target_value`` of ``metric`` and/or after ``max_time_s`` seconds.

    ``score`` maps the model to the metric's value on the validation slice.
    """

    def __init__(
        self,
        *,
        metric: str | None,
        target_value: float | None,
        eval_every: int | None,
        score: Callable[[Any], float] | None,
        model: Any,
        max_time_s: float | None,
        eval_size: int | None,
        check_meter: Any = None,
        train_meter: Any = None,
    ):
        """``check_meter``: an energy meter (:class:`petlprof.meters.Meter`) opened around each check
        alone, for the checks' own energy; ``train_meter``: one of the same kind opened around the training
        between checks, for the curve's energy so far; None leaves either unmeasured."""
        self.metric, self.target_value, self.eval_every = metric, target_value, eval_every
        self.score, self.model, self.max_time_s, self.eval_size = score, model, max_time_s, eval_size
        self.higher = direction(metric) == HIGHER if metric else True
        self.checks: list[BudgetCheck] = []
        self.check_time_s = 0.0
        self.check_meter = check_meter
        self.check_energy_j: float | None = 0.0 if check_meter is not None else None
        self.stop_reason: str | None = None
        self.reached_at_step: int | None = None
        self.train_meter = train_meter
        self.train_energy_j: float | None = 0.0 if train_meter is not None else None  # so far, checks left out
        self._train_meter_open = False
        self._t0 = time.perf_counter()

    def start(self) -> None:
        """Start the clock of ``max_time_s`` and the curve's energy (call right before training)."""
        self._t0 = time.perf_counter()
        self._open_train_meter()

    def _open_train_meter(self) -> None:
        if self.train_meter is not None and not self._train_meter_open:
            self.train_meter.prepare()
            self.train_meter.begin()
            self._train_meter_open = True

    def _close_train_meter(self) -> None:
        """Add the training since the last check to the energy so far (unknown once a reading has none)."""
        if self.train_meter is None or not self._train_meter_open:
            return
        synchronize(self.train_meter.device)  # the training step queued on a GPU is training's
        self._train_meter_open = False
        joules = ENERGY.of(self.train_meter.end())
        if self.train_energy_j is not None:
            self.train_energy_j = None if joules is None else self.train_energy_j + float(joules)

    def _reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher else value <= target

    def __call__(self, step: int) -> str | None:
        """After optimiser step ``step`` (1-based): why to stop now, or None to go on."""
        if self.eval_every is not None and step % self.eval_every == 0:
            self._close_train_meter()
            elapsed = time.perf_counter() - self._t0
            trained_s = max(elapsed - self.check_time_s, 0.0)  # the earlier checks' time left out
            value = self._check()
            self.checks.append(
                {
                    "step": step,
                    "value": value,
                    "elapsed_s": elapsed,
                    "train_time_s": trained_s,
                    "train_energy_j": self.train_energy_j,
                }
            )
            self._open_train_meter()
            if (target := self.target_value) is not None and self._reached(value, target):
                self.stop_reason, self.reached_at_step = TARGET, step
                return TARGET
        if self.max_time_s is not None and time.perf_counter() - self._t0 >= self.max_time_s:
            self.stop_reason = MAX_TIME
            return MAX_TIME
        return None

    def _check(self) -> float:
        """Score the model on the validation slice, adding the check's time (and energy) to the totals."""
        if self.check_meter is not None:
            synchronize(self.check_meter.device)  # the training step queued on a GPU is not the check's
            self.check_meter.prepare()
            self.check_meter.begin()
        if self.score is None:
            raise ValueError("a budget with validation checks needs a score of the model")
        t0 = time.perf_counter()
        value = float(self.score(self.model))
        self.check_time_s += time.perf_counter() - t0
        if self.check_meter is not None:  # check_energy_j started at 0 with the meter; unknown once a reading has none
            joules = ENERGY.of(self.check_meter.end())
            if self.check_energy_j is not None:
                self.check_energy_j = None if joules is None else self.check_energy_j + float(joules)
        return value

    def summary(self, train_phase: TrainPhase) -> BudgetSummary:
        """The ``budget`` entry of the train phase; ``*_to_target`` figures are the phase's own
        (window) figures when the target was reached, None otherwise; ``*_without_checks`` subtract
        the checks' own time and energy.  Closes the curve's energy meter (training has ended)."""
        self._close_train_meter()
        reached = self.stop_reason == TARGET
        time_s, energy_j = TIME.of(train_phase), ENERGY.of(train_phase)
        return {
            "target_metric": self.metric,
            "target_value": self.target_value,
            "eval_every_steps": self.eval_every,
            "check_eval_size": self.eval_size,
            "max_time_s": self.max_time_s,
            "stop_reason": self.stop_reason,
            "reached": reached if self.target_value is not None else None,
            "reached_at_step": self.reached_at_step,
            "time_to_target_s": time_s if reached else None,
            "energy_to_target_j": energy_j if reached else None,
            "check_time_s": self.check_time_s,
            "check_energy_j": self.check_energy_j,
            "check_states_reused": bool(getattr(self.score, "reuses_states", False)),
            "time_to_target_without_checks_s": _less(time_s, self.check_time_s) if reached else None,
            "energy_to_target_without_checks_j": _less(energy_j, self.check_energy_j) if reached else None,
            "checks": self.checks,
        }


def _less(total: float | None, part: float | None) -> float | None:
    """``total - part``, None when either is unknown; never below 0 (two meters' rounding)."""
    return None if total is None or part is None else max(float(total) - float(part), 0.0)


class SliceScorer:
    """Scores a model's predictions on ``batches`` (the validation slice) with ``metric``; the model is
    put back in training mode afterwards.  Unlike the evaluation phase it opens no meter window and
    shows no progress bar: its time is the budget's ``check_time_s``.

    ``reuse_states``: the model is a side-tuning model (``backbone_states``/``side_forward``) whose
    frozen backbone gives the same states at every check, so they are computed at the first check
    and kept; later checks run the side network alone.  ``precision``: the run's, whose autocast the
    forward passes run under (:func:`petlprof.run.recipe.autocast`)."""

    def __init__(self, task, batches, metric: str, device: str, reuse_states: bool = False, precision: str = FP32):
        self.task, self.batches, self.metric, self.device = task, batches, metric, device
        self.precision = precision
        self.reuses_states = reuse_states
        self._kept: list[tuple[dict, dict, Any]] | None = None  # per batch: (states, inputs, labels)

    def _logits(self, model):
        """(logits, labels) of every batch of the slice."""
        if not self.reuses_states:
            for inputs, labels in self.batches.iterate(self.device):
                yield model(**inputs), labels
            return
        if self._kept is None:
            self._kept = [
                (model.backbone_states(inputs["input_ids"], inputs["attention_mask"]), inputs, labels)
                for inputs, labels in self.batches.iterate(self.device)
            ]
        for states, inputs, labels in self._kept:
            yield model.side_forward(states, inputs["input_ids"], inputs["attention_mask"]), labels

    def __call__(self, model) -> float:
        # torch, petlprof.run.train (torch): slow to import, loaded only when used
        import torch

        from petlprof.run.train import predict

        model.eval()
        preds, golds = [], []
        with torch.no_grad(), autocast(self.precision, self.device):
            for logits, labels in self._logits(model):
                preds.append(predict(logits))
                golds.append(labels)
        model.train()
        scores = self.task.compute_metrics(
            torch.cat(preds).float().cpu().numpy(), torch.cat(golds).float().cpu().numpy()
        )
        return scores[self.metric]


def make_budget(spec, task, model, make_batches, meter=None) -> Budget | None:
    """The budget a :class:`~petlprof.sweep.spec.RunSpec` asks for (None without checks, a target or a time
    limit); ``make_batches`` turns a task split into batches the way the run does; ``meter``: makes the run's
    energy meter, one opened around each check and one around the training between checks (None: unmeasured)."""
    checking = spec.eval_every is not None
    if not checking and spec.target_value is None and spec.max_train_time_s is None:
        return None
    metric, score, size = spec.target_metric or task.primary_metric, None, None
    if spec.target_value is not None:
        check_target(task, spec.task, metric, spec.target_value)
    if checking:
        held_out = task.checked_split()  # validation: never the evaluation split the run is reported on
        if spec.target_eval_size is not None and spec.target_eval_size < len(held_out):
            held_out = held_out.head(spec.target_eval_size)
        size = len(held_out)
        score = _scorer(spec, task, model, make_batches(held_out), metric)
    return Budget(
        metric=metric if checking else None,
        target_value=spec.target_value,
        eval_every=spec.eval_every,
        score=score,
        model=model,
        max_time_s=spec.max_train_time_s,
        eval_size=size,
        check_meter=meter() if checking and meter is not None else None,
        train_meter=meter() if checking and meter is not None else None,
    )


def _scorer(spec, task, model, batches, metric: str) -> Callable[[Any], float]:
    """What scores the model on the validation batches: generated text for the LM objective, else predictions."""
    if task.objective == LM:
        return GenerationScorer(task, batches, metric, spec.device, spec.precision, spec.max_new_tokens)
    # petlprof.side_tuning (torch): slow to import, loaded only when used
    from petlprof.side_tuning import SideTunedModel

    reuse = bool(spec.cache_hidden_states) and isinstance(model, SideTunedModel)
    return SliceScorer(task, batches, metric, spec.device, reuse, spec.precision)


class GenerationScorer:
    """Scores a language model on the validation ``batches`` (:class:`petlprof.run.lm_batches.LMBatches`): greedy
    generation for each prompt, as the evaluation phase generates, scored with ``metric`` against the references.
    No meter window and no progress bar: its time is the budget's ``check_time_s``."""

    reuses_states = False

    def __init__(self, task, batches, metric: str, device: str, precision: str, max_new_tokens: int | None):
        self.task, self.batches, self.metric, self.device = task, batches, metric, device
        self.precision = precision
        self.max_new_tokens = max_new_tokens or task.max_new_tokens

    def __call__(self, model) -> float:
        # torch, petlprof.models.language_model, petlprof.run.lm_eval (torch): slow to import, loaded only when used
        import torch

        from petlprof.models.language_model import greedy_generate
        from petlprof.run.lm_eval import generate_texts

        model.eval()
        with torch.no_grad():
            texts = generate_texts(
                model, self.batches, self.device, self.precision, greedy_generate, self.max_new_tokens
            )
        model.train()
        return self.task.score_generations(texts, list(self.batches.references))[self.metric]
