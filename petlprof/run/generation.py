"""The ``generation`` phase: greedy decoding of evaluation prompts under the meters, at batch size 1 and
at the evaluation batch size, after evaluation (language-model runs only).

Per batch size, the prompts are the evaluation split's first full batches (a last, partial batch is
never used unless it is the only one), decoded with the backbone's KV cache by ``generate``
(:func:`petlprof.models.language_model.greedy_generate` unless another is given).  ``warmup_steps`` unmeasured
calls come first (at most :data:`WARMUP_NEW_TOKENS` new tokens each: the first call's start-up costs
are in its prefill and first steps).  Then one meter window holds batch after batch, cycling over
those prompts, until it has run :data:`MIN_BATCHES` batches and lasted ``min_window_s`` (as the
inference phase does), but never more than ``max_prompts`` prompts (at least one batch): generation
is slow on a CPU, so the cap keeps the phase short; a window it cut short of ``min_window_s`` says so
in its warnings.

Tokens are counted as the generate function chose them: every row's response tokens plus the EOS
that ended it (a row that stopped early still occupied the batch until every row stopped; that cost
is in the figures per token).  Each chosen token is timestamped through ``on_token`` (CUDA events on
a GPU, ``perf_counter`` after a device synchronisation on a CPU), which gives the time to the first
token of each call and the gaps between tokens.  The window's meters read the energy and the peak
memory, KV cache included.

For a side-tuning model (READ, LST: a ``side`` sub-module beside ``side_forward``), the window's first call
also times the side network with forward hooks (two more marks a decode step, on its timeline): its share of
the whole call and of the decode steps after the first token (the per-token cost).  That took a call of its own
outside the window once, which cost a READ run on ``smollm2`` about 2.9 s of wall time outside its measured
phases for a figure the window's first call gives.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from petlprof.errors import StatusLine
from petlprof.meters import Meter, Window
from petlprof.meters.base import phase_warnings, synchronize
from petlprof.meters.energy import SHORT_WINDOW_S, WarmUp
from petlprof.models.language_model import greedy_generate
from petlprof.results.figures import (
    ENERGY,
    ENERGY_PER_RESPONSE,
    ENERGY_PER_TOKEN,
    GENERATED_TOKENS,
    PER_TOKEN_LATENCY,
    RESPONSES,
    RESPONSES_PER_S,
    SIDE_CALL_TIME,
    SIDE_SHARE_OF_CALL,
    SIDE_SHARE_OF_PER_TOKEN,
    TIME,
    TIME_TO_FIRST_TOKEN,
    TIME_TO_FIRST_TOKEN_PERCENTILES,
    TOKENS_PER_S,
    rate,
)
from petlprof.results.records import Generation, GenerationBatch, SideNetworkShare
from petlprof.run.recipe import autocast
from petlprof.run.train import Progress, percentiles
from petlprof.vocabulary import FP32

MIN_BATCHES = 3
MAX_PROMPTS = 16
WARMUP_NEW_TOKENS = 4
INPUT = "the first full batches of the evaluation prompts, cycled"


def timing_source(device: str) -> str:
    """How the phase timestamps tokens on ``device`` (the windows' ``latency_source``)."""
    return "cuda-events" if device.startswith("cuda") else "perf-counter, device synchronised at each token"


class Timeline:
    """Device-ordered timestamps of one generate call: ``mark(tag)`` records one (a CUDA event on the
    device's current stream, or ``perf_counter`` after synchronising); ``resolve()`` gives every mark's
    seconds since the first, reading the events only then (one synchronisation per call)."""

    def __init__(self, device: str):
        self.device = device
        self.cuda = device.startswith("cuda")
        self._marks: list[tuple[str, Any]] = []

    def mark(self, tag: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self._marks.append((tag, event))
        else:
            synchronize(self.device)
            self._marks.append((tag, time.perf_counter()))

    def resolve(self) -> list[tuple[str, float]]:
        if not self._marks:
            return []
        first = self._marks[0][1]
        if self.cuda:
            synchronize(self.device)
            return [(tag, first.elapsed_time(event) / 1000.0) for tag, event in self._marks]
        return [(tag, stamp - first) for tag, stamp in self._marks]


def _times(marks: list[tuple[str, float]], tag: str) -> list[float]:
    return [t for name, t in marks if name == tag]


def _batches(prompts, device: str, size: int, limit: int) -> list[dict[str, torch.Tensor]]:
    """Up to ``limit`` full batches of ``size`` prompts (the only batch when the split has fewer)."""
    out: list[dict[str, torch.Tensor]] = []
    for inputs, _ in prompts.prompt_batches(device, size):
        rows = int(inputs["input_ids"].shape[0])
        if out and rows != out[0]["input_ids"].shape[0]:
            break
        out.append(inputs)
        if len(out) == limit or rows < size:
            break
    if not out:
        raise ValueError("the generation phase has no evaluation prompts to decode")
    return out


@dataclass(frozen=True)
class Decoding:
    """How every call of the phase decodes: the generate function and its settings."""

    generate: Callable
    model: Any
    max_new_tokens: int
    eos_token_id: int | list[int] | None
    device: str

    def call(
        self, inputs: dict[str, torch.Tensor], on_token=None, max_new_tokens: int | None = None
    ) -> list[list[int]]:
        return self.generate(
            self.model,
            inputs["input_ids"],
            inputs["attention_mask"],
            max_new_tokens or self.max_new_tokens,
            eos_token_id=self.eos_token_id,
            use_cache=True,
            on_token=on_token,
        )

    def timed(
        self, inputs: dict[str, torch.Tensor], side: torch.nn.Module | None = None
    ) -> tuple[list[list[int]], Timeline]:
        """(the rows' new token ids, the call's timeline: start, each token, end, and around each call of ``side``
        where given (:func:`side_marks`); resolved later)."""
        timeline = Timeline(self.device)
        timeline.mark("start")
        with side_marks(side, timeline):
            rows = self.call(inputs, lambda step: timeline.mark("token"))
        timeline.mark("end")
        return rows, timeline


def chosen_tokens(rows: list[list[int]], steps: int) -> int:
    """Tokens the call chose: each row's response, plus its EOS when it stopped before the last step."""
    steps = steps or max((len(r) for r in rows), default=0)  # a generate that never called on_token
    return sum(len(r) + (1 if len(r) < steps else 0) for r in rows)


def _side_network(model) -> torch.nn.Module | None:
    """A side-tuning model's side network (READ's, LST's), or None."""
    side = getattr(model, "side", None)
    return side if isinstance(side, torch.nn.Module) and hasattr(model, "side_forward") else None


@contextlib.contextmanager
def side_marks(side: torch.nn.Module | None, timeline: Timeline):
    """While open, each forward call of ``side`` (None: nothing) marks ``side_in`` and ``side_out`` on
    ``timeline``."""
    if side is None:
        yield
        return
    hooks = [
        side.register_forward_pre_hook(lambda *_: timeline.mark("side_in")),
        side.register_forward_hook(lambda *_: timeline.mark("side_out")),
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def side_network_share(side: torch.nn.Module, marks: list[tuple[str, float]]) -> SideNetworkShare:
    """``side``'s time, calls and its share of the whole call and of the decode steps after the first token, from
    one call's resolved ``marks`` (start, each token, ``side_in``/``side_out`` around each side call, end)."""
    spans = list(zip(_times(marks, "side_in"), _times(marks, "side_out")))
    tokens, call_s = _times(marks, "token"), _times(marks, "end")[0] - _times(marks, "start")[0]
    side_s = sum(end - begin for begin, end in spans)
    decode_s = tokens[-1] - tokens[0] if len(tokens) > 1 else 0.0
    side_decode_s = sum(end - begin for begin, end in spans if tokens and begin >= tokens[0])
    # its time and shares are keyed by their declarations (FIGURE.name): the entry is cast
    return cast(
        SideNetworkShare,
        {
            "module": type(side).__name__,
            "calls": len(spans),
            TIME.name: side_s,
            SIDE_CALL_TIME.name: call_s,
            SIDE_SHARE_OF_CALL.name: side_s / call_s if call_s > 0 else None,
            SIDE_SHARE_OF_PER_TOKEN.name: side_decode_s / decode_s if decode_s > 0 else None,
            "how": "forward hooks on the side network over the window's first call (its first batch)",
        },
    )


def _prompt_tokens(inputs: dict[str, torch.Tensor]) -> int:
    return int(inputs["attention_mask"].sum())


def _figures(calls: list[tuple[list, list]], batches, window: Window, size: int) -> GenerationBatch:
    """The per-batch-size figures from each measured call's rows and timeline."""
    tokens = responses = response_tokens = steps = prompt_tokens = 0
    first_token_s: list[float] = []
    gaps: list[float] = []
    for k, (rows, marks) in enumerate(calls):
        token_times = _times(marks, "token")
        tokens += chosen_tokens(rows, len(token_times))
        responses += len(rows)
        response_tokens += sum(len(r) for r in rows)
        steps += len(token_times)
        prompt_tokens += _prompt_tokens(batches[k % len(batches)])
        if token_times:
            first_token_s.append(token_times[0])
            gaps += [b - a for a, b in zip(token_times, token_times[1:])]
    time_s, energy = window.time_s, window.reading.value(ENERGY)
    # the generation figures are keyed by their declarations (FIGURE.name): the entry is cast
    return cast(
        GenerationBatch,
        {
            "batch_size": size,
            "batches": len(calls),
            RESPONSES.name: responses,
            "prompt_tokens": prompt_tokens,
            GENERATED_TOKENS.name: tokens,
            "response_tokens": response_tokens,
            "decode_steps": steps,
            TIME.name: time_s,
            TOKENS_PER_S.name: rate(tokens, time_s),
            RESPONSES_PER_S.name: rate(responses, time_s),
            ENERGY_PER_TOKEN.name: _per(energy, tokens),
            ENERGY_PER_RESPONSE.name: _per(energy, responses),
            TIME_TO_FIRST_TOKEN.name: statistics.median(first_token_s) if first_token_s else None,
            TIME_TO_FIRST_TOKEN_PERCENTILES.name: percentiles(first_token_s),
            PER_TOKEN_LATENCY.name: percentiles(gaps),
        },
    )


def _per(total: float | None, count: int) -> float | None:
    """``total`` per one of ``count`` (energy per token); None without a total or a count."""
    return total / count if total is not None and count else None


@torch.no_grad()
def measure_generation(
    model,
    prompts,
    *,
    device: str,
    batch_sizes: list[int],
    max_new_tokens: int,
    eos_token_id: int | list[int] | None,
    make_meters: Callable[[int], list[Meter]],
    warmup_steps: int,
    min_window_s: float = SHORT_WINDOW_S,
    max_prompts: int = MAX_PROMPTS,
    generate: Callable | None = None,
    progress: Progress | None = None,
    precision: str = FP32,
    label: str = "run",
) -> Generation:
    """``{"batch_1": {...}, "batch_8": {...}, ...}``: per batch size the tokens generated per second,
    energy per token and per response, time to first token (median over the calls), per-token latency
    percentiles, counts, and the window's meter readings (peak memory with the KV cache, energy and its
    provenance); ``side_network`` for a side-tuning model.

    ``prompts`` has ``prompt_batches(device, batch_size)`` yielding ``(inputs, row_indices)`` with
    ``input_ids``/``attention_mask`` padded as the model decodes them (:class:`petlprof.run.lm_batches.LMBatches`:
    left for a decoder); ``generate`` has
    the signature of :func:`petlprof.models.language_model.greedy_generate`.  A batch size is keyed by the rows it
    really had (``batch_<rows>``: the split may have fewer prompts than asked).  ``make_meters(rows)``
    makes a fresh window's meters; ``min_window_s`` as for inference
    (:func:`petlprof.run.inference.target_window_s`); every call runs at the run's ``precision``; ``label`` names the
    run on the terminal's status line (:class:`~petlprof.errors.StatusLine`; none in a log)."""
    if generate is None:
        generate = greedy_generate
    progress = progress if progress is not None else Progress()
    model.eval()
    decoding = Decoding(generate, model, max_new_tokens, eos_token_id, device)
    phase: Generation = {
        "target_window_s": min_window_s,
        "max_prompts": max_prompts,
        "max_new_tokens": max_new_tokens,
        "decoding": "greedy, KV cache kept",
        "input": INPUT,
    }
    measured: dict[str, GenerationBatch] = {}
    side = _side_network(model)
    for size in dict.fromkeys(batch_sizes):
        limit = max(1, max_prompts // size)
        batches = _batches(prompts, device, size, limit)
        rows = int(batches[0]["input_ids"].shape[0])
        progress.at("generation", rows)
        with autocast(precision, device), StatusLine(f"{label} generation, batch {rows}") as line:
            entry = _one_batch_size(decoding, batches, make_meters(rows), warmup_steps, limit, min_window_s, line, side)
        if (time_s := TIME.of(entry)) is not None and time_s < min_window_s:
            entry["warnings"].append(
                f"the generation window lasted {time_s:.2f} s, under its {min_window_s:g} s target: "
                f"it is capped at {limit * rows} prompt(s) per batch size (max_prompts={max_prompts})"
            )
        measured[f"batch_{rows}"] = entry
    return cast(Generation, {**phase, **measured})  # batch_<rows> keys: the rows each batch size had name them


def _one_batch_size(
    decoding: Decoding,
    batches,
    meters: list[Meter],
    warmup_steps: int,
    limit: int,
    min_window_s: float,
    line,
    side: torch.nn.Module | None = None,
) -> GenerationBatch:
    """One batch size: its warm-up calls (:class:`~petlprof.meters.energy.WarmUp`, a few new tokens each), then its
    measured window (:func:`_measure`, ``side`` timed over its first call); ``line`` says which on the terminal."""
    try:
        with WarmUp(meters, decoding.device, warmup_steps) as warming:
            for step in range(warmup_steps):
                line.update(f"warm-up call {step + 1} of {warmup_steps}")
                decoding.call(
                    batches[step % len(batches)], max_new_tokens=min(decoding.max_new_tokens, WARMUP_NEW_TOKENS)
                )
        line.update(
            f"measuring: up to {limit} calls of {decoding.max_new_tokens} new tokens, at least {min_window_s:g} s"
        )
        entry = _measure(decoding, batches, meters, limit, min_window_s, side)
    finally:
        for meter in meters:
            meter.close()
    # the warm-ups' figures are keyed by their declarations (WARMUP_ENERGY.name): the entry is cast
    return cast(GenerationBatch, {**entry, **warming.figures()})


def _measure(
    decoding: Decoding, batches, meters: list[Meter], limit: int, min_window_s: float, side=None
) -> GenerationBatch:
    """One batch size's window: batch after batch until the stopping rule, then its figures (and ``side``'s share,
    timed over the first call)."""
    calls: list[tuple[list[list[int]], Timeline]] = []
    with Window(meters, decoding.device) as window:
        t0 = time.perf_counter()
        while len(calls) < limit and (len(calls) < MIN_BATCHES or time.perf_counter() - t0 < min_window_s):
            calls.append(decoding.timed(batches[len(calls) % len(batches)], None if calls else side))
    warnings = phase_warnings(window.reading)
    resolved = [(out, timeline.resolve()) for out, timeline in calls]
    figures = _figures(resolved, batches, window, int(batches[0]["input_ids"].shape[0]))
    if not GENERATED_TOKENS.of(figures):
        warnings.append("no token was generated: the figures per token are missing")
    source = timing_source(decoding.device)
    shared = {"side_network": side_network_share(side, resolved[0][1])} if side is not None and resolved else {}
    entry = {**figures, "latency_source": source, **window.reading.record(), "warnings": warnings, **shared}
    # the reading's figures are keyed by their declarations (FIGURE.name): the entry is cast
    return cast(GenerationBatch, entry)
