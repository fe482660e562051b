"""The one training and evaluation loop every method goes through, under meter windows.

Same optimiser (AdamW, weight decay 0.01 on matrices, none on biases and norms), linear schedule
with 6% warm-up, gradient clipping
at 1.0, dynamic padding and sequence length for every method, so cost differences come from the
methods alone.  The first ``warmup_steps`` steps of each phase run *outside* the meter window
(allocator warm-up, lazy initialisation); their samples still train the model and, in
evaluation, still count towards the metrics.

With ``ranks`` (a run of several data-parallel ranks, :mod:`petlprof.distributed`) every batch is
still the global batch: this rank computes its part of it, its loss weighted by its share, and the
reported losses and the evaluation's predictions are those of the whole batch and split.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from petlprof import distributed
from petlprof.meters import Window
from petlprof.meters.base import phase_warnings
from petlprof.meters.latency import StepTimer

# Where the run is, for the record of a run that fails: {"phase": "train"|"eval", "step": int}
PROGRESS: dict[str, Any] = {"phase": None, "step": None}


@dataclass
class Batches:
    """A tokenised split, cut into dynamically padded batches."""

    encodings: list[dict]
    labels: torch.Tensor
    batch_size: int
    tokenizer: Any

    @classmethod
    def from_split(cls, split, tokenizer, batch_size: int, max_length: int, regression: bool) -> Batches:
        enc = tokenizer(split.texts, split.pairs, truncation=True, max_length=max_length)
        rows = [{k: enc[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(split))]
        labels = torch.tensor(split.labels, dtype=torch.float32 if regression else torch.long)
        return cls(rows, labels, batch_size, tokenizer)

    def __len__(self) -> int:
        return math.ceil(len(self.encodings) / self.batch_size)

    def batch_indices(self, shuffle_seed: int | None = None) -> Iterator[np.ndarray]:
        """The examples' indices in the split, per batch."""
        order = np.arange(len(self.encodings))
        if shuffle_seed is not None:
            np.random.default_rng(shuffle_seed).shuffle(order)
        for start in range(0, len(order), self.batch_size):
            yield order[start : start + self.batch_size]

    def collate(self, idx: np.ndarray, device: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(inputs, labels) of the examples ``idx``, padded to the longest of them."""
        batch = self.tokenizer.pad([self.encodings[i] for i in idx], return_tensors="pt")
        inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}
        return inputs, self.labels[torch.as_tensor(idx)].to(device)

    def iterate(self, device: str, shuffle_seed: int | None = None) -> Iterator[tuple[dict, torch.Tensor]]:
        """(inputs, labels) per batch."""
        for idx in self.batch_indices(shuffle_seed):
            yield self.collate(idx, device)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 1:
        return torch.nn.functional.mse_loss(logits.squeeze(-1), labels)
    return torch.nn.functional.cross_entropy(logits, labels)


def percentiles(latencies: list[float]) -> dict[str, float | None]:
    if not latencies:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(np.mean(latencies))}


def _phase_summary(window: Window, timer: StepTimer, steps, samples, warmup, requested_warmup) -> dict[str, Any]:
    warnings = phase_warnings(window.reading)
    if warmup < requested_warmup:
        warnings.append(
            f"only {warmup} of the {requested_warmup} requested warm-up steps were excluded: the "
            "phase is too short, so its figures include start-up costs"
        )
    return {
        "time_s": window.time_s,
        "steps": steps,
        "samples": samples,
        "warmup_steps": warmup,
        "samples_per_s": samples / window.time_s if window.time_s else None,
        "latency_s": percentiles(timer.latencies_s()),
        "latency_source": timer.source,
        **window.reading,
        "warnings": warnings,
    }


def _param_groups(model, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases and normalisation weights (1-D tensors) are not decayed."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def _my_part(idx: np.ndarray, ranks) -> tuple[np.ndarray, float]:
    """This rank's examples of a global batch and its share of the batch; a rank left without
    examples (a last batch smaller than the world) computes the first one with weight 0, so it still
    takes part in the gradient all-reduce."""
    if ranks is None:
        return idx, 1.0
    mine = distributed.my_part(idx, ranks)
    return (mine, len(mine) / len(idx)) if len(mine) else (idx[:1], 0.0)


def train(
    model,
    batches: Batches,
    *,
    epochs: int,
    max_steps: int | None,
    lr: float,
    seed: int,
    device: str,
    meters: list,
    warmup_steps: int,
    desc: str,
    cache=None,
    stop=None,
    ranks=None,
) -> dict[str, Any]:
    """Train for ``epochs`` (or exactly ``max_steps`` optimiser steps, which overrides epochs).

    ``cache``: a :class:`petlprof.cache.HiddenStateCache` for a side-tuning model; its size and
    hit rate join the phase summary.  ``stop``: called with the number of steps done after each step
    past the warm-up (a :class:`petlprof.budget.Budget`); a truthy answer ends training there.
    ``ranks``: this rank's :class:`~petlprof.distributed.RankContext` (``model`` wrapped in
    DistributedDataParallel); each rank's loss is scaled by its share of the batch times the world
    size, so the gradient DDP averages is the global batch's mean gradient."""
    from transformers import get_linear_schedule_with_warmup

    groups = _param_groups(model, weight_decay=0.01)
    params = [p for group in groups for p in group["params"]]
    total = epochs * len(batches) if max_steps is None else max_steps
    warmup = min(warmup_steps, max(total - 1, 0))
    optimizer = torch.optim.AdamW(groups, lr=lr)
    schedule = get_linear_schedule_with_warmup(optimizer, int(0.06 * total), total)
    model.train()
    step, samples, losses, epoch, stopped = 0, 0, [], 0, None
    world = 1 if ranks is None else ranks.world_size
    window, timer = Window(meters, device), StepTimer(device)
    with tqdm(
        total=total,
        desc=desc,
        unit="step",
        leave=True,
        dynamic_ncols=True,
        disable=ranks is not None and not ranks.is_main,
    ) as bar:
        for epoch in range(math.ceil(total / len(batches))):
            for batch in batches.batch_indices(shuffle_seed=seed * 1000 + epoch):
                PROGRESS.update(phase="train", step=step)
                idx, share = _my_part(batch, ranks)
                inputs, labels = batches.collate(idx, device)
                if step == warmup:
                    window.__enter__()
                timer.start()
                logits = model(**inputs) if cache is None else cache.logits(model, inputs, idx)
                loss = loss_fn(logits, labels)
                (loss * (share * world)).backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                timer.stop(keep=step >= warmup)
                if step >= warmup:
                    samples += len(labels) if share else 0
                value = float(loss.detach())
                losses.append(value * share)  # this rank's part of the batch's mean loss
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}")
                stopped = stop(step) if stop is not None and step > warmup else None
                if step >= total or stopped:
                    break
            if stopped:
                break
    window.__exit__(None, None, None)
    del optimizer
    if ranks is not None:
        losses = distributed.sum_over_ranks(losses)
    summary = _phase_summary(window, timer, step - warmup, samples, warmup, warmup_steps)
    summary.update(
        epochs_run=round(step / len(batches), 3), first_loss=losses[0], final_loss=float(np.mean(losses[-10:]))
    )
    if cache is not None:
        summary.update(cache.summary())
    return summary


def predict(logits: torch.Tensor) -> torch.Tensor:
    """The prediction of a task head: the class id, or the value of a one-output regression head."""
    return logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)


def _as_array(tensors: list[torch.Tensor]) -> np.ndarray:
    return torch.cat(tensors).float().cpu().numpy() if tensors else np.zeros(0, dtype=np.float32)


@torch.no_grad()
def evaluate(
    model, batches: Batches, *, device: str, meters: list, warmup_steps: int, desc: str, ranks=None
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """Predict the whole split; returns (phase summary, predictions, labels).  With ``ranks`` this
    rank predicts its part of every batch (its summary counts only those) and the predictions and
    labels returned are the whole split's, gathered from every rank."""
    model.eval()
    warmup = min(warmup_steps, max(len(batches) - 1, 0))
    preds, golds, positions, samples = [], [], [], 0
    window, timer = Window(meters, device), StepTimer(device)
    for step, batch in enumerate(
        tqdm(
            batches.batch_indices(),
            total=len(batches),
            desc=desc,
            unit="batch",
            dynamic_ncols=True,
            disable=ranks is not None and not ranks.is_main,
        )
    ):
        PROGRESS.update(phase="eval", step=step)
        idx = batch if ranks is None else distributed.my_part(batch, ranks)
        inputs, labels = batches.collate(idx, device) if len(idx) else (None, None)
        if step == warmup:
            window.__enter__()
        if inputs is None:  # a last batch smaller than the world leaves this rank nothing to predict
            continue
        timer.start()
        logits = model(**inputs)
        timer.stop(keep=step >= warmup)
        if step >= warmup:
            samples += len(labels)
        preds.append(predict(logits))
        golds.append(labels)
        positions.append(idx)
    window.__exit__(None, None, None)
    summary = _phase_summary(window, timer, len(batches) - warmup, samples, warmup, warmup_steps)
    if ranks is None:
        return summary, _as_array(preds), _as_array(golds)
    mine = np.concatenate(positions) if positions else np.zeros(0, dtype=int)
    return (summary, *distributed.gather_in_order(mine, _as_array(preds), _as_array(golds), len(batches.encodings)))
