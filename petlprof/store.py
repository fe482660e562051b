"""The run store: an append-only JSON Lines file, one schema-versioned record per finished run.

* A record is written with one ``write`` of a whole line, flushed and fsync'ed, so a crash loses
  at most the run in flight.  A torn last line left by a crash is ignored by readers, and the next
  append starts on a fresh line so it cannot glue a good record onto it.
* ``finished_keys`` lets a re-run skip what is already recorded as ``ok``.
* :class:`StoreLock` keeps two ``petlprof run`` processes from writing one folder; the lock of a
  process that died is released by the kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError
from petlprof.records import FINAL_STATUSES, RESULTS_FILE, RunRecord  # noqa: F401  (RESULTS_FILE re-exported)

LOCK_FILE = ".petlprof.lock"
MIN_FREE_BYTES = 50 * 2**20


def append_record(path: Path, record: RunRecord | dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=False, default=str) + "\n"
    with open(path, "a+b") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # a torn line from a crash: keep it apart from this record
                line = "\n" + line
        fh.write(line.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def finished_keys(path: Path) -> set[str]:
    """Run keys already recorded with a final status (``ok``; failed, cancelled and timed-out runs are retried)."""
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a killed writer is not a finished run
        if isinstance(record, dict) and record.get("status") in FINAL_STATUSES and record.get("run_key"):
            keys.add(record["run_key"])
    return keys


def check_writable(out_dir: Path) -> None:
    """Fail before the first run when the output folder cannot take results."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".petlprof-write-probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"output folder '{out_dir}' is not writable: {exc.strerror or exc}") from None
    free = shutil.disk_usage(out_dir).free
    if free < MIN_FREE_BYTES:
        raise UsageError(
            f"output folder '{out_dir}' has only {free / 2**20:.1f} MiB free; "
            f"petlprof needs at least {MIN_FREE_BYTES / 2**20:.0f} MiB"
        )


class StoreLock:
    """An exclusive ``flock`` on a lock file in the output folder, held for the whole sweep.

    The kernel drops the lock when its process dies however it dies, so a killed sweep never
    blocks the resume; the PID and host written into the file only serve the messages.
    """

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / LOCK_FILE
        self.taken_over: dict | None = None
        self._fh = None

    def __enter__(self) -> StoreLock:
        import fcntl

        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = _parse(fh.read())
            fh.close()
            who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
            raise UsageError(
                f"another petlprof run ({who}) is writing to '{self.path.parent}'; wait for it to "
                "finish or use another --output"
            ) from None
        fh.seek(0)
        self.taken_over = _parse(fh.read())  # left by a sweep that died without releasing it
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        # the file stays (unlinking a lock file lets a waiting process lock a dead inode); emptied, it
        # says that nobody died holding it
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.close()


def _parse(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and value else None
