"""A GGUF backbone converted once per machine: its config, tokenizer and float32 weights as a model folder.

Reading a GGUF file is slow: transformers parses it once for the config, once for the tokenizer and once for the
weights, maps every tensor's name and dequantises it (35 s of CPU for SmolLM2-135M on a 2-core machine, in every
run's process).  :func:`converted_folder` does that once and keeps the result as an ordinary model folder
(``config.json``, the tokenizer's files, ``model.safetensors`` in float32, as transformers' ``save_pretrained``
writes them), from which a run loads in about a second (safetensors are memory-mapped).  The weights are the same
values: the dequantised float32 tensors, written and read back bit for bit.

The cache lives in ``$PETLPROF_CACHE_DIR`` (default ``$XDG_CACHE_HOME/petlprof``, else ``~/.cache/petlprof``),
one folder per source file and library versions: the file's sha256 and the versions of the libraries that read and
write it (transformers, gguf, torch, safetensors, tokenizers), so a changed file or an upgrade converts again.
Each folder's ``manifest.json``, written last, names its source, the versions and every file's size and sha256;
a folder whose manifest is missing or disagrees with the files (a conversion cut short, a truncated or altered
file) is never read, and is converted again.  A conversion is written to a temporary folder and renamed into place
(atomic), and a process converting holds a lock on the entry, so a second process asking for it meanwhile (two
sweeps, or the suite's workers) waits for that copy instead of converting again (35 s of CPU each for SmolLM2-135M);
past :data:`LOCK_WAIT_S`, or where no lock can be taken, both convert and the second's copy is discarded.  A cache that
cannot be written (a read-only folder, a full disk) costs nothing but the speed: the run reads the GGUF file as
before, and the sweep says once why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, TypedDict

from petlprof.errors import StatusLine, say
from petlprof.models.gguf import GgufWeights, file_sha256, provenance

CACHE_ENV = "PETLPROF_CACHE_DIR"
FORMAT = 1  # of the converted folder (its files, its manifest); a change converts again
MANIFEST = "manifest.json"
LOCK_WAIT_S = 900.0  # the longest another process's conversion is waited for (a 7B file's takes minutes)
WAIT_SAID_AFTER_S = 2.0  # a longer wait for another process's conversion shows a status line on a terminal
LIBRARIES = ("transformers", "gguf", "torch", "safetensors", "tokenizers")  # whose versions key the cache


def cache_root() -> Path:
    """Where petlprof keeps what it computes once per machine."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "petlprof"


def library_versions() -> dict[str, str]:
    """The versions of the libraries that read the source and write and read the converted copy."""
    versions = {"format": str(FORMAT)}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def entry_folder(source_sha256: str, root: Path | None = None) -> Path:
    """The converted folder of a source file (by its sha256) under these library versions."""
    versions = hashlib.sha256(json.dumps(library_versions(), sort_keys=True).encode()).hexdigest()
    return (root or cache_root()) / "converted" / f"{source_sha256[:16]}-{versions[:12]}"


def valid(folder: Path, source_sha256: str, files: bool = True) -> bool:
    """Whether ``folder`` is a complete conversion of the source under these library versions: its manifest names
    them, and (``files``) every file it lists has the size and sha256 it lists (``files=False``: sizes only, for a
    reader of the config alone)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("source_sha256") != source_sha256 or manifest.get("versions") != library_versions():
            return False
        listed = manifest["files"]
        for name, facts in listed.items():
            path = folder / name
            if path.stat().st_size != facts["size"] or (files and file_sha256(path) != facts["sha256"]):
                return False
        return bool(listed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def convert(source_sha256: str, write: Callable[[Path], None], root: Path | None = None) -> Path:
    """The converted folder of the source, written now by ``write(folder)`` (config, tokenizer, weights) unless a
    valid one is there; raises ``OSError`` where it cannot be written (read-only, full disk)."""
    folder = entry_folder(source_sha256, root)
    if valid(folder, source_sha256):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _converting(folder):
        if valid(folder, source_sha256):  # converted by the process this one waited for
            return folder
        _write_entry(folder, source_sha256, write)
    return folder


@contextmanager
def _converting(folder: Path) -> Iterator[None]:
    """Hold the lock of ``folder``'s conversion while the block runs, waiting up to :data:`LOCK_WAIT_S` for another
    process holding it (then going on without it: the rename into place keeps either copy whole).  The lock file
    is removed by its holder when done; a process that waited on the removed file finds the copy valid, or at worst
    converts beside a third one, as without a lock."""
    lock = folder.parent / f".{folder.name}.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        held = _wait_for_lock(fd, folder)
        try:
            yield
        finally:
            if held and _same_file(fd, lock):  # not a newer lock file another process holds
                lock.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def _wait_for_lock(fd: int, folder: Path) -> bool:
    """Take the lock on ``fd``, waiting up to :data:`LOCK_WAIT_S` (False: not taken); a wait past
    :data:`WAIT_SAID_AFTER_S` shows a status line on a terminal (nothing in a log or CI), so a silent minute has its
    reason."""
    start = time.monotonic()
    line: StatusLine | None = None
    with ExitStack() as stack:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > LOCK_WAIT_S:
                    return False
                if waited >= WAIT_SAID_AFTER_S:
                    if line is None:
                        line = stack.enter_context(StatusLine(f"waiting for another process converting {folder}"))
                    line.update(f"at most {LOCK_WAIT_S / 60:g} min, then this one converts its own copy")
                time.sleep(0.1)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), path.stat())
    except OSError:
        return False


def _write_entry(folder: Path, source_sha256: str, write: Callable[[Path], None]) -> None:
    """Write the conversion into a temporary folder, with its manifest last, and move it into place."""
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        files = {path.name: _facts(path) for path in sorted(tmp.iterdir()) if path.is_file()}
        _write_synced(tmp / MANIFEST, {"source_sha256": source_sha256, "versions": library_versions(), "files": files})
        _replace(tmp, folder, source_sha256)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace(tmp: Path, folder: Path, source_sha256: str) -> None:
    """Move the finished conversion into place; a valid copy another process put there first wins."""
    if folder.exists():
        if valid(folder, source_sha256):
            return
        stale = folder.parent / f".{folder.name}.{os.getpid()}.stale"
        os.rename(folder, stale)  # a broken copy: out of the way first, then removed
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process renamed its copy in meanwhile
        if not valid(folder, source_sha256):
            raise


class FileFacts(TypedDict):
    size: int  # bytes
    sha256: str


def _facts(path: Path) -> FileFacts:
    _fsync(path)
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


def _write_synced(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True))
    _fsync(path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def say_once(why: str) -> None:
    """The one line a process prints when the cache cannot be used (the run goes on, reading the source)."""
    if why not in _SAID:
        _SAID.add(why)
        say(why)


_SAID: set[str] = set()


def readable(weights: GgufWeights, write: Callable[[Path], None]) -> tuple[str, dict[str, str]]:
    """(path, ``from_pretrained`` arguments) that config, tokenizer and model of the GGUF file ``weights`` are read
    from: its converted folder, converted now by ``write(folder)`` if there is none yet, or the GGUF file itself
    where the cache cannot be written (said once per process)."""
    sha256 = provenance(weights)["sha256"]
    try:
        return str(convert(sha256, write)), {}
    except OSError as exc:
        say_once(
            f"the converted copy of {weights.file_name} cannot be kept in {cache_root()} ({exc.strerror or exc}): "
            f"every run reads the GGUF file again (set {CACHE_ENV} to a writable folder)"
        )
        return str(weights.folder), weights.from_pretrained_kwargs()
