"""The run store: an append-only JSON Lines file, one schema-versioned record per finished run.

* A record is written with one ``write`` of a whole line, flushed and fsync'ed, so a crash loses
  at most the run in flight.  A torn last line left by a crash is ignored by readers, and the next
  append starts on a fresh line so it cannot glue a good record onto it.
* ``finished_keys`` lets a re-run skip what is already recorded as ``ok``.
* :class:`StoreLock` keeps two ``petlprof run`` processes from writing one folder; the lock of a
  process that died (same host, PID gone) is taken over.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from petlprof.errors import UsageError

RESULTS_FILE = "results.jsonl"
LOCK_FILE = ".petlprof.lock"
MIN_FREE_BYTES = 50 * 2**20


def append_record(path: Path, record: dict[str, Any]) -> None:
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
    """Run keys already recorded with status ``ok`` (failed, cancelled and timed-out runs are retried)."""
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a killed writer is not a finished run
        if isinstance(record, dict) and record.get("status") == "ok" and record.get("run_key"):
            keys.add(record["run_key"])
    return keys


def check_writable(out_dir: Path) -> None:
    """Fail before the first run when the output folder cannot take results."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".petlprof-write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"output folder '{out_dir}' is not writable: {exc.strerror or exc}") from None
    free = shutil.disk_usage(out_dir).free
    if free < MIN_FREE_BYTES:
        raise UsageError(f"output folder '{out_dir}' has only {free / 2**20:.1f} MiB free; "
                         f"petlprof needs at least {MIN_FREE_BYTES / 2**20:.0f} MiB")


class StoreLock:
    """An exclusive lock file in the output folder, held for the whole sweep."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / LOCK_FILE
        self.taken_over: dict | None = None

    def __enter__(self) -> "StoreLock":
        owner = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder and _alive(holder):
                    raise UsageError(f"another petlprof run (pid {holder['pid']} on {holder['host']}) is writing to "
                                     f"'{self.path.parent}'; wait for it to finish or use another --output") from None
                self.taken_over = holder or {}
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(owner, fh)
            return self
        raise UsageError(f"could not take the lock '{self.path}'")

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)


def _alive(holder: dict) -> bool:
    try:
        pid = int(holder["pid"])
    except (KeyError, ValueError, TypeError):
        return False  # an unreadable lock names nobody
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process cannot be checked from here, so it is respected
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
