"""A run in a process of its own: :func:`execute_in_subprocess` and the child's lifecycle.

The child is a fresh Python interpreter (``python -m petlprof.execution.worker``) or a child forked from the
sweep's warm worker (:mod:`petlprof.execution.warm`); either runs :func:`petlprof.run.execute.execute`, so
peak-memory figures start clean and a crash — even a segfault or the kernel's OOM killer — becomes a
``failed`` record instead of taking the sweep down.  The child's progress bars pass through to the terminal;
a run past its timeout is killed and recorded ``timeout``; a Ctrl-C stops the child before it propagates.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from petlprof.execution.process import command
from petlprof.execution.warm import serves
from petlprof.results.records import FAILED, OOM, TIMEOUT, RunRecord, add_overhead
from petlprof.results.store import alive
from petlprof.run.execute import failed_record
from petlprof.sweep.spec import RunSpec

if TYPE_CHECKING:
    from petlprof.execution.warm import WarmChild, WarmWorker


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

    The process is a child forked from ``warm`` (a :class:`petlprof.execution.warm.WarmWorker`) when one is given,
    usable and the run is a one-process CPU run, else a fresh interpreter.  A crash becomes ``failed``
    (``oom`` when the kernel killed it), a run past ``timeout_s`` is killed and recorded ``timeout``.
    If this process is interrupted (KeyboardInterrupt, or the exception a SIGTERM handler raises), the
    child is stopped before the exception propagates; the child also dies with this process if it is
    killed outright.  A run of ``spec.nproc`` > 1 ranks runs under torchrun
    (:func:`petlprof.execution.launch.launch`); when a rank fails, the record names the rank and its cause.
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
    """The run's process (``Popen`` or :class:`petlprof.execution.warm.WarmChild`) and how it was made."""

    if warm is not None and warm.broken is None and serves(spec):
        try:
            return warm.start(spec_path, out_path, worker_env()), WARM_PROCESS
        except OSError:  # the warm worker is gone: this run and the next take fresh interpreters
            pass
    ranks = ["--nproc", str(spec.nproc)] if spec.nproc > 1 else []
    proc = subprocess.Popen(command(*ranks, str(spec_path), str(out_path)), stderr=subprocess.PIPE, env=worker_env())
    return proc, FRESH_PROCESS


WARM_PROCESS = "forked from a warm worker (libraries imported once, not per run)"
FRESH_PROCESS = "a fresh Python interpreter"


def charge_warm_start(record: RunRecord, waited_s: float) -> None:
    """Charge ``record``'s run the wait for its warm worker's imports (``warm_worker_start_s``, and in its
    ``overhead_s``): the first run a new warm worker serves, in a local sweep or a Ray worker, waited for them."""
    record["warm_worker_start_s"] = waited_s
    add_overhead(record, record["process_wall_time_s"] + waited_s)


def worker_env() -> dict[str, str]:
    """The environment of a worker process (fresh or warm): output unbuffered, and the sweep's pid to die with."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PETLPROF_PARENT_PID": str(os.getpid())}


def _lost_record(
    spec: RunSpec, out_path: Path, returncode: int, tail: bytearray, max_memory_bytes: int | None, wall_s: float
) -> RunRecord:
    """The record of a run whose process wrote none: a failed rank's, or the exit code and last lines."""
    text = tail.decode(errors="replace").strip().splitlines()
    if spec.nproc > 1:  # a failed rank left its record, or torchrun its exit code
        # petlprof.run.distributed (torch): the sweep's driver imports this module; only a run's process needs torch
        from petlprof.execution.launch import read_failure

        if (cause := read_failure(out_path, spec.nproc)) is not None:
            fields = {key: value for key, value in cause.items() if key not in ("status", "error")}
            return failed_record(
                spec,
                cause["error"],
                cause["status"],
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
