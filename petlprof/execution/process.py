"""How a run's process is started and tied to its parent, for the sweep (:mod:`petlprof.execution.child`), the warm
worker (:mod:`petlprof.execution.warm`) and the worker itself (:mod:`petlprof.execution.worker`).

It stands below all three and imports none of them (the worker module is named as text, the way ``python -m``
names it), so the driver can start a worker without importing the module a worker runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

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
