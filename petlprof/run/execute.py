"""One run = (backbone, task, method + hyper-parameters, seed): execute it in this process and return its record.

:func:`execute` never raises for a failure inside the run: the record says ``failed`` (or ``oom``) with the
error text.  It runs the three named steps of :mod:`petlprof.run.pipeline`: ``prepare`` (ranks, memory cap,
data, model, meters, cache, budget), ``run_phases`` (train, evaluate, inference, merged evaluation) and
``to_record`` (the record's fields, :class:`petlprof.results.records.RunRecord`).  :func:`failed_record` is the
record of a run that gave none of its own (its process or node was lost, it was cancelled).

Where that process comes from — a fresh interpreter or a child of the warm worker — is
:mod:`petlprof.execution.child`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import traceback
from typing import TYPE_CHECKING, Any, cast

from petlprof.errors import UsageError
from petlprof.meters.memory import status_bytes
from petlprof.registry import get_method
from petlprof.results.environment import environment
from petlprof.results.records import CANCELLED, FAILED, FINAL_STATUSES, OOM, SCHEMA_VERSION, FailedAt, RunRecord
from petlprof.run.pipeline import prepare, run_phases, to_record
from petlprof.sweep.spec import RunSpec

if TYPE_CHECKING:
    from petlprof.run.train import Progress


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _base_record(spec: RunSpec) -> RunRecord:
    """What every record holds, a failed one too: the run, its method's knob and the fields changed
    from the method's defaults (so a failed configuration reads like its finished seeds)."""

    try:
        method = get_method(spec.method)
        name, knob, defaults = method.name, method.pareto_knob, dataclasses.asdict(method.config_cls())
    except UsageError:  # an unknown method: its run fails, and the record says why
        name, knob, defaults = spec.method, None, {}
    config = {**defaults, **spec.method_config}
    return {
        "schema_version": SCHEMA_VERSION,
        "run_key": spec.run_key,
        "status": FAILED,
        "error": None,
        "method": name,  # the spec's name, also for a plug-in given as module:ATTR (spec.method says so)
        "method_config": config,
        "method_config_changed": sorted(k for k in config if k not in defaults or config[k] != defaults[k]),
        "pareto_knob": knob,
        "backbone": spec.backbone,
        "task": spec.task,
        "seed": spec.seed,
        "spec": spec.to_dict(),
        "started_at": _now(),
    }


def failed_record(spec: RunSpec, error: str, status: str = FAILED, **fields: Any) -> RunRecord:
    """The record of a run that gave no record of its own (its process or node was lost, ...); ``fields``:
    more of its fields (:class:`~petlprof.results.records.RunRecord`'s)."""
    record = _base_record(spec)
    record["status"], record["error"], record["finished_at"] = status, error, _now()
    # keyword arguments cannot be typed as RunRecord's keys: `spec`, `status` and `error` are parameters here
    record.update(cast(RunRecord, fields))
    return record


def cancelled_record(spec: RunSpec, signal_name: str) -> RunRecord:
    """The record of a run stopped by the user; ``petlprof run`` retries it on resume."""
    return failed_record(spec, f"stopped by {signal_name}; not finished", status=CANCELLED)


def execute(spec: RunSpec, max_memory_bytes: int | None = None) -> RunRecord:
    """Run one spec in this process; always returns a record (status ``ok``, ``diverged``, ``failed`` or
    ``oom``).

    ``max_memory_bytes`` caps what the run may allocate beyond the imported runtime (CUDA: a
    per-process memory fraction; CPU: the address-space limit of this process, so use it in a
    worker process only).  A KeyboardInterrupt is not caught: the caller records ``cancelled``.
    A run of ``spec.nproc`` > 1 ranks executes here only as one rank started by torchrun (see
    :mod:`petlprof.run.distributed`), else this raises a UsageError; rank 0's record is the run's.
    """
    # petlprof.run.ranks, petlprof.run.train (torch): the sweep's driver imports this module; only a run's process
    # needs torch
    from petlprof.run.ranks import rank_context
    from petlprof.run.train import Progress

    ranks = rank_context(spec.nproc)
    record, progress = _base_record(spec), Progress()
    progress.at("setup")
    t0 = time.perf_counter()
    try:
        ctx = prepare(spec, ranks, progress, max_memory_bytes)
        record.update(to_record(ctx, run_phases(ctx)))  # status ok, or diverged
    except Exception as exc:  # a failed run is a result, not a crash of the sweep
        record.update(_failure(exc, progress, spec.device))
    if (
        record["status"] in FINAL_STATUSES
    ):  # a failed rank exits without the collective teardown (petlprof.execution.worker)
        ranks.release()
    record["finished_at"] = _now()
    record["wall_time_s"] = time.perf_counter() - t0
    try:
        record["env"] = environment(spec.device)
    except Exception as exc:  # provenance must never cost a finished result
        record["env"] = {"error": f"{type(exc).__name__}: {exc}"}
    return record


def _failure(exc: Exception, progress: Progress, device: str) -> RunRecord:
    """The fields of a run that raised ``exc``: status, error, traceback, where it was and its memory then."""
    fields: RunRecord = {
        "status": OOM if _is_oom(exc) else FAILED,
        "error": f"{type(exc).__name__}: {exc}".strip(),
        "traceback": traceback.format_exc(limit=20),
    }
    try:
        fields["failed_at"] = {**progress.as_dict(), **_memory_now(device)}
    except Exception:  # the figures at failure are a bonus; the record must come back
        fields["failed_at"] = progress.as_dict()
    return fields


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


def _memory_now(device: str) -> FailedAt:
    """Memory figures at the moment of a failure (bytes)."""

    figures: FailedAt = {"rss_bytes": status_bytes("VmRSS"), "peak_rss_bytes": status_bytes("VmHWM")}
    if device.startswith("cuda"):
        # torch: the sweep's driver imports this module; only a run's process needs torch
        import torch

        figures["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated(device))
        figures["cuda_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return figures
