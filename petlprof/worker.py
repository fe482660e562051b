"""Entry point of the fresh process a run executes in: ``python -m petlprof.worker SPEC OUT``."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import warnings
from pathlib import Path

from petlprof.runner import RunSpec, execute


def main(argv: list[str]) -> int:
    spec_path, out_path = (Path(p) for p in argv)
    _die_with_parent()
    # PEFT calls a transformers API that transformers 5 deprecated; the warning is not the user's to act on
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    job = json.loads(spec_path.read_text())
    try:
        record = execute(RunSpec(**job["spec"]), max_memory_bytes=job.get("max_memory_bytes"))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the sweep records the cancel
        return 130
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(out_path)
    return 0


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the sweep process dies, so a killed sweep leaves no orphan run behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    expected = os.environ.get("PETLPROF_PARENT_PID")
    if expected and os.getppid() != int(expected):  # the sweep died before prctl took effect
        sys.exit(1)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C before the run started: the sweep records the cancel
        sys.exit(130)
