"""The one training and evaluation loop every method goes through, under meter windows.

Every method trains by the same :class:`~petlprof.run.recipe.TrainRecipe` (AdamW with weight decay on
matrices only, linear schedule after a linear warm-up, gradient clipping), with dynamic padding and
sequence length, so cost differences come from the methods alone.  The first ``warmup_steps`` steps
of each phase run *outside* the meter window (allocator warm-up, lazy initialisation); their samples
still train the model and, in evaluation, still count towards the metrics.  Where the run is goes to
the :class:`Progress` the caller passes in (:class:`PhaseIO`).

With several data-parallel ranks (``ranks``, :mod:`petlprof.run.distributed`) every batch is still the
global batch: this rank computes its part of it, its loss weighted by its share, and the reported
losses and the evaluation's predictions are those of the whole batch and split.  The one-process
rank context makes all of that the identity.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from tqdm.auto import tqdm

from petlprof.meters import Window
from petlprof.meters.base import phase_warnings
from petlprof.meters.energy import WarmUp, lengthened
from petlprof.meters.latency import StepTimer
from petlprof.results.figures import LATENCY, SAMPLES, SAMPLES_PER_S, TIME, TOKENS, TOKENS_PER_S, rate
from petlprof.results.records import Divergence, EvalPhase, FailedAt, Latency, Phase, TrainPhase
from petlprof.run.ranks import ONE_PROCESS
from petlprof.run.recipe import TrainRecipe, autocast
from petlprof.sweep.resources import training_batches
from petlprof.vocabulary import FP32


def encode_texts(split, tokenizer, max_length: int):
    """A classification split's texts (and their pairs) as a run tokenises them: each cut to ``max_length``."""
    return tokenizer(split.texts, split.pairs, truncation=True, max_length=max_length)


class CutIntoBatches:
    """Rows (``encodings``) cut into batches of ``batch_size``: how many an epoch has, and their rows' order, as every
    kind of batches (and an estimate's rows, counted without their tokens) cuts them; what :func:`step_order` reads."""

    encodings: Sequence[Any]
    batch_size: int

    def __len__(self) -> int:
        return math.ceil(len(self.encodings) / self.batch_size)

    def batch_indices(self, shuffle_seed: int | None = None) -> Iterator[np.ndarray]:
        """The examples' indices in the split, per batch."""
        return batch_indices(len(self.encodings), self.batch_size, shuffle_seed)


@dataclass
class Rows(CutIntoBatches):
    """Rows alone, cut as a run cuts them: an estimate's, which orders a split's batches without tokenising it."""

    encodings: Sequence[Any]
    batch_size: int


@dataclass
class Batches(CutIntoBatches):
    """A tokenised split, cut into dynamically padded batches."""

    encodings: list[dict]
    labels: torch.Tensor
    batch_size: int
    tokenizer: Any

    @classmethod
    def from_split(cls, split, tokenizer, batch_size: int, max_length: int, regression: bool) -> Batches:
        enc = encode_texts(split, tokenizer, max_length)
        rows = [{k: enc[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(split))]
        labels = torch.tensor(split.labels, dtype=torch.float32 if regression else torch.long)
        return cls(rows, labels, batch_size, tokenizer)

    def collate(self, idx: np.ndarray, device: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(inputs, labels) of the examples ``idx``, padded to the longest of them."""
        batch = self.tokenizer.pad([self.encodings[i] for i in idx], return_tensors="pt")
        inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}
        return inputs, self.labels[torch.as_tensor(idx)].to(device)

    def iterate(self, device: str, shuffle_seed: int | None = None) -> Iterator[tuple[dict, torch.Tensor]]:
        """(inputs, labels) per batch."""
        for idx in self.batch_indices(shuffle_seed):
            yield self.collate(idx, device)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch's logits (the language-modelling batches have their own)."""
        return loss_fn(logits, labels)


def batch_indices(count: int, batch_size: int, shuffle_seed: int | None = None) -> Iterator[np.ndarray]:
    """The indices ``0..count-1`` cut into batches, shuffled by ``shuffle_seed`` when given (every
    kind of batches orders its examples this way, so a seed gives the same order for each)."""
    order = np.arange(count)
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(order)
    for start in range(0, count, batch_size):
        yield order[start : start + batch_size]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, or a one-output head's squared error, in float32 (half-precision weights' logits upcast,
    as autocast computes these losses; float32 logits are used as they are)."""
    logits = logits.float()
    if logits.shape[-1] == 1:
        return torch.nn.functional.mse_loss(logits.squeeze(-1), labels)
    return torch.nn.functional.cross_entropy(logits, labels)


def percentiles(latencies: list[float]) -> Latency:
    if not latencies:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(np.mean(latencies))}


def phase_summary(window: Window, timer: StepTimer, steps, samples, warmed: WarmUp, warmup, requested_warmup) -> Phase:
    """A measured phase's fixed figures and its window's reading (:class:`petlprof.results.records.Phase`);
    ``warmed``: its ``warmup`` warm-up steps before the window, with their time and energy."""
    warnings = phase_warnings(window.reading)
    if warmup < requested_warmup:
        warnings.append(
            f"only {warmup} of the {requested_warmup} requested warm-up steps were excluded: the "
            "phase is too short, so its figures include start-up costs"
        )
    # the reading's figures, and the phase's own, are keyed by their declarations (FIGURE.name): the phase is cast
    return cast(
        Phase,
        {
            TIME.name: window.time_s,
            "steps": steps,
            SAMPLES.name: samples,
            "warmup_steps": warmup,
            **warmed.figures(),
            SAMPLES_PER_S.name: rate(samples, window.time_s),
            LATENCY.name: percentiles(timer.latencies_s()),
            "latency_source": timer.source,
            **window.reading.record(),
            "warnings": warnings,
        },
    )


@dataclass(frozen=True)
class Steps:
    """How long training runs and which of its steps are measured: ``epochs`` over the split, or
    exactly ``max_steps`` optimiser steps (which overrides epochs); the first ``warmup_steps`` run
    outside the meter window; ``seed`` shuffles each epoch."""

    epochs: int = 1
    max_steps: int | None = None
    warmup_steps: int = 0
    seed: int = 0

    @classmethod
    def of(cls, spec: Any) -> Steps:
        """A run spec's steps (its epochs, max steps, warm-up steps and seed)."""
        return cls(epochs=spec.epochs, max_steps=spec.max_steps, warmup_steps=spec.warmup_steps, seed=spec.seed)

    def total(self, batches_per_epoch: int, accumulation: int = 1) -> int:
        """Optimiser steps: ``max_steps``, else ``epochs`` passes of ``accumulation`` batches a step (last short);
        counted once, where the sweep counts them too (:func:`petlprof.sweep.resources.training_batches`)."""
        return training_batches(batches_per_epoch, self.epochs, self.max_steps, accumulation)[0]

    def micro_batches(self, batches_per_epoch: int, accumulation: int = 1) -> int:
        """Batches the run trains on: ``accumulation`` per step of ``max_steps``, else ``epochs`` passes."""
        return training_batches(batches_per_epoch, self.epochs, self.max_steps, accumulation)[1]


class Progress:
    """Where a run is (phase, step), kept for the record of a run that fails."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.step: int | None = None

    def at(self, phase: str | None, step: int | None = None) -> None:
        self.phase, self.step = phase, step

    def as_dict(self) -> FailedAt:
        return {"phase": self.phase, "step": self.step}


@dataclass
class PhaseIO:
    """What a phase reports to: its device, the meters of its window, its progress bar's label and the
    run's :class:`Progress`."""

    device: str
    meters: list
    desc: str
    progress: Progress = field(default_factory=Progress)

    def bar(self, total: int, unit: str, ranks, **kwargs):
        return tqdm(total=total, desc=self.desc, unit=unit, dynamic_ncols=True, disable=not ranks.is_main, **kwargs)


def step_order(batches: CutIntoBatches, micro: int, seed: int, accumulation: int = 1) -> Iterator[list[np.ndarray]]:
    """The run's ``micro`` batches, ``accumulation`` to an optimiser step (the last step short when they do not
    divide): epoch after epoch, each shuffled by its own seed (the micro-batches of one step may span two
    epochs)."""
    epochs = range(math.ceil(micro / len(batches)))
    order = (batches.batch_indices(shuffle_seed=seed * 1000 + epoch) for epoch in epochs)
    flat = itertools.islice(itertools.chain.from_iterable(order), micro)
    return iter(lambda: list(itertools.islice(flat, accumulation)), [])


class _Fit:
    """The state of one training phase: one :meth:`step` per optimiser step."""

    def __init__(self, model, batches: Batches, recipe: TrainRecipe, total: int, io: PhaseIO, cache, ranks):
        self.model, self.batches, self.recipe, self.io = model, batches, recipe, io
        self.cache, self.ranks = cache, ranks
        self.optimizer, self.params = recipe.optimizer(model)
        self.schedule = recipe.schedule(self.optimizer, total)
        self.scaler = recipe.scaler(io.device)  # fp16's loss scaler; a pass-through otherwise
        self.timer = StepTimer(io.device)
        self.steps, self.samples, self.tokens, self.overflows, self.micro_batches = 0, 0, 0, 0, 0
        self.losses: list[float] = []
        self.diverged: tuple[int, float, float] | None = None  # (step, loss, gradient norm) of a step that diverged

    def step(self, micro_batches: list[np.ndarray], bar, measured: bool) -> bool:
        """One optimiser step on the global batches ``micro_batches`` (one, or ``--gradient-accumulation`` of
        them, their gradients summed); this rank computes its part of each.  Each rank's loss is scaled by its
        share of the batch times the world size over the number of micro-batches, so the gradient DDP averages
        is the mean of the micro-batches' global mean gradients.  False, with the step not applied, when the
        loss or the gradient norm is not a finite number on some rank (:attr:`diverged` says where); with
        fp16's loss scaling a non-finite gradient is an overflow of the scaled loss (the step is skipped and
        the scale lowered, as ``GradScaler`` does) unless the scale is already 1 or less."""
        self.io.progress.at("train", self.steps)
        parts = [self.ranks.part(batch) for batch in micro_batches]
        collated = [self.batches.collate(idx, self.io.device) for idx, _ in parts]
        self.timer.start()
        losses = []
        for i, ((idx, share), (inputs, labels)) in enumerate(zip(parts, collated)):
            last = i == len(parts) - 1
            # DDP all-reduces the gradients once, at the step's last micro-batch, as accumulating jobs do
            synced = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
            with synced:
                with self.recipe.autocast(self.io.device):
                    logits = self.model(**inputs) if self.cache is None else self.cache.logits(self.model, inputs, idx)
                    loss = self.batches.loss(logits, labels)
                    del logits  # backward needs what the loss saved, not the logits: held, they were a tensor more
                with self.recipe.kernels_checked(self.io.device):
                    weight = share * self.ranks.world_size / len(micro_batches)
                    self.scaler.scale(loss * weight).backward()
            losses.append(loss.detach())
        self.scaler.unscale_(self.optimizer)  # clipping reads the true gradients
        norm, scale = self.recipe.clip(self.params), self.scaler.get_scale()
        values = [float(loss) for loss in losses]  # read after clipping, which waits for the device anyway
        value = float(np.mean(values))  # not finite when any micro-batch's loss is not
        overflow = self.scaler.is_enabled() and scale > 1 and not math.isfinite(norm)
        if self.ranks.any(not math.isfinite(value) or not (overflow or math.isfinite(norm))):
            self.optimizer.zero_grad(set_to_none=True)
            self.timer.stop(keep=False)
            self.diverged = (self.steps + 1, value, norm)
            bar.set_postfix(loss=f"{value:.4f}", diverged=True)
            return False
        self.scaler.step(self.optimizer)  # skipped by the scaler on an overflow
        self.scaler.update()
        if overflow:
            self.overflows += 1
        else:
            self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.timer.stop(keep=measured)
        if measured:
            for (_, share), (inputs, labels) in zip(parts, collated):
                self.samples += len(labels) if share else 0
                self.tokens += int(inputs["attention_mask"].sum()) if share else 0  # the positions trained on
        self.micro_batches += len(micro_batches)
        shares = [share for _, share in parts]
        self.losses.append(float(np.mean([v * w for v, w in zip(values, shares)])))  # this rank's part of the mean loss
        self.steps += 1
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}")
        return True


def _divergence(step: int, loss: float, grad_norm: float, losses: list[float]) -> Divergence:
    """The ``diverged_at`` entry (:class:`petlprof.results.records.Divergence`): non-finite numbers as text (JSON has
    none); the last finite loss is the mean loss of the batch before, summed over ranks."""
    return {
        "step": step,
        "loss": str(loss),
        "grad_norm": str(grad_norm),
        "last_finite_loss": losses[-1] if losses else None,
    }


def train(
    model, batches: Batches, recipe: TrainRecipe, steps: Steps, io: PhaseIO, *, cache=None, stop=None, ranks=ONE_PROCESS
) -> TrainPhase:
    """Train ``model`` by ``recipe`` for ``steps``; returns the phase summary.

    ``cache``: a :class:`petlprof.run.cache.HiddenStateCache` for a side-tuning model; its size and hit
    rate join the summary.  ``stop``: called with the number of steps done after each step past the
    warm-up (a :class:`petlprof.run.budget.Budget`); a truthy answer ends training there.  ``ranks``: this
    process's rank context (:mod:`petlprof.run.ranks`; ``model`` wrapped in DistributedDataParallel
    when there are several).  Training stops at the first step whose loss or gradient norm is not a
    finite number; the summary's ``diverged_at`` says which (:class:`petlprof.results.records.Divergence`)."""
    total = steps.total(len(batches), recipe.accumulation)
    warmup = min(steps.warmup_steps, max(total - 1, 0))
    fit = _Fit(model, batches, recipe, total, io, cache, ranks)
    order = step_order(batches, steps.micro_batches(len(batches), recipe.accumulation), steps.seed, recipe.accumulation)
    model.train()
    window = Window(io.meters, io.device)
    with io.bar(total, "step", ranks, leave=True) as bar:
        with WarmUp(io.meters, io.device, warmup) as warming:
            warmed = all(fit.step(batch, bar, measured=False) for batch in itertools.islice(order, warmup))
        if warmed:  # a run that diverged in its warm-up has no measured window
            with window:
                for batch in order:
                    if not fit.step(batch, bar, measured=True) or (stop is not None and stop(fit.steps)):
                        break
    del fit.optimizer
    losses = ranks.sum_over(fit.losses)
    measured = max(fit.steps - warmup, 0)
    phase = phase_summary(window, fit.timer, measured, fit.samples, warming, warmup, steps.warmup_steps)
    # the tokens and their rate are keyed by their declarations, like the reading's figures
    summary = cast(TrainPhase, {**phase, TOKENS.name: fit.tokens, TOKENS_PER_S.name: rate(fit.tokens, window.time_s)})
    summary["epochs_run"] = round(fit.micro_batches / len(batches), 3)
    summary["first_loss"] = losses[0] if losses else None
    summary["final_loss"] = float(np.mean(losses[-10:])) if losses else None
    if fit.diverged is not None:
        summary["diverged_at"] = _divergence(*fit.diverged, losses)
    if fit.scaler.is_enabled():  # fp16: steps whose scaled gradients overflowed (not applied, scale lowered)
        summary["overflow_skipped_steps"] = fit.overflows
    if cache is not None:
        summary.update(cache.summary())
    return summary


def predict(logits: torch.Tensor) -> torch.Tensor:
    """The prediction of a task head: the class id, or the value of a one-output regression head."""
    return logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)


def _as_array(tensors: list[torch.Tensor]) -> np.ndarray:
    return torch.cat(tensors).float().cpu().numpy() if tensors else np.zeros(0, dtype=np.float32)


class _Predictions:
    """What an evaluation collects: this rank's predictions, labels and their positions in the split."""

    def __init__(self, model, batches: Batches, io: PhaseIO, ranks, precision: str):
        self.model, self.batches, self.io, self.ranks, self.precision = model, batches, io, ranks, precision
        self.timer = StepTimer(io.device)
        self.samples = 0
        self.preds: list[torch.Tensor] = []
        self.golds: list[torch.Tensor] = []
        self.positions: list[np.ndarray] = []  # each batch's example indices in the split

    def batch(self, step: int, batch: np.ndarray, bar, measured: bool) -> None:
        """Predict this rank's part of ``batch``."""
        self.io.progress.at("eval", step)
        idx = self.ranks.predict_part(batch)
        bar.update(1)
        if not len(idx):  # a last batch smaller than the world leaves this rank nothing to predict
            return
        inputs, labels = self.batches.collate(idx, self.io.device)
        self.timer.start()
        with autocast(self.precision, self.io.device):
            logits = self.model(**inputs)
        self.timer.stop(keep=measured)
        if measured:
            self.samples += len(labels)
        self.preds.append(predict(logits))
        self.golds.append(labels)
        self.positions.append(idx)


def _forward(model, batches: Batches, measured: list[np.ndarray], io: PhaseIO, precision: str) -> None:
    """One more pass of an evaluation's measured batches, predictions dropped (its energy re-measured)."""
    for batch in measured:
        inputs, _ = batches.collate(batch, io.device)
        with autocast(precision, io.device):
            model(**inputs)


@torch.no_grad()
def evaluate(
    model, batches: Batches, io: PhaseIO, *, warmup_steps: int, ranks=ONE_PROCESS, precision: str = FP32
) -> tuple[EvalPhase, np.ndarray, np.ndarray]:
    """Predict the whole split at ``precision`` (:func:`petlprof.run.recipe.autocast`); returns (phase summary,
    predictions, labels).  With several ranks this rank predicts its part of every batch (its summary
    counts only those) and the predictions and labels returned are the whole split's, gathered from
    every rank."""
    model.eval()
    warmup = min(warmup_steps, max(len(batches) - 1, 0))
    seen, window = _Predictions(model, batches, io, ranks, precision), Window(io.meters, io.device)
    order = enumerate(batches.batch_indices())
    with io.bar(len(batches), "batch", ranks) as bar:
        with WarmUp(io.meters, io.device, warmup) as warming:
            for step, batch in itertools.islice(order, warmup):
                seen.batch(step, batch, bar, measured=False)
        with window:
            for step, batch in order:
                seen.batch(step, batch, bar, measured=True)
    phase = phase_summary(window, seen.timer, len(batches) - warmup, seen.samples, warming, warmup, warmup_steps)
    if ranks.world_size == 1:  # a window too short for its energy counter: the same passes again, for energy only
        measured = list(batches.batch_indices())[warmup:]
        again = functools.partial(_forward, model, batches, measured, io, precision)
        phase.update(lengthened(phase, io.meters, io.device, again))  # type: ignore[typeddict-item]
    summary: EvalPhase = {**phase}  # a classifier's evaluation: its window's figures, nothing more
    mine = np.concatenate(seen.positions) if seen.positions else np.zeros(0, dtype=int)
    return (summary, *ranks.whole_split(mine, _as_array(seen.preds), _as_array(seen.golds), len(batches.encodings)))
