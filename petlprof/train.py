"""The one training and evaluation loop every method goes through, under meter windows.

Same optimiser (AdamW, weight decay 0.01 on matrices, none on biases and norms), linear schedule
with 6% warm-up, gradient clipping
at 1.0, dynamic padding and sequence length for every method, so cost differences come from the
methods alone.  The first ``warmup_steps`` steps of each phase run *outside* the meter window
(allocator warm-up, lazy initialisation); their samples still train the model and, in
evaluation, still count towards the metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

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
    def from_split(cls, split, tokenizer, batch_size: int, max_length: int, regression: bool) -> "Batches":
        enc = tokenizer(split.texts, split.pairs, truncation=True, max_length=max_length)
        rows = [{k: enc[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(split))]
        labels = torch.tensor(split.labels, dtype=torch.float32 if regression else torch.long)
        return cls(rows, labels, batch_size, tokenizer)

    def __len__(self) -> int:
        return math.ceil(len(self.encodings) / self.batch_size)

    def iterate(self, device: str, shuffle_seed: int | None = None,
                with_indices: bool = False) -> Iterator[tuple]:
        """(inputs, labels) per batch; with ``with_indices`` also the examples' indices in the split."""
        order = np.arange(len(self.encodings))
        if shuffle_seed is not None:
            np.random.default_rng(shuffle_seed).shuffle(order)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            batch = self.tokenizer.pad([self.encodings[i] for i in idx], return_tensors="pt")
            inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}
            labels = self.labels[torch.as_tensor(idx)].to(device)
            yield (inputs, labels, idx) if with_indices else (inputs, labels)


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
        warnings.append(f"only {warmup} of the {requested_warmup} requested warm-up steps were excluded: the "
                        "phase is too short, so its figures include start-up costs")
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
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def train(model, batches: Batches, *, epochs: int, max_steps: int | None, lr: float, seed: int,
          device: str, meters: list, warmup_steps: int, desc: str, cache=None, stop=None) -> dict[str, Any]:
    """Train for ``epochs`` (or exactly ``max_steps`` optimiser steps, which overrides epochs).

    ``cache``: a :class:`petlprof.cache.HiddenStateCache` for a side-tuning model; its size and
    hit rate join the phase summary.  ``stop``: called with the number of steps done after each step
    past the warm-up (a :class:`petlprof.budget.Budget`); a truthy answer ends training there."""
    from transformers import get_linear_schedule_with_warmup

    groups = _param_groups(model, weight_decay=0.01)
    params = [p for group in groups for p in group["params"]]
    total = epochs * len(batches) if max_steps is None else max_steps
    warmup = min(warmup_steps, max(total - 1, 0))
    optimizer = torch.optim.AdamW(groups, lr=lr)
    schedule = get_linear_schedule_with_warmup(optimizer, int(0.06 * total), total)
    model.train()
    step, samples, losses, epoch, stopped = 0, 0, [], 0, None
    window, timer = Window(meters, device), StepTimer(device)
    with tqdm(total=total, desc=desc, unit="step", leave=True, dynamic_ncols=True) as bar:
        for epoch in range(math.ceil(total / len(batches))):
            for inputs, labels, idx in batches.iterate(device, shuffle_seed=seed * 1000 + epoch, with_indices=True):
                PROGRESS.update(phase="train", step=step)
                if step == warmup:
                    window.__enter__()
                timer.start()
                logits = model(**inputs) if cache is None else cache.logits(model, inputs, idx)
                loss = loss_fn(logits, labels)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                timer.stop(keep=step >= warmup)
                if step >= warmup:
                    samples += len(labels)
                losses.append(float(loss.detach()))
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                stopped = stop(step) if stop is not None and step > warmup else None
                if step >= total or stopped:
                    break
            if stopped:
                break
    window.__exit__(None, None, None)
    del optimizer
    summary = _phase_summary(window, timer, step - warmup, samples, warmup, warmup_steps)
    summary.update(epochs_run=round(step / len(batches), 3), first_loss=losses[0],
                   final_loss=float(np.mean(losses[-10:])))
    if cache is not None:
        summary.update(cache.summary())
    return summary


@torch.no_grad()
def evaluate(model, batches: Batches, *, device: str, meters: list, warmup_steps: int,
             desc: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """Predict the whole split; returns (phase summary, predictions, labels)."""
    model.eval()
    warmup = min(warmup_steps, max(len(batches) - 1, 0))
    preds, golds, samples = [], [], 0
    window, timer = Window(meters, device), StepTimer(device)
    for step, (inputs, labels) in enumerate(tqdm(batches.iterate(device), total=len(batches), desc=desc,
                                                 unit="batch", dynamic_ncols=True)):
        PROGRESS.update(phase="eval", step=step)
        if step == warmup:
            window.__enter__()
        timer.start()
        logits = model(**inputs)
        timer.stop(keep=step >= warmup)
        if step >= warmup:
            samples += len(labels)
        preds.append(logits.squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1))
        golds.append(labels)
    window.__exit__(None, None, None)
    summary = _phase_summary(window, timer, len(batches) - warmup, samples, warmup, warmup_steps)
    return summary, torch.cat(preds).float().cpu().numpy(), torch.cat(golds).float().cpu().numpy()
