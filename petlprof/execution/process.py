"""How a run's process is started and tied to its parent, for the sweep (:mod:`petlprof.execution.child`), the warm
worker (:mod:`petlprof.execution.warm`) and the worker itself (:mod:`petlprof.execution.worker`).

It stands below all three and imports none of them (the worker module is named as text, the way ``python -m``
names it), so the driver can start a worker without importing the module a worker runs.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
from typing import NoReturn

# python -c: SIGINT is ignored (and both stop signals unblocked) before the first import of petlprof, then
# petlprof.execution.worker runs as __main__
LAUNCH = (
    "import signal, runpy; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM)); "
    "runpy.run_module('petlprof.execution.worker', run_name='__main__', alter_sys=True)"
)


def command(*args: str) -> list[str]:
    """The command line of a worker process with ``args`` (``SPEC OUT``, ``--nproc N SPEC OUT``, ``--serve FD``)."""
    return [sys.executable, "-c", LAUNCH, *args]


def expected_parent() -> int | None:
    """The pid of the sweep that started this worker (``PETLPROF_PARENT_PID``), if it said."""
    expected = os.environ.get("PETLPROF_PARENT_PID")
    return int(expected) if expected else None


def die_with_parent(expected_parent: int | None) -> None:
    """Linux: get SIGKILL when the parent (the sweep, or the warm worker) dies, so a killed sweep leaves
    no orphan run behind; exit at once if it died before prctl took effect."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if expected_parent and os.getppid() != expected_parent:
        sys.exit(1)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` as ``sys.exit(code)`` would, less the interpreter's teardown.

    What a normal exit does for the program is done first: its non-daemon threads are joined, its ``atexit``
    handlers run (Ray's shutdown, the kept warm worker's close, logging's flush) and the standard streams are
    flushed; every file petlprof writes is closed by then (the store, the records and the report are written in
    ``with`` blocks and renamed into place).  What is skipped is finalising every module and object, which
    takes 1.3-1.6 s of CPU once torch and transformers are imported (measured from the last ``atexit`` handler
    to the process's end, on a 2-core machine): every fresh run's process, the warm worker and ``petlprof``
    itself paid it after their work was done, and whoever waited for them waited that long.
    """
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)
