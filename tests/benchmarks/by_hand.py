"""What the by-hand benchmarks share (``test_predictions.py``, ``test_lm_sweep_overhead.py``,
``test_search_overhead.py``: longer than CI's minutes leave; each runs only when its file is named on the command
line, see ``conftest.py``): the ``petlprof`` command as a user runs it, in a process of its own."""

from __future__ import annotations

import sys

# the console script's entry point: its sweeps fork their warm worker from the command, and it ends without the
# interpreter's teardown, as `petlprof` does (cli.main alone would start a fresh interpreter for the warm worker)
ENTRY = "from petlprof.cli import entry; entry()"


def petlprof_command(*args: str) -> list[str]:
    """``petlprof ARGS`` as a subprocess's command line, with this interpreter."""
    return [sys.executable, "-c", ENTRY, *args]
