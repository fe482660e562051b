"""A warm worker: one process per sweep that imports the run's libraries once and forks a child per run.

A fresh Python process spends about 6 s (on a 2-core CPU) importing torch, transformers, peft, datasets
and pandas before a run can start.  The warm worker (``python -m petlprof.execution.worker --serve FD``) imports
them once, then forks one child per run; the child runs exactly what a fresh worker runs
(:func:`petlprof.execution.worker.run_job`), so a crash, a segfault or the kernel's OOM killer still costs one
run only.  Peak-memory figures stay those of a fresh process: the warm worker imports only what
:func:`petlprof.run.pipeline.prepare` imports before it takes the run's memory baseline
(:data:`petlprof.run.libraries.RUNTIME_LIBRARIES`), so every later import still counts in the run as before;
and a forked child maps again the file pages (library code) that the warm worker had resident
(``MADV_POPULATE_READ``), which ``fork`` leaves unmapped, so code that a fresh process had already paged
in while importing is not counted in the child's peak as it pages in again.

Fork safety: the warm worker never touches CUDA and runs nothing after its imports; a run of a pretrained
backbone is forked from a :class:`Holder`, a child of the warm worker that read that backbone with torch at one
thread (:mod:`petlprof.run.kept`: read once per sweep); each forks only while
Python has one thread and no native thread has started since the imports (checked before every fork).
The native threads the imports start are idle pools of libraries that re-arm themselves in a forked
child (``pthread_atfork``): OpenBLAS's (numpy, scipy) and jemalloc's background thread (pyarrow).
The warm worker serves one-process CPU runs; CUDA runs, torchrun runs and the warm worker's own
failure fall back to a fresh interpreter (:func:`petlprof.execution.child.execute_in_subprocess` decides).

The ``petlprof`` command's warm worker is the command itself, forked once it has imported the runtime
(:class:`ForkedWorker`): the command needs most of those libraries for its own checks, so one import serves both,
where a fresh interpreter imported them a second time (about 6.5 s of CPU a sweep).  It forks before any check
computes (the checks a backbone's config answers come first, and no tensor operation, tokenizer or data load), so
the fork carries nothing of theirs; a program that calls :func:`petlprof.api.run_sweep` (a notebook, a test
session) keeps the fresh interpreter, whose runs see none of its objects, patches or threads.

A finished sweep's warm worker is kept for the next sweep of the same process (:func:`keep`, :func:`adopt`):
a notebook or a script that runs several sweeps through :func:`petlprof.api.run_sweep` (or a test session)
pays the imports once, not once per sweep.  It is reused only if it was started with the environment the next
sweep would start it with (the variables read at import: thread counts, the allocator, ``PYTHONPATH``, ...) and
still serves; it is closed when the process exits.  A child takes the driver's working directory and environment
of the moment, as a fresh process started then would.

Protocol over a Unix socket pair, one JSON line per message: the driver sends ``{"spec", "out"}`` paths
and ``env`` (its environment at the run's start, which the child takes) with the write end of the run's
stderr pipe attached (``SCM_RIGHTS``); the warm worker answers
``{"pid"}`` when the child starts and ``{"returncode"}`` (``Popen``'s convention) when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import importlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from petlprof.execution.process import command, die_with_parent

READY_TIMEOUT_S = 300.0  # the imports of a cold disk cache; past it the sweep uses fresh processes
FORK_TIMEOUT_S = 600.0  # a fork request's answer: the warm worker reads the run's backbone first (petlprof.run.kept)
# variables that name the moment, not the process: pytest's name of the test in progress changes with every test and
# is read by nothing the worker imports, so it does not stop a kept worker from serving the next sweep
_MOMENTARY = frozenset({"PYTEST_CURRENT_TEST"})
_MAX_MESSAGE = 65536


def _send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


class _Lines:
    """JSON lines from a socket (with the file descriptors sent alongside them)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""
        self.fds: list[int] = []

    def read(self, timeout_s: float | None = None) -> dict | None:
        """The next message, None at end of stream; raises ``TimeoutError`` past ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.sock.settimeout(left)
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, _MAX_MESSAGE, 4)
            except (TimeoutError, BlockingIOError) as exc:  # a timeout of 0 makes the socket non-blocking
                raise TimeoutError from exc
            if not data:
                return None
            self.buffer += data
            self.fds += fds
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


# --- the driver's side ---------------------------------------------------------------------------------


def serves(spec) -> bool:
    """Whether a run can be forked from a warm worker: one process on the CPU (CUDA after a fork is untried
    here, and torchrun starts ranks of its own)."""
    return spec.nproc == 1 and not spec.device.startswith("cuda")


class WarmChild:
    """One run's forked child, seen from the driver: the part of ``subprocess.Popen`` that
    :func:`petlprof.execution.child.execute_in_subprocess` uses (``stderr``, ``wait``, ``poll``, ``terminate``,
    ``kill``)."""

    def __init__(self, worker: WarmWorker, pid: int, stderr: BinaryIO):
        self.worker, self.pid, self.stderr = worker, pid, stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                message = self.worker.lines.read(timeout)
            except TimeoutError as exc:
                raise subprocess.TimeoutExpired("warm worker child", timeout or 0) from exc
            if message is None:  # the warm worker died: its child died with it (PR_SET_PDEATHSIG)
                self.worker.broken = "the warm worker ended during a run"
                self.returncode = -signal.SIGKILL
            else:
                self.returncode = int(message["returncode"])
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                return self.wait(0)
            except subprocess.TimeoutExpired:
                return None
        return self.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


# what a sweep's driver imports for its own checks (the preflight's memory check builds the model and applies the
# method; the store's records are read into pandas): in a driver that forks its warm worker, these are imported
# first and their time is the driver's; the rest of a run's imports (preload) is what its first run is charged
DRIVER_LIBRARIES = ("torch", "transformers", "peft", "pandas")
Preload = Callable[[], None]  # imports a run's libraries (petlprof.execution.worker.preload)
RunJob = Callable[[Path, Path], int]  # runs a spec file into a record file (petlprof.execution.worker.run_job)
Runtime = tuple[Preload, RunJob, "Keeper"]
_fork_opted_in = False  # set by the ``petlprof`` command (fork_warm_workers_from_this_process)


def fork_warm_workers_from_this_process() -> None:
    """Let this process's warm worker be a fork of this process once it has imported the runtime (the ``petlprof``
    command opts in: one import of the libraries serves the driver and every run, instead of one in the driver and
    one in a fresh interpreter).  Only a process whose state the runs may inherit opts in: a program that calls
    :func:`petlprof.api.run_sweep` (a notebook's kernel, a test session) keeps the fresh interpreter, whose runs
    see none of its objects, patches or threads."""
    global _fork_opted_in
    _fork_opted_in = True


def stop_forking_from_this_process() -> None:
    """Undo :func:`fork_warm_workers_from_this_process`: this process ran torch's kernels (``petlprof plan`` traces
    steps before its pilots), and a fork of a process whose OpenMP pool has run hangs at the child's first parallel
    region; its runs' warm worker starts a fresh interpreter instead."""
    global _fork_opted_in
    _fork_opted_in = False


def forks_from_this_process() -> bool:
    """Whether this process opted in (:func:`fork_warm_workers_from_this_process`)."""
    return _fork_opted_in


def _may_fork_from_this_process() -> bool:
    """Opted in, one Python thread, and no CUDA context (a fork cannot carry one)."""
    if not _fork_opted_in or threading.active_count() != 1:
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


@contextlib.contextmanager
def ctrl_c_after_imports() -> Iterator[None]:
    """Ctrl-C during the block is raised as KeyboardInterrupt when it ends, not where it arrived.

    A library's import may catch every exception around an optional import of its own (a bare ``except:``), which
    would swallow a KeyboardInterrupt raised inside it and let the command go on to its sweep.  Held here, it stops
    the command the moment the imports are done (a few seconds at most).  Outside the main thread the block runs as
    it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


class ForkedWorker:
    """A warm worker forked from this process after it imported the runtime: the part of ``subprocess.Popen`` that
    :class:`WarmWorker` uses (``pid``, ``returncode``, ``poll``, ``wait``, ``kill``).

    The fork carries what a fresh warm worker imports (:func:`petlprof.execution.worker.preload`) and the driver's
    few modules of its own (the command line's parser, the sweep's options): nothing a run allocates before its
    memory baseline.  In the child: Ctrl-C held across the fork and then ignored (as the fresh one ignores it), the
    other stop signals back to their defaults, standard input from ``/dev/null``, the driver's end of the socket
    closed, the worker's environment (:func:`petlprof.execution.child.worker_env`) taken, output unbuffered, and
    death with the driver (``PR_SET_PDEATHSIG``); it never returns into the driver's code (``os._exit``)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(
        cls,
        theirs: socket.socket,
        ours: socket.socket,
        env: dict[str, str],
        preload: Preload,
        run_job: RunJob,
        keeper: Keeper,
    ) -> ForkedWorker | None:
        """Import the runtime here, then fork the worker; None (nothing forked) where a Python thread started
        meanwhile, which a fork would leave holding its locks: the caller starts a fresh interpreter then."""
        with ctrl_c_after_imports():
            preload()  # in the driver, once, for itself and the fork: its own later imports of these libraries are free
        if threading.active_count() != 1:
            return None
        driver, resident = os.getpid(), resident_file_pages()  # a fork leaves file pages unmapped: mapped again below
        sys.stdout.flush()
        sys.stderr.flush()
        # Ctrl-C held from before the fork until the child ignores it: never a KeyboardInterrupt in the new worker
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        pid = os.fork()
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # the driver's Ctrl-C as before (a pending one now)
            return cls(pid)
        code = 1
        try:  # the forked worker: it never leaves this block but through os._exit
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # serve() unblocks it, ignored
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_DFL)
            ours.close()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
            os.environ.clear()
            os.environ.update(env)
            for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED's effect, which a fork does not read
                if isinstance(stream, io.TextIOWrapper):
                    stream.reconfigure(write_through=True)
            die_with_parent(driver)
            populate(resident)  # the library pages the driver had resident, so that serve finds (and passes on) them
            code = serve(theirs.detach(), run_job, lambda: None, keeper)  # imported and frozen before the fork
        except SystemExit as exit_:  # die_with_parent's: the driver was gone before the fork could watch it
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:  # noqa: B036 - the fork must never return into the driver's code
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("forked warm worker", timeout or 0)
            time.sleep(0.01)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class WarmWorker:
    """The sweep's warm worker process; :meth:`start` forks a run from it.

    ``wait=False`` starts its imports and returns at once, so they overlap what the driver does before
    its first run (checking the options and data); :meth:`wait_ready` then waits for what is left.

    ``fork_with`` (the worker's ``preload`` and ``run_job``), given only while the caller has computed nothing (no
    tensor operation, whose thread pool a fork would carry broken; no tokenizer or data loading): in a process that
    opted in (the ``petlprof`` command), the worker is then this process itself, forked once it has imported the
    runtime (:class:`ForkedWorker`); the import's time, less the driver's own libraries (:data:`DRIVER_LIBRARIES`),
    is the wait the first run is charged."""

    def __init__(self, env: dict[str, str], wait: bool = True, fork_with: Runtime | None = None):
        self.env = dict(env)  # what it started with: a later sweep reuses it only with the same (adopt)
        ours, theirs = socket.socketpair()
        self.sock, self.lines = ours, _Lines(ours)
        self.broken: str | None = None
        self.start_s: float | None = None  # how long the driver waited for the imports: its first run's overhead
        self.imported_s = 0.0  # the driver's own imports for a worker forked from it (their time is that wait)
        self.proc: subprocess.Popen | ForkedWorker
        forked = None
        if fork_with is not None and _may_fork_from_this_process():
            for name in DRIVER_LIBRARIES:  # the driver's own, not the runs': not charged to the first run
                importlib.import_module(name)
            t0 = time.perf_counter()
            forked = ForkedWorker.start(theirs, ours, env, *fork_with)
            self.imported_s = time.perf_counter() - t0 if forked is not None else 0.0
        if forked is not None:
            self.proc = forked
        else:
            cmd = command("--serve", str(theirs.fileno()))  # Ctrl-C ignored from its first import on
            self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait, once, until the worker has imported the runtime (``broken`` says why it could not)."""
        if self.start_s is not None:
            return
        t0 = time.perf_counter()
        try:
            ready = self.lines.read(READY_TIMEOUT_S)
        except TimeoutError:
            ready = {"ready": False, "why": f"not ready after {READY_TIMEOUT_S:g} s"}
        if not ready or not ready.get("ready"):
            self.broken = (ready or {}).get("why") or "it ended while importing"
            self.close()
        self.start_s = self.imported_s + time.perf_counter() - t0

    def start(self, spec_path: Path, out_path: Path, env: dict[str, str]) -> WarmChild:
        """Fork a child that runs ``spec_path`` into ``out_path`` with environment ``env`` (as a fresh
        process started now would have it); its stderr comes back as a pipe.  ``OSError`` when it cannot,
        and then it never will: the caller may run the spec elsewhere without running it twice."""
        self.wait_ready()  # else its "ready" would be read as the fork's answer
        if self.broken is not None:
            raise OSError(f"warm worker: {self.broken}")
        read_end, write_end = os.pipe()
        request = {"spec": str(spec_path), "out": str(out_path), "env": env, "cwd": os.getcwd()}
        try:
            _send(self.sock, request, (write_end,))
        finally:
            os.close(write_end)
        stderr = os.fdopen(read_end, "rb")
        try:
            message = self.lines.read(FORK_TIMEOUT_S)
        except TimeoutError:
            self.proc.kill()  # it may still fork this run: killed, it cannot run it beside the caller's
            message = {"why": f"no answer to a fork request within {FORK_TIMEOUT_S:g} s"}
        except BaseException:  # Ctrl-C while a holder reads the backbone: its answers would meet the next request
            self.broken = "interrupted while it forked a run"
            self.proc.kill()
            stderr.close()
            raise
        if not message or "pid" not in message:
            stderr.close()
            self.broken = (message or {}).get("why") or "the warm worker ended before forking"
            raise OSError(f"warm worker: {self.broken}")
        return WarmChild(self, int(message["pid"]), stderr)

    def serving(self) -> bool:
        """Ready, not broken, and alive: it can fork the next run at once."""
        return self.start_s is not None and self.broken is None and self.proc.poll() is None

    def close(self) -> None:
        if self.start_s is None:  # never waited for: still importing, perhaps for seconds, and never used
            self.proc.kill()
        self.sock.close()  # end of stream: the warm worker exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_kept: list[WarmWorker] = []  # at most one: a finished sweep's worker, for the next sweep of this process
_owner = os.getpid()  # the process whose workers they are (a forked copy of the driver must not close them)


def keep(worker: WarmWorker) -> None:
    """After a sweep: keep ``worker`` for the next sweep of this process if it serves, else close it (a worker
    still importing, never waited for, is killed); a worker kept before is closed."""
    close_kept()
    if worker.serving():
        _kept.append(worker)
    else:
        worker.close()


def adopt(env: dict[str, str]) -> WarmWorker | None:
    """The kept worker (:func:`keep`) if it was started with ``env`` (but for :data:`_MOMENTARY` variables) and
    still serves, ready at once: the sweep that adopts it waited for no import, so its first run is charged
    none.  Otherwise None, and a kept worker that does not fit is closed."""
    worker = _kept.pop() if _kept else None
    if worker is None:
        return None
    if worker.serving() and _settings(worker.env) == _settings(env):
        worker.start_s = 0.0
        return worker
    worker.close()
    return None


def _settings(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key not in _MOMENTARY}


@atexit.register
def close_kept() -> None:
    """Close the kept worker now (at exit this happens anyway): its memory back, its process ended."""
    while _kept:
        worker = _kept.pop()
        if os.getpid() == _owner:
            worker.close()


# --- the warm worker's side ----------------------------------------------------------------------------


def _threads() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1  # unknown: treated as unsafe


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, length) of every run of resident pages in this process's readable file mappings
    (``/proc/self/pagemap``'s present bit); empty where the kernel does not say."""
    size, ranges = os.sysconf("SC_PAGE_SIZE"), []
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                fields = line.split()
                if len(fields) < 6 or not fields[5].startswith("/") or not fields[1].startswith("r"):
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                pagemap.seek(start // size * 8)
                count = (end - start) // size
                present = [v >> 63 for v in struct.unpack(f"{count}Q", pagemap.read(count * 8))]
                ranges += _runs(present, start, size)
    except (OSError, struct.error):
        return []
    return ranges


def _runs(present: list[int], start: int, size: int) -> list[tuple[int, int]]:
    runs, first = [], None
    for i, bit in enumerate([*present, 0]):
        if bit and first is None:
            first = i
        elif not bit and first is not None:
            runs.append((start + first * size, (i - first) * size))
            first = None
    return runs


_MADV_POPULATE_READ = 22  # Linux 5.14


def populate(ranges: list[tuple[int, int]]) -> None:
    """Map ``ranges`` into this process's page tables (page cache hits: no I/O); silently a no-op on a
    kernel without ``MADV_POPULATE_READ``."""
    madvise = ctypes.CDLL("libc.so.6", use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for address, length in ranges:
        madvise(address, length, _MADV_POPULATE_READ)


def serve(fd: int, run_job: RunJob, preload: Preload, keeper: Keeper | None = None) -> int:
    """The warm worker's loop: import, say ready, then fork one child per request until end of stream.

    ``run_job(spec_path, out_path) -> exit code`` is what a child runs; ``preload()`` imports the libraries;
    ``keeper`` says which backbone a run's spec needs (:class:`Keeper`): its runs are forked from a :class:`Holder`
    that read it once (:mod:`petlprof.run.kept`), the others from this process.  Ctrl-C is the run's and the sweep's
    to handle: this process ignores it.  The stop signals are unblocked, as in a fresh worker
    (:data:`petlprof.execution.process.LAUNCH`), for the children to inherit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    sock = socket.socket(fileno=fd)
    lines = _Lines(sock)
    preload()  # and out of the garbage collector's scans (gc.freeze): each child's collections skip them

    threads = _threads()
    if threading.active_count() != 1 or threads < 1:
        _send(sock, {"ready": False, "why": f"{threading.active_count()} Python threads after the imports"})
        return 1
    resident = resident_file_pages()
    _send(sock, {"ready": True})
    holder: Holder | None = None
    refused: dict[Hashable, str] = {}  # backbones a holder could not keep, and why (not read again to find out again)
    try:
        while (request := lines.read()) is not None:
            fds, lines.fds = lines.fds, []
            if len(fds) != 1 or _threads() > threads:
                _send(sock, {"why": "no stderr pipe sent" if len(fds) != 1 else "a thread started after the imports"})
                return 1
            key = None if keeper is None else keeper.key(Path(request["spec"]), request["cwd"])
            if keeper is not None and key is not None and key not in refused and getattr(holder, "key", None) != key:
                if holder is not None:
                    holder.close()
                context = _HolderContext(sock, fds[0], resident, threads, request["cwd"])
                holder, why = Holder.start(key, keeper, run_job, context)
                if why is not None:
                    refused[key] = why
            if key is not None and holder is not None and holder.key == key:
                if holder.relay(sock, request, fds[0]):
                    continue
                refused[key] = "its holder process ended"  # (killed from outside): this backbone's runs read their own
                holder.close()
                holder = None
            if keeper is not None:
                keeper.reads_own(refused.get(key) if key is not None else None)
            fork_and_wait(sock, fds[0], run_job, request, resident, others=[] if holder is None else [holder.sock])
    except (ConnectionResetError, BrokenPipeError):  # the driver ended with an answer of ours unread (stopped by a
        pass  # signal mid-run): the end of the stream, which its death's SIGKILL may not have come before
    finally:
        if holder is not None:
            holder.close()
    return 0


def fork_and_wait(
    sock: socket.socket,
    stderr_fd: int,
    run_job: RunJob,
    request: dict,
    resident: list,
    after: Callable | None = None,
    others: list[socket.socket] | None = None,
) -> None:
    """Fork the run of ``request`` (:func:`_child`), answer its pid on ``sock``, wait for it, answer its code;
    ``others``: this process's other sockets, closed in the run (a holder's: the holder must see its end)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for other in others or []:
            other.close()
        _child(sock, stderr_fd, run_job, request, resident)
    os.close(stderr_fd)
    if after is not None:
        after()
    _send(sock, {"pid": pid})
    _, status = os.waitpid(pid, 0)
    _send(sock, {"returncode": os.waitstatus_to_exitcode(status)})


class Keeper(Protocol):
    """What the warm worker asks of the backbone a run needs (``petlprof.execution.worker.KEEPER`` answers from
    :mod:`petlprof.run.kept`)."""

    def key(self, spec_path: Path, cwd: str) -> Hashable | None:
        """The backbone the run of ``spec_path`` needs, a path resolved in ``cwd`` (the driver's working directory),
        None where it reads its own (random weights, CUDA, ...)."""

    def hold(self, key: Hashable) -> str | None:
        """In a holder: read the backbone and keep it; why it cannot be kept, None when it is."""

    def forked(self) -> None:
        """In a holder, after each fork: the next run takes the backbone kept (the first was charged the reading)."""

    def reads_own(self, why: str | None) -> None:
        """Before this process forks a run that reads its own backbone: why it was not kept (None: not one to keep)."""


@dataclasses.dataclass(frozen=True)
class _HolderContext:
    """What a holder is forked with: the warm worker's socket to the driver and the request's stderr pipe (both
    closed in the holder: the driver must see their ends), its resident file pages (which the holder maps before it
    reads, else the library pages the reading pages in would count as the reading's and come off the runs'
    baselines), its thread count (a reading that starts a thread is refused) and the driver's working directory (a
    relative path resolves there)."""

    driver: socket.socket
    stderr_fd: int
    resident: list
    threads: int
    cwd: str


class Holder:
    """A process forked from the warm worker that read one backbone and forks that backbone's runs; the warm worker
    passes it each such request and relays its answers (``pid``, then ``returncode``) to the driver.  It dies with
    the warm worker, and ends when the warm worker closes it (a run of another backbone, or the warm worker's end)."""

    def __init__(self, key: Hashable, pid: int, sock: socket.socket):
        self.key, self.pid, self.sock, self.lines = key, pid, sock, _Lines(sock)

    @classmethod
    def start(
        cls, key: Hashable, keeper: Keeper, run_job: RunJob, context: _HolderContext
    ) -> tuple[Holder | None, str | None]:
        """Fork the holder of ``key``'s backbone and wait for its reading: (the holder, None), or (None, why not)."""
        ours, theirs = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:  # the holder: it never leaves this block but through os._exit
                ours.close()
                context.driver.close()
                os.close(context.stderr_fd)
                die_with_parent(os.getppid())
                os.chdir(context.cwd)
                populate(context.resident)
                code = _hold(theirs, key, keeper, run_job, context.threads)
            except BaseException:  # noqa: B036 - a holder must never return into the warm worker's loop
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        theirs.close()
        holder = cls(key, pid, ours)
        answer = holder.lines.read()
        if answer is not None and answer.get("ready"):
            return holder, None
        holder.close()
        return None, (answer or {}).get("why") or "the process reading it ended"

    def relay(self, driver: socket.socket, request: dict, stderr_fd: int) -> bool:
        """Have the holder fork ``request``'s run; its answers go on to ``driver``.  False (nothing sent to the
        driver) where the holder is gone before it forked; a holder gone during the run ends it as killed."""
        try:
            _send(self.sock, request, (stderr_fd,))
            answer = self.lines.read()
        except OSError:
            answer = None
        if answer is None or "pid" not in answer:
            return False
        os.close(stderr_fd)
        _send(driver, answer)
        done = self.lines.read()
        _send(driver, done if done is not None else {"returncode": -signal.SIGKILL})
        return True

    def close(self) -> None:
        self.sock.close()  # end of stream: the holder exits
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


THREADS_END_S = 5.0  # how long a holder waits for the threads its reading started to end before it gives up


def _threads_ended(threads: int, timeout_s: float = THREADS_END_S) -> bool:
    """Whether this process is back to its one Python thread and at most ``threads`` OS threads, waiting up to
    ``timeout_s`` for them: transformers loads weights on a thread pool that it shuts down without waiting
    (``shutdown(wait=False)``), so its threads may still be ending when the reading returns (under load, seen in
    the suite), and a joined thread leaves the kernel's count a moment after Python's."""
    deadline = time.monotonic() + timeout_s
    while threading.active_count() != 1 or _threads() > threads:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _hold(sock: socket.socket, key: Hashable, keeper: Keeper, run_job: RunJob, threads: int) -> int:
    """The holder's life: read the backbone, say ready (or why not), then fork one run per request."""
    why = keeper.hold(key)
    if why is None and not _threads_ended(threads):
        why = "reading it started a thread, which a fork would carry broken"
    if why is not None:
        _send(sock, {"ready": False, "why": why})
        return 0
    resident = resident_file_pages()  # the libraries' and what the reading touched: a fresh run's reading maps them
    _send(sock, {"ready": True})
    lines = _Lines(sock)
    while (request := lines.read()) is not None:
        fds, lines.fds = lines.fds, []
        if len(fds) != 1 or _threads() > threads:
            _send(sock, {"why": "no stderr pipe sent" if len(fds) != 1 else "a thread started after the reading"})
            return 1
        fork_and_wait(sock, fds[0], run_job, request, resident, after=keeper.forked)
    return 0


def _child(sock: socket.socket, stderr_fd: int, run_job, request: dict, resident: list) -> None:
    """A forked run: stderr to the driver's pipe, Ctrl-C raised as in a fresh process, dies with its parent."""
    code = 1
    try:
        sock.close()
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        die_with_parent(os.getppid())
        os.environ.clear()  # the driver's environment of now, not the one the warm worker started with
        os.environ.update(request["env"])
        os.chdir(request["cwd"])  # and its working directory of now (relative paths in the spec resolve there)
        populate(resident)
        code = run_job(Path(request["spec"]), Path(request["out"]))
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: B036 - a child must never return into the warm worker's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
