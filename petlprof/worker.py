"""Entry point of the fresh process a run executes in: ``python -m petlprof.worker SPEC OUT``.

A run of several ranks starts as ``python -m petlprof.worker --nproc N SPEC OUT``: this process becomes
torchrun's launcher (:func:`petlprof.distributed.launch`) and every rank runs ``petlprof.worker SPEC
OUT``; rank 0 writes OUT, and a rank whose run failed writes its own record beside it and exits with
code 1, so torchrun stops the other ranks.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from petlprof.records import FINAL_STATUSES
from petlprof.runner import RunSpec, execute


def main(argv: list[str]) -> int:
    if argv[0] == "--nproc":
        from petlprof.distributed import launch

        _die_with_parent()
        return launch(int(argv[1]), argv[2], argv[3])
    spec_path, out_path = (Path(p) for p in argv)
    _die_with_parent()
    # PEFT calls a transformers API that transformers 5 deprecated; the warning is not the user's to act on
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    job = json.loads(spec_path.read_text())
    try:
        record = execute(RunSpec(**job["spec"]), max_memory_bytes=job.get("max_memory_bytes"))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the sweep records the cancel
        return 130
    if record["spec"]["nproc"] > 1:
        from petlprof.distributed import rank_record_path

        rank = int(os.environ["RANK"])
        if record["status"] not in FINAL_STATUSES:  # the time orders the ranks' failures: the first is the cause
            _write(rank_record_path(out_path, rank), {**record, "failed_unix_s": time.time()})
            sys.stderr.flush()
            os._exit(1)  # at once, without tearing down the process group its peers may still block in
        if rank != 0:
            return 0
    _write(out_path, record)
    return 0


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


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
