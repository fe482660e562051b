"""The run store: an append-only JSON Lines file, one schema-versioned record per finished run.

* A record is written with one ``write`` of a whole line, flushed and fsync'ed, so a crash loses
  at most the run in flight.  A torn last line left by a crash is a rejected line to readers (below),
  and the next append starts on a fresh line so it cannot glue a good record onto it.
* :func:`read_store` is the one reader of the file, for ``petlprof run`` (:func:`finished_keys`) and the
  reports alike: a line that is not a usable record (torn, not an object, another schema version, a
  field of the wrong type) is *rejected*, named by its line number, and never counts as a finished
  run, so a resumed sweep runs it again; the line itself stays, for its owner to inspect.
* ``finished_keys`` lets a re-run skip what is already recorded as ``ok``.
* :class:`StoreLock` keeps two ``petlprof run`` processes from writing one folder; the lock of a
  process that died is released by the kernel.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from petlprof.errors import UsageError
from petlprof.results.records import FINAL_STATUSES, RESULTS_FILE, SCHEMA_VERSION, RunRecord

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


FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,),
    "method": (str,),
    "error": (str,),
    "run_key": (str,),
    "backbone": (str,),
    "task": (str,),
    "primary_metric": (str,),
    "seed": (int,),
    "trainable_params": (int,),
    "total_params": (int,),
    "metrics": (dict,),
    "method_config": (dict,),
    "train": (dict,),
    "eval": (dict,),
    "training": (dict,),
    "env": (dict,),
    "backbone_info": (dict,),
    "task_info": (dict,),
}


@dataclass(frozen=True)
class Rejected:
    """A line of the store that is not a usable record: where it is, its run key if readable, and why."""

    path: Path
    line: int
    run_key: str | None
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


def record_problem(record: Any) -> str | None:
    """Why a parsed line is not a usable record, or None."""
    if not isinstance(record, dict):
        return f"a result record must be a JSON object, not {type(record).__name__}"
    if record.get("schema_version") != SCHEMA_VERSION:
        return (
            f"unsupported schema_version {record.get('schema_version')!r}; this petlprof reads version {SCHEMA_VERSION}"
        )
    missing = [key for key in ("status", "method") if key not in record]
    if missing:
        return f"record lacks {', '.join(missing)}"
    for key, kinds in FIELD_TYPES.items():
        value = record.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
            return f"field '{key}' is a {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}"
    return None


def _parse_line(path: Path, lineno: int, line: str) -> RunRecord | Rejected:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return Rejected(path, lineno, None, f"malformed result record ({exc.msg}, column {exc.colno})")
    problem = record_problem(record)
    if problem is None:
        return record
    run_key = record.get("run_key") if isinstance(record, dict) else None
    return Rejected(path, lineno, run_key if isinstance(run_key, str) else None, problem)


def read_text(path: Path) -> str:
    """The text of a results file; a folder or an unreadable file in its place is a UsageError naming it."""
    if path.is_dir():
        raise UsageError(f"the results file '{path}' is a folder, not a file; move it away or name another folder")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read the results file '{path}': {exc.strerror or exc}") from None


def read_store(path: Path) -> tuple[list[RunRecord], list[Rejected]]:
    """The usable records of one results file in file order, and its rejected lines (blank ones are neither)."""
    lines = read_text(path).split("\n")  # JSON Lines end at "\n" only (str.splitlines also splits at \x1e, \u2028, ...)
    parsed = [_parse_line(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]
    return [p for p in parsed if not isinstance(p, Rejected)], [p for p in parsed if isinstance(p, Rejected)]


def finished_keys(path: Path) -> set[str]:
    """Run keys already recorded with a final status (``ok``; failed, cancelled and timed-out runs are
    retried, and so is a run whose only record the reader rejects)."""
    if not path.exists() and not path.is_symlink():
        return set()
    records, _ = read_store(path)
    return {r["run_key"] for r in records if r.get("status") in FINAL_STATUSES and r.get("run_key")}


def check_writable(out_dir: Path) -> None:
    """Fail before the first run when the output folder cannot take results, or holds a results file
    that cannot be read (so its finished runs could not be skipped)."""
    results = out_dir / RESULTS_FILE
    if results.exists() or results.is_symlink():
        read_text(results)
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


def lock_held(out_dir: Path) -> bool:
    """Whether a sweep holds ``out_dir``'s :class:`StoreLock` now, as its lock file says: a live process on
    this host, or any on another (it cannot be checked from here).  Only read, never locked, so the probe
    cannot make a sweep starting at the same moment fail to take the lock."""
    try:
        holder = _parse((Path(out_dir) / LOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):  # no lock file (or folder), or not one petlprof wrote: nobody holds it
        return False
    pid = holder.get("pid") if holder else None
    if holder is None or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    return holder.get("host") != socket.gethostname() or alive(pid)


class StoreLock:
    """An exclusive ``flock`` on a lock file in the output folder, held for the whole sweep.

    The kernel drops the lock when its process dies however it dies, so a killed sweep never
    blocks the resume; the PID and host written into the file only serve the messages.
    """

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / LOCK_FILE
        self.taken_over: dict[str, object] | None = None
        self._fh: IO[str] | None = None

    def __enter__(self) -> StoreLock:

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
        fh = self._fh
        assert fh is not None, "the lock is released only after it was taken (__enter__)"
        fh.seek(0)
        fh.truncate()
        fh.close()


def _parse(text: str) -> dict[str, object] | None:
    """A lock file's JSON object (its holder's ``pid`` and ``host``, unchecked), None where it holds none."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and value else None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another user's, or a number no pid can be, counts:
    what it names is left alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
