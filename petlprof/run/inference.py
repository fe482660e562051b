"""The ``inference`` phase: latency and energy per batch and per sample, at batch size 1 and at the
training batch size, after evaluation.

Unlike training, inference is repeatable, so a short window is lengthened instead of being only
flagged: one fixed batch (the first examples of the evaluation split, dynamically padded) is run
again and again under the meters until the window lasts ``min_window_s``.  With a *measured*
energy meter the default target is :data:`~petlprof.meters.energy.SHORT_WINDOW_S` (5 s), the
length below which counter-based energy is low-confidence; with the estimate (CPU time, no counter
granularity) it is :data:`ESTIMATE_WINDOW_S`, enough for stable percentiles.  Every batch size is
preceded by ``warmup_steps`` unmeasured repeats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import torch

from petlprof.meters import Meter, Window
from petlprof.meters.base import phase_warnings
from petlprof.meters.energy import SHORT_WINDOW_S, WarmUp
from petlprof.meters.latency import StepTimer
from petlprof.results.figures import ENERGY, LATENCY, LATENCY_PER_SAMPLE, SAMPLES_PER_S, TIME
from petlprof.results.records import Inference, InferenceBatch
from petlprof.run.recipe import autocast
from petlprof.run.train import Batches, Progress, percentiles
from petlprof.vocabulary import ESTIMATED, FP32

ESTIMATE_WINDOW_S = 0.5
MIN_REPEATS = 10
MAX_REPEATS = 100_000


def target_window_s(energy_kind: str | None, requested: float | None) -> float:
    """The window the phase repeats to: ``requested`` if given, else by the energy meter's kind."""
    if requested is not None:
        return requested
    return ESTIMATE_WINDOW_S if energy_kind == ESTIMATED else SHORT_WINDOW_S


@torch.no_grad()
def measure_inference(
    model,
    batches: Batches,
    *,
    device: str,
    batch_sizes: list[int],
    make_meters: Callable[[int], list[Meter]],
    min_window_s: float,
    warmup_steps: int,
    progress: Progress | None = None,
    precision: str = FP32,
) -> Inference:
    """``{"batch_1": {...}, "batch_32": {...}}``: per batch size the repeats, window time, latency
    percentiles per batch and per sample, throughput, and the meters' readings (energy per sample).
    ``progress`` is told which batch size is measured (for the record of a run that fails); every
    forward pass runs at the run's ``precision`` (:func:`petlprof.run.recipe.autocast`)."""
    progress = progress if progress is not None else Progress()
    model.eval()
    phase: Inference = {"target_window_s": min_window_s, "input": "the first examples of the evaluation split"}
    measured: dict[str, InferenceBatch] = {}
    for size in dict.fromkeys(min(b, len(batches.encodings)) for b in batch_sizes):
        progress.at("inference", size)
        fixed = Batches(batches.encodings[:size], batches.labels[:size], size, batches.tokenizer)
        inputs, _ = next(fixed.iterate(device))
        timer, repeats, meters = StepTimer(device), 0, make_meters(size)
        try:
            with WarmUp(meters, device, warmup_steps) as warming, autocast(precision, device):
                for _ in range(warmup_steps):
                    model(**inputs)
            with Window(meters, device) as window, autocast(precision, device):
                t0 = time.perf_counter()
                while repeats < MAX_REPEATS and (repeats < MIN_REPEATS or time.perf_counter() - t0 < min_window_s):
                    timer.start()
                    model(**inputs)
                    timer.stop()
                    repeats += 1
        finally:
            for meter in meters:
                meter.close()
        latencies = timer.latencies_s()
        warnings = phase_warnings(window.reading)
        energy = window.reading.value(ENERGY)
        # the window's figures and its reading are keyed by their declarations (FIGURE.name): the entry is cast
        measured[f"batch_{size}"] = cast(
            InferenceBatch,
            {
                "batch_size": size,
                "repeats": repeats,
                **warming.figures(),
                TIME.name: window.time_s,
                LATENCY.name: percentiles(latencies),
                LATENCY_PER_SAMPLE.name: percentiles([t / size for t in latencies]),
                "latency_source": timer.source,
                SAMPLES_PER_S.name: repeats * size / window.time_s if window.time_s else None,
                "energy_per_sample_j": energy / (repeats * size) if energy is not None else None,
                **window.reading.record(),
                "warnings": warnings,
            },
        )
    return cast(Inference, {**phase, **measured})  # batch_<size> keys: the run's batch sizes name them
