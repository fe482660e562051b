"""One run = (backbone, task, method + hyper-parameters, seed): execute it and return its record.

:func:`execute` runs in the current process and never raises for a failure inside the run: the
record says ``failed`` (or ``oom``) with the error text.  It runs the three named steps of
:mod:`petlprof.pipeline`: ``prepare`` (ranks, memory cap, data, model, meters, cache, budget),
``run_phases`` (train, evaluate, inference, merged evaluation) and ``to_record`` (the record's
fields, :class:`petlprof.records.RunRecord`).

:func:`execute_in_subprocess` runs the same thing in a fresh Python process (the default), so
peak-memory figures start clean and a crash — even a segfault or the kernel's OOM killer — becomes a
``failed`` record instead of taking the sweep down.  The child's progress bars pass through to the
terminal.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from petlprof.envinfo import environment
from petlprof.errors import UsageError
from petlprof.meters.memory import status_bytes
from petlprof.pipeline import prepare, run_phases, to_record
from petlprof.records import (
    CANCELLED,
    FAILED,
    FINAL_STATUSES,
    OOM,
    SCHEMA_VERSION,
    TIMEOUT,
    FailedAt,
    RunRecord,
    add_overhead,
)
from petlprof.registry import get_method
from petlprof.spec import BUDGET_FIELDS, RunSpec, spec_identity  # noqa: F401  (re-exported)
from petlprof.warm import serves
from petlprof.worker_process import alive, command

if TYPE_CHECKING:
    from petlprof.train import Progress
    from petlprof.warm import WarmChild, WarmWorker


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
    more of its fields (:class:`~petlprof.records.RunRecord`'s)."""
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
    :mod:`petlprof.distributed`), else this raises a UsageError; rank 0's record is the run's.
    """
    # petlprof.ranks, petlprof.train (torch): the sweep's driver imports this module; only a run's process needs torch
    from petlprof.ranks import rank_context
    from petlprof.train import Progress

    ranks = rank_context(spec.nproc)
    record, progress = _base_record(spec), Progress()
    progress.at("setup")
    t0 = time.perf_counter()
    try:
        ctx = prepare(spec, ranks, progress, max_memory_bytes)
        # status ok, or diverged; to_record builds the record's fields as a plain dict
        record.update(cast(RunRecord, to_record(ctx, run_phases(ctx))))
    except Exception as exc:  # a failed run is a result, not a crash of the sweep
        record.update(_failure(exc, progress, spec.device))
    if record["status"] in FINAL_STATUSES:  # a failed rank exits without the collective teardown (petlprof.worker)
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


RUN_DIR_PREFIX = "petlprof-run-"  # + the sweep's pid + "-": a run's spec and record pass through it


def remove_stale_run_dirs(root: str | Path | None = None) -> list[Path]:
    """Remove the scratch folders that sweeps killed outright left behind (``kill -9`` runs no
    clean-up): ``petlprof-run-<pid>-*`` in the temporary folder, whose process no longer exists."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid = path.name[len(RUN_DIR_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def execute_in_subprocess(
    spec: RunSpec,
    *,
    timeout_s: float | None = None,
    max_memory_bytes: int | None = None,
    warm: WarmWorker | None = None,
) -> RunRecord:
    """Run ``spec`` in a process of its own and return its record.

    The process is a child forked from ``warm`` (a :class:`petlprof.warm.WarmWorker`) when one is given,
    usable and the run is a one-process CPU run, else a fresh interpreter.  A crash becomes ``failed``
    (``oom`` when the kernel killed it), a run past ``timeout_s`` is killed and recorded ``timeout``.
    If this process is interrupted (KeyboardInterrupt, or the exception a SIGTERM handler raises), the
    child is stopped before the exception propagates; the child also dies with this process if it is
    killed outright.  A run of ``spec.nproc`` > 1 ranks runs under torchrun
    (:func:`petlprof.distributed.launch`); when a rank fails, the record names the rank and its cause.
    """
    t0 = time.perf_counter()
    record = _execute_in_child(spec, timeout_s, max_memory_bytes, warm, t0)
    return add_overhead(record, time.perf_counter() - t0)


def _execute_in_child(
    spec: RunSpec, timeout_s: float | None, max_memory_bytes: int | None, warm: WarmWorker | None, t0: float
) -> RunRecord:
    remove_stale_run_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "record.json"
        spec_path.write_text(json.dumps({"spec": spec.to_dict(), "max_memory_bytes": max_memory_bytes}))
        proc, tail = None, bytearray()
        try:
            proc, process = _start(spec, spec_path, out_path, warm)
            pump = threading.Thread(target=_forward, args=(proc.stderr, tail), daemon=True)
            pump.start()
            returncode = proc.wait(timeout=timeout_s)
            hold_signals()  # the run is finished: a Ctrl-C now must not cost its record
        except subprocess.TimeoutExpired:
            assert proc is not None  # only the process's wait times out
            _stop(proc)
            pump.join(5)
            return failed_record(
                spec,
                f"run exceeded --timeout {timeout_s:g} s and was killed",
                status=TIMEOUT,
                wall_time_s=time.perf_counter() - t0,
            )
        except BaseException:
            if proc is not None:
                _stop(proc)
            raise
        pump.join(5)
        if out_path.exists():
            record = json.loads(out_path.read_text())
            record["process"] = process
            return record
        return _lost_record(spec, out_path, returncode, tail, max_memory_bytes, time.perf_counter() - t0)


def _start(
    spec: RunSpec, spec_path: Path, out_path: Path, warm: WarmWorker | None
) -> tuple[subprocess.Popen[bytes] | WarmChild, str]:
    """The run's process (``Popen`` or :class:`petlprof.warm.WarmChild`) and how it was made."""

    if warm is not None and warm.broken is None and serves(spec):
        try:
            return warm.start(spec_path, out_path, worker_env()), WARM_PROCESS
        except OSError:  # the warm worker is gone: this run and the next take fresh interpreters
            pass
    ranks = ["--nproc", str(spec.nproc)] if spec.nproc > 1 else []
    proc = subprocess.Popen(command(*ranks, str(spec_path), str(out_path)), stderr=subprocess.PIPE, env=worker_env())
    return proc, FRESH_PROCESS


WARM_PROCESS = "forked from the sweep's warm worker (libraries imported once per sweep)"
FRESH_PROCESS = "a fresh Python interpreter"


def worker_env() -> dict[str, str]:
    """The environment of a worker process (fresh or warm): output unbuffered, and the sweep's pid to die with."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PETLPROF_PARENT_PID": str(os.getpid())}


def _lost_record(
    spec: RunSpec, out_path: Path, returncode: int, tail: bytearray, max_memory_bytes: int | None, wall_s: float
) -> RunRecord:
    """The record of a run whose process wrote none: a failed rank's, or the exit code and last lines."""
    text = tail.decode(errors="replace").strip().splitlines()
    if spec.nproc > 1:  # a failed rank left its record, or torchrun its exit code
        # petlprof.distributed (torch): the sweep's driver imports this module; only a run's process needs torch
        from petlprof.distributed import read_failure

        if (fields := read_failure(out_path, spec.nproc)) is not None:
            return failed_record(
                spec,
                fields.pop("error"),
                fields.pop("status"),
                **fields,
                stderr_tail="\n".join(text[-30:]),
                wall_time_s=wall_s,
            )
    killed = returncode in (-9, 137) or (max_memory_bytes is not None and _memory_words(text))
    reason = f"worker ended with code {returncode}" + (" (out of memory?)" if killed else "")
    return failed_record(
        spec,
        f"{reason}: {text[-1] if text else 'no output'}",
        status=OOM if killed else FAILED,
        stderr_tail="\n".join(text[-30:]),
        wall_time_s=wall_s,
    )


_HELD = {signal.SIGINT, signal.SIGTERM}


def hold_signals() -> None:
    """Defer SIGINT/SIGTERM (main thread only) until :func:`release_signals`, e.g. while a finished
    run's record is being stored."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


def release_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


def _memory_words(lines: list[str]) -> bool:
    """The last lines of a dead worker speak of memory or of resources the memory cap denied."""
    text = " ".join(lines[-5:]).lower()
    return any(w in text for w in ("memory", "resource temporarily unavailable", "cannot allocate"))


def _forward(stream, tail: bytearray) -> None:
    """Copy the child's stderr (progress bars) to ours, keeping the last 8 kB for error records."""
    raw = getattr(sys.stderr, "buffer", None)  # notebooks' stderr takes text only
    while chunk := stream.read1(4096):
        if raw is not None:
            raw.write(chunk)
        else:
            sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()
        tail[:] = (tail + chunk)[-8000:]


def _stop(proc: subprocess.Popen[bytes] | WarmChild) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
